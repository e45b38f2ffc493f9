"""Where each part of a dev stack is and how it is reached, from its configuration: the
PostgreSQL servers and the databases they hold, the flowtide servers (one per shard),
nats-server, their URLs, the stack's CA, and requests to the servers as the stack's admin.
Nothing here starts or stops a process (`flowtide.dev.stack` does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowtide.dev.config import StackConfig
from flowtide.dev.natsnodes import NatsNode, nats_nodes
from flowtide.dev.postgres import LocalPostgres
from flowtide.dev.tls import LocalCA

__all__ = ["PgPart", "ServerPart", "StackLayout", "pg_role", "server_role"]

DATABASE = "flowtide"
#: With --shards N > 1: the cluster database, and shard i's database.
CLUSTER_DATABASE = "flowtide_cluster"
SHARD_DATABASE = "flowtide_shard_{}"


@dataclass(frozen=True)
class PgPart:
    """One PostgreSQL server of the stack and the database it holds for flowtide."""

    name: str  # postgres | postgres-<i>
    pg: LocalPostgres
    database: str
    #: The shard whose database this is; None for the cluster database's server (shards
    #: > 1). With one shard, `postgres` holds both.
    shard: int | None

    @property
    def url(self) -> str:
        return self.pg.url(self.database)


@dataclass(frozen=True)
class ServerPart:
    """One `flowtide server` of the stack: `server` with one shard, else `server-<i>`."""

    name: str
    shard: int
    port: int
    url: str


class StackLayout:
    """The parts of the dev stack in `dir` as `config` lays them out."""

    def __init__(self, dir: Path, config: StackConfig) -> None:
        self.dir = dir
        self.config = config

    def _url(self, port: int) -> str:
        scheme = "https" if self.config.tls else "http"
        return f"{scheme}://127.0.0.1:{port}"

    @property
    def server_url(self) -> str:
        """Shard 0's server (the only one with one shard): the URL `up` prints, whose
        token and CA the CLI finds on its own."""
        return self._url(self.config.server_port)

    def servers(self) -> list[ServerPart]:
        """The stack's flowtide servers, one per shard."""
        c = self.config
        if c.shards == 1:
            return [ServerPart("server", 0, c.server_port, self.server_url)]
        return [
            ServerPart(f"server-{i}", i, port, self._url(port))
            for i, port in enumerate(c.shard_server_ports)
        ]

    @property
    def ca(self) -> LocalCA:
        return LocalCA(self.dir / "tls")

    def admin_tls(self) -> Any:
        """What an httpx client verifies with: the stack's CA and the admin's client
        certificate with TLS on, else the default."""
        if not self.config.tls:
            return True
        from flowtide.tls import ClientTls

        cert, key = self.ca.cert("admin")
        return ClientTls(str(self.ca.ca), str(cert), str(key)).context()

    def admin_client(self, *, timeout: float = 60.0) -> Any:
        """An httpx.Client on the server as the stack's admin: its token and, with TLS
        on, its client certificate (for benchmarks and scripts; close it after use)."""
        import httpx

        return httpx.Client(
            base_url=self.server_url,
            headers=self.admin_headers(),
            verify=self.admin_tls(),
            timeout=timeout,
        )

    def http_get(self, path: str, *, base: str | None = None, **headers: str) -> Any:
        """GET on a server (shard 0's unless `base`) as the stack's admin (its client
        certificate with TLS on)."""
        import httpx

        return httpx.get(
            f"{base or self.server_url}{path}",
            headers=headers,
            timeout=2,
            verify=self.admin_tls(),
        )

    def http_ok(self, path: str, *, base: str | None = None) -> bool:
        """Whether GET `path` on a server (shard 0's unless `base`) answers 200."""
        import httpx

        try:
            return bool(self.http_get(path, base=base).status_code == 200)
        except httpx.HTTPError:
            return False

    @property
    def nats_url(self) -> str:
        """Every nats-server node's URL, comma-separated (what --nats and --kv take)."""
        return ",".join(node.url(self.config.tls) for node in self.nats_nodes())

    def nats_nodes(self) -> list[NatsNode]:
        """The nats-server nodes: `nats`, or `nats-0` ... in a cluster."""
        return nats_nodes(self.dir, self.config)

    @property
    def db_url(self) -> str:
        """The event store's URL, with its password (for processes, never for printing);
        with shards, the cluster database's."""
        return self.pg_parts()[0].url

    @property
    def shard_urls(self) -> list[str]:
        """Each shard's database URL, with its password (shard i's at index i)."""
        return [p.url for p in self.pg_parts() if p.shard is not None]

    def _local_postgres(self, folder: str, port: int) -> LocalPostgres:
        tls = None
        if self.config.tls:
            cert, key = self.ca.cert("server")
            tls = (cert, key, self.ca.ca)
        return LocalPostgres(
            self.dir / folder, port=port, password=self.config.pg_password, tls=tls
        )

    @property
    def postgres(self) -> LocalPostgres:
        """The PostgreSQL server in pg/: the only one with one shard, else the cluster
        database's."""
        return self._local_postgres("pg", self.config.pg_port)

    def pg_parts(self) -> list[PgPart]:
        """The stack's PostgreSQL servers: `postgres` first (the cluster database's), then
        one per shard with shards > 1."""
        c = self.config
        if c.shards == 1:
            return [PgPart("postgres", self.postgres, DATABASE, 0)]
        return [PgPart("postgres", self.postgres, CLUSTER_DATABASE, None)] + [
            PgPart(
                f"postgres-{i}",
                self._local_postgres(f"pg-{i}", port),
                SHARD_DATABASE.format(i),
                i,
            )
            for i, port in enumerate(c.shard_pg_ports)
        ]

    def has_data(self) -> bool:
        """Whether any PostgreSQL cluster of this stack was created (whatever its N)."""
        return any(
            (folder / "data" / "PG_VERSION").is_file()
            for folder in [self.dir / "pg", *self.dir.glob("pg-*")]
        )

    @property
    def tokens_path(self) -> Path:
        return self.dir / "tokens.json"

    def tokens(self) -> dict[str, Any]:
        """{"server_url", "admin", "workers": {pool: token}} (empty before the first up)."""
        try:
            doc = json.loads(self.tokens_path.read_text())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def admin_headers(self) -> dict[str, str]:
        token = self.tokens().get("admin")
        return {"authorization": f"Bearer {token}"} if token else {}

    def worker_server(self, name: str) -> ServerPart:
        """The server worker `name` registers with: spread over the shards' servers (any
        of them takes a worker's claims and reports for every shard and forwards them)."""
        servers = self.servers()
        return servers[int(name.split("-")[1]) % len(servers)]


def pg_role(part: PgPart) -> str:
    """What a PostgreSQL server of a sharded stack holds: " (cluster database)" or
    " (shard i)"."""
    return " (cluster database)" if part.shard is None else f" (shard {part.shard})"


def server_role(server: ServerPart, shards: int) -> str:
    """Which shard a server of a sharded stack serves: " (shard i)"; nothing with one."""
    return f" (shard {server.shard})" if shards > 1 else ""
