"""The dev stack's nats-server: one node (`nats`), or with `flowtide dev up
--nats-cluster N` a JetStream cluster of N nodes (`nats-0` ... `nats-<N-1>`) on
loopback, each with its own client port, route port, store and log, every node routed
to every other over TLS (the `route` certificate of the stack's CA) with a route password
of the stack's. The servers and workers get every node's URL; the server creates its
streams and its bucket with min(N, 3) replicas.

What `dev status` says of NATS (`stream_report`): each stream's leader and, per replica,
whether it is current and how far behind, as JetStream answers the stack's server user.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from flowtide.dev.config import StackConfig
from flowtide.dev.nats import SERVER_USER, ClusterNode, nats_server_binary, write_nats_config
from flowtide.dev.processes import DevStackError, need_port

if TYPE_CHECKING:
    from flowtide.dev.stack import DevStack, Progress

__all__ = [
    "CLUSTER_NAME",
    "NatsNode",
    "assign_nats_ports",
    "nats_nodes",
    "stack_replicas",
    "stream_report",
    "up_nats",
]

#: The dev cluster's name (nats-server's `cluster.name`; a stream's placement may name it).
CLUSTER_NAME: Final = "flowtide-dev"
#: Sizes `--nats-cluster` takes: JetStream's Raft needs a majority, so an odd count.
CLUSTER_SIZES: Final = (1, 3, 5)
#: What a node logs once the cluster has a JetStream metadata leader.
_META_LEADER: Final = ("new metadata leader", "Self is new JetStream cluster metadata leader")
#: The streams `stream_report` asks about (the server's; the loop-state bucket's).
REPORTED_STREAMS: Final = ("FLOWTIDE_COMMANDS", "FLOWTIDE_LOGS", "KV_flowtide_state")


@dataclass(frozen=True)
class NatsNode:
    """One nats-server of the stack."""

    name: str  # nats | nats-<i>
    index: int
    port: int
    #: None for a single node (no routes).
    route_port: int | None
    store: Path
    config: Path

    def url(self, tls: bool) -> str:
        return f"{'tls' if tls else 'nats'}://127.0.0.1:{self.port}"


def nats_nodes(dir: Path, config: StackConfig) -> list[NatsNode]:
    """The nats-servers `config` lays out under `dir`."""
    if config.nats_nodes == 1:
        return [NatsNode("nats", 0, config.nats_port, None, dir / "nats", dir / "nats.conf")]
    return [
        NatsNode(
            f"nats-{i}",
            i,
            config.nats_node_ports[i],
            config.nats_route_ports[i],
            dir / f"nats-{i}",
            dir / f"nats-{i}.conf",
        )
        for i in range(config.nats_nodes)
    ]


def stack_replicas(config: StackConfig) -> int:
    """The replicas of the server's streams and bucket: 3 in a cluster (5 nodes keep R3
    streams, as JetStream's docs advise), 1 on one node."""
    return min(config.nats_nodes, 3)


#: A node's route port is its client port plus this (4222 -> 6222, NATS's usual pair).
ROUTE_PORT_OFFSET: Final = 2000


def assign_nats_ports(config: StackConfig) -> None:
    """With more than one node, the client and route ports not chosen yet: the client
    ports after nats_port, and the route ports ROUTE_PORT_OFFSET above them (6222 on for
    the default 4222), or free ones where those are taken (kept in stack.json); and the
    route password. A new nats_port moves the route ports with the client ports, so
    `--nats-port` is the way out of a taken route port too."""
    from flowtide.dev.config import _pick_ports

    c = config
    if c.nats_nodes == 1:
        c.nats_node_ports, c.nats_route_ports = [], []
        return
    taken = {c.server_port, c.pg_port, *c.shard_pg_ports, *c.shard_server_ports}
    if len(c.nats_node_ports) != c.nats_nodes or c.nats_node_ports[0] != c.nats_port:
        c.nats_node_ports = [c.nats_port, *_pick_ports(c.nats_port + 1, c.nats_nodes - 1, taken)]
        c.nats_route_ports = []
    taken |= set(c.nats_node_ports)
    if len(c.nats_route_ports) != c.nats_nodes:
        c.nats_route_ports = _pick_ports(c.nats_port + ROUTE_PORT_OFFSET, c.nats_nodes, taken)
    if not c.nats_route_password:
        c.nats_route_password = secrets.token_urlsafe(24)


def up_nats(stack: DevStack, progress: Progress, timeout: float) -> None:
    """Start the nodes that do not run and wait until each says it is ready (and, for a
    cluster, until the nodes elected a JetStream metadata leader)."""
    c = stack.config
    nodes = nats_nodes(stack.dir, c)
    todo = [n for n in nodes if not stack.procs.alive(n.name)]
    for node in nodes:
        if node not in todo:
            progress(f"{node.name}: already running (pid {c.pids[node.name]})")
    if not todo:
        return
    try:
        binary = nats_server_binary()
    except FileNotFoundError as exc:
        raise DevStackError(f"nats: {exc}") from None
    for node in todo:
        need_port(node.port, node.name, "--nats-port")
        if node.route_port is not None:
            need_port(node.route_port, f"{node.name}'s routes", "--nats-port")
    users = list(stack.nats_users().values())
    tls = stack.ca.cert("server") if c.tls else None
    for node in todo:
        cluster = None
        if node.route_port is not None:
            cluster = ClusterNode(
                cluster=CLUSTER_NAME,
                server_name=node.name,
                route_port=node.route_port,
                route_ports=tuple(c.nats_route_ports),
                route_password=c.nats_route_password,
            )
        write_nats_config(
            node.config,
            users,
            tls=tls,
            cluster=cluster,
            route_tls=stack.ca.cert("route") if c.tls else None,
            ca=stack.ca.ca if c.tls else None,
        )
        log = stack.procs.log(node.name)
        log.write_text("")
        argv = [
            binary,
            "--config",
            str(node.config),
            "--jetstream",
            "--addr",
            "127.0.0.1",
            "--port",
            str(node.port),
            "--store_dir",
            str(node.store),
            "--server_name",
            "flowtide-dev" if node.route_port is None else node.name,
            "--log",
            str(log),
        ]
        stack.procs.spawn(node.name, argv)
    for node in todo:
        log = stack.procs.log(node.name)

        def ready(log: Path = log) -> bool:
            return "Server is ready" in _text(log)

        stack.procs.wait(node.name, ready, timeout)
        progress(f"{node.name}: started on {node.url(c.tls)}")
    if len(nodes) > 1:
        _wait_for_meta_leader(stack, nodes, timeout)
        progress(f"nats: cluster {CLUSTER_NAME} of {len(nodes)} nodes has a leader")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _wait_for_meta_leader(stack: DevStack, nodes: list[NatsNode], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            if any(mark in _text(stack.procs.log(node.name)) for mark in _META_LEADER):
                return
        time.sleep(0.05)
    raise DevStackError(
        f"the NATS cluster elected no leader within {timeout:g} s; see"
        f" {', '.join(str(stack.procs.log(n.name)) for n in nodes)}"
    )


def stream_report(stack: DevStack, timeout: float = 3.0) -> list[dict[str, Any]]:
    """Each of the server's streams that exists: its leader, and per replica (the
    leader's included) whether it is current, how many operations it lags and how long
    ago the leader heard from it. Empty when NATS does not answer."""
    return asyncio.run(_streams(stack, timeout))


async def _streams(stack: DevStack, timeout: float) -> list[dict[str, Any]]:
    from nats.js.errors import NotFoundError

    from flowtide.natsauth import connect_nats

    user = stack.nats_users()[SERVER_USER].auth()
    if stack.config.tls:
        from flowtide.natsauth import NatsAuth

        user = NatsAuth(user=user.user, password=user.password, ca=str(stack.ca.ca))
    try:
        nc = await asyncio.wait_for(
            connect_nats(stack.nats_url, user, name="flowtide-dev-status", wait=False), timeout
        )
    except Exception:  # noqa: BLE001 - NATS down: status says so per node
        return []
    out: list[dict[str, Any]] = []
    try:
        js = nc.jetstream(timeout=timeout)
        for name in REPORTED_STREAMS:
            try:
                info = await js.stream_info(name)
            except NotFoundError:
                continue
            except Exception as exc:  # noqa: BLE001 - e.g. no leader right now
                out.append({"stream": name, "error": str(exc) or type(exc).__name__})
                continue
            out.append(_stream_doc(name, info))
    finally:
        await nc.close()
    return out


def _stream_doc(name: str, info: Any) -> dict[str, Any]:
    cluster = info.cluster
    replicas: list[dict[str, Any]] = []
    leader = None
    if cluster is not None:
        leader = cluster.leader
        if leader:
            replicas.append({"name": leader, "leader": True, "current": True, "lag": 0})
        for peer in cluster.replicas or []:
            replicas.append(
                {
                    "name": peer.name,
                    "leader": False,
                    "current": bool(peer.current),
                    "offline": bool(getattr(peer, "offline", False)),
                    "lag": int(peer.lag or 0),
                    "active_seconds": round((peer.active or 0) / 1e9, 3),  # nanoseconds
                }
            )
    return {
        "stream": name,
        "replicas": info.config.num_replicas,
        "leader": leader,
        "messages": info.state.messages,
        "bytes": info.state.bytes,
        "peers": replicas,
    }
