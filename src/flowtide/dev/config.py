"""What `flowtide dev up` chose (ports, sizes, the shard count, passwords, the pids it
started), kept in the stack's stack.json (mode 0600) so that the next `up` reuses it; the
ports of a sharded stack's servers, chosen once.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowtide.dev.processes import DevStackError, port_free

__all__ = ["StackConfig", "assign_shard_ports", "load_config", "save_config", "write_private"]


@dataclass
class StackConfig:
    """What `up` chose, kept in stack.json so that the next `up` reuses it."""

    server_port: int = 8082
    nats_port: int = 4222
    pg_port: int = 55432
    pg_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    workers: int = 2
    pool: str = "default"
    concurrency: int = 8
    lease: float = 30.0
    #: Where the workers run: relative paths in playbooks (a python step's script file)
    #: resolve against it, as an embedded run resolves them against its current
    #: directory. The current directory of the first `up` unless given.
    workdir: str | None = None
    #: NATS user name -> password (flowtide.dev.nats.flowtide_users).
    nats_passwords: dict[str, str] = field(default_factory=dict)
    #: Every part over TLS with certificates of the stack's own CA (flowtide.dev.tls): the API
    #: (mutual: clients show a certificate too), nats-server and PostgreSQL.
    tls: bool = True
    #: Shards of the cluster (flowtide.topology); fixed once the stack has data.
    shards: int = 1
    #: With shards > 1: the port of each shard's PostgreSQL server (pg_port is the
    #: cluster database's) and of each shard's flowtide server (the first is
    #: server_port), chosen on the first `up`: the ports after pg_port / server_port,
    #: or free ones where those are taken.
    shard_pg_ports: list[int] = field(default_factory=list)
    shard_server_ports: list[int] = field(default_factory=list)
    #: nats-server nodes: 1, or a JetStream cluster of 3 or 5 (`--nats-cluster`); with
    #: more than one, each node's client port (the first is nats_port) and route port,
    #: and the password the nodes' routes log in with (flowtide.dev.natsnodes).
    nats_nodes: int = 1
    nats_node_ports: list[int] = field(default_factory=list)
    nats_route_ports: list[int] = field(default_factory=list)
    nats_route_password: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    #: The stack's processes run with the stack's folder as their home (FLOWTIDE_HOME):
    #: everything they write (the workers' data, result files, the master key sealing
    #: the stack's credentials) is under it, so `down --purge` removes it all. False: a
    #: stack made by an older flowtide, whose processes used the home itself; `up`
    #: converts it (flowtide.dev.stack.DevStack.own_home).
    own_home: bool = False


def load_config(path: Path) -> StackConfig:
    """The configuration kept in `path`; the defaults when there is none yet.

    Raises:
        DevStackError: the file cannot be read or is not JSON.
    """
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return StackConfig()
    except (OSError, ValueError) as exc:
        raise DevStackError(f"{path}: unreadable ({exc}); remove it") from None
    known = set(StackConfig.__dataclass_fields__)
    return StackConfig(**{k: v for k, v in doc.items() if k in known})


def save_config(path: Path, config: StackConfig) -> None:
    """Keep `config` in `path` (its folder created), readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, asdict(config))


def assign_shard_ports(config: StackConfig) -> None:
    """With shards > 1, the ports of the shards' PostgreSQL servers and flowtide
    servers that are not chosen yet: the ones after pg_port / server_port, or free
    ones where those are taken (the choice is kept in stack.json)."""
    c = config
    if c.shards == 1:
        c.shard_pg_ports, c.shard_server_ports = [], []
        return
    if c.shard_server_ports[:1] != [c.server_port]:
        c.shard_server_ports = []
    taken = {c.server_port, c.nats_port, c.pg_port, *c.shard_pg_ports, *c.shard_server_ports}
    if len(c.shard_pg_ports) != c.shards:
        c.shard_pg_ports = _pick_ports(c.pg_port + 1, c.shards, taken)
        taken |= set(c.shard_pg_ports)
    if len(c.shard_server_ports) != c.shards:
        c.shard_server_ports = [
            c.server_port,
            *_pick_ports(c.server_port + 1, c.shards - 1, taken),
        ]


def _pick_ports(first: int, count: int, taken: set[int]) -> list[int]:
    """`count` ports for new listeners: first, first+1, ... where free, else whatever free
    port the system hands out; none of them in `taken`."""
    from flowtide.dev.postgres import free_port

    out: list[int] = []
    candidate = first
    while len(out) < count:
        port = candidate
        candidate += 1
        if port > 65535 or port in taken or port in out or not port_free(port):
            port = free_port()
            while port in taken or port in out:
                port = free_port()
        out.append(port)
    return out


def write_private(path: Path, doc: dict[str, Any]) -> None:
    """`doc` as JSON in `path`, readable by this user only, replaced in one step."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(doc, handle, indent=2)
    os.replace(tmp, path)
