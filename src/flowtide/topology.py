"""Where the databases are: the cluster database and the shard databases (seed 001).

The per-execution tables (execution, event, command, outbox, variables) of an execution
live in the database of shard `shard_for(execution_id, N)`; the catalog, credentials,
keychain, tokens, workers, machine-id leases and the shard map live in the cluster
database. Three ways to say it, first match wins:

1. **Bootstrap** (phase F): `FLOWTIDE_SHARDS="dsn0;dsn1;..."` (`--shards`) and
   `FLOWTIDE_CLUSTER_DB` (`--cluster-db`). Shard i is the i-th DSN.
2. **Shard map** (phase G): active rows of the cluster database's `shard_endpoint` table
   (`flowtide shards add|list|set`): host, port, database and a credential alias whose
   body (`user`, `password`) is resolved through flowtide's encrypted credential store,
   so no shard password lives in an environment variable or a command line.
3. **One database**: `--db` (and `--cluster-db` if the cluster tables live apart): one
   shard, today's layout.

The indexes of a map are 0..N-1 without a gap; N is fixed once executions exist (no
re-sharding, as the seed scopes it), so changing it is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from flowtide.errors import FlowtideError
from flowtide.sharding import shard_for
from flowtide.store.pg.shards import Endpoint

__all__ = [
    "Shard",
    "Topology",
    "TopologyError",
    "from_settings",
    "parse_shard_list",
]


class TopologyError(FlowtideError):
    """The shard configuration is incomplete or contradicts itself."""


@dataclass(frozen=True)
class Shard:
    """One shard: its index and the DSN of its database (holding a password: show
    `display`, never `dsn`)."""

    index: int
    dsn: str

    @property
    def display(self) -> str:
        from flowtide.store.postgres import display_dsn

        return display_dsn(self.dsn)


@dataclass(frozen=True)
class Topology:
    cluster: str
    shards: tuple[Shard, ...]
    source: Literal["env", "table", "single"]

    @property
    def count(self) -> int:
        return len(self.shards)

    def owner(self, execution_id: int) -> Shard:
        """The shard whose database holds `execution_id`."""
        return self.shards[shard_for(execution_id, self.count)]

    def shard(self, index: int) -> Shard:
        """Shard `index`.

        Raises:
            TopologyError: there is no such shard.
        """
        if not 0 <= index < self.count:
            raise TopologyError(
                f"shard index {index} does not exist: the cluster has {self.count}"
                f" shard{'s' if self.count != 1 else ''} (0..{self.count - 1})"
            )
        return self.shards[index]

    def served_shard(self, index: int) -> Shard:
        """Shard `index`, as the one a server serves.

        Raises:
            TopologyError: no such shard.
        """
        return self.shard(index)

    def describe(self) -> list[dict[str, Any]]:
        """The map without secrets."""
        return [{"shard": s.index, "database": s.display} for s in self.shards]


def parse_shard_list(raw: str) -> list[str]:
    """The DSNs of `FLOWTIDE_SHARDS` / `--shards` (`;`-separated; blanks ignored).

    Raises:
        TopologyError: a DSN repeats (two shards cannot share a database).
    """
    dsns = [d.strip() for d in raw.split(";") if d.strip()]
    seen: dict[str, int] = {}
    for i, dsn in enumerate(dsns):
        if dsn in seen:
            raise TopologyError(
                f"shards {seen[dsn]} and {i} name the same database: each shard needs its own"
            )
        seen[dsn] = i
    return dsns


def from_settings(
    *,
    db: str | None,
    shards: str | None,
    cluster_db: str | None,
    endpoints: Sequence[Endpoint] | None = None,
    credentials: Any = None,
) -> Topology:
    """The topology the settings describe (see the module for the order).

    `endpoints`: the active `shard_endpoint` rows (read by the caller from the cluster
    database); `credentials`: what resolves their aliases (a CredentialVault).

    Raises:
        TopologyError: settings that are missing or contradict each other.
    """
    if shards:
        if not cluster_db:
            raise TopologyError(
                "a shard list (FLOWTIDE_SHARDS / --shards) needs the cluster database too"
                " (FLOWTIDE_CLUSTER_DB / --cluster-db): the catalog, credentials and tokens"
                " live there, apart from every shard"
            )
        if db:
            raise TopologyError(
                "give either --db (one database) or --shards (one per shard), not both"
            )
        dsns = parse_shard_list(shards)
        if not dsns:
            raise TopologyError("the shard list (FLOWTIDE_SHARDS / --shards) names no database")
        if cluster_db in dsns:
            raise TopologyError("the cluster database cannot also be a shard's")
        return Topology(cluster_db, tuple(Shard(i, d) for i, d in enumerate(dsns)), "env")
    if endpoints:
        cluster = cluster_db or db
        assert cluster is not None
        return Topology(cluster, _from_endpoints(endpoints, credentials), "table")
    main = db or cluster_db
    if not main:
        raise TopologyError("no database: give --db (or FLOWTIDE_DB)")
    return Topology(cluster_db or main, (Shard(0, main),), "single")


def _from_endpoints(rows: Sequence[Endpoint], credentials: Any) -> tuple[Shard, ...]:
    from psycopg.conninfo import make_conninfo

    indexes = sorted(r.shard_index for r in rows)
    if indexes != list(range(len(indexes))):
        raise TopologyError(
            f"the shard map's active shards are {indexes}: they must be 0..N-1 without a gap"
        )
    shards = []
    for row in sorted(rows, key=lambda r: r.shard_index):
        alias = row.credential
        if credentials is None:
            raise TopologyError("the shard map needs the master key to read its credentials")
        body = credentials.resolve(alias)
        user, password = body.get("user") or body.get("username"), body.get("password")
        if not user:
            raise TopologyError(f"shard {row.shard_index}: credential {alias!r} has no `user`")
        dsn = make_conninfo(
            host=row.host,
            port=row.port,
            dbname=row.database,
            user=str(user),
            **({"password": str(password)} if password else {}),
            **({"sslmode": str(body["sslmode"])} if body.get("sslmode") else {}),
        )
        shards.append(Shard(row.shard_index, dsn))
    return tuple(shards)


def load(
    *,
    db: str | None,
    shards: str | None,
    cluster_db: str | None,
    home: Any = None,
    connect_timeout: float = 10.0,
) -> Topology:
    """The topology of these settings, reading the shard map from the cluster database
    when no shard list is given (see the module).

    Raises:
        TopologyError: see `from_settings`.
        StoreError: the cluster database cannot be read, or a shard's credential cannot
            be resolved.
    """
    if shards:
        return from_settings(db=db, shards=shards, cluster_db=cluster_db)
    cluster = cluster_db or db
    if not cluster:
        raise TopologyError("no database: give --db (or FLOWTIDE_DB)")
    import psycopg

    from flowtide.credentials import CredentialVault
    from flowtide.errors import CredentialError, StoreError
    from flowtide.store import pg
    from flowtide.store.postgres import display_dsn
    from flowtide.urls import scrub_url

    try:
        with psycopg.connect(cluster, autocommit=True, connect_timeout=int(connect_timeout)) as c:
            rows = pg.shards.endpoints(c)
            if not rows:
                return from_settings(db=db, shards=None, cluster_db=cluster_db)
            vault = CredentialVault(pg.credentials.Credentials(c), home)  # type: ignore[arg-type]
            try:
                return from_settings(
                    db=db, shards=None, cluster_db=cluster, endpoints=rows, credentials=vault
                )
            except CredentialError as exc:
                raise StoreError(f"the shard map: {exc}") from None
    except psycopg.Error as exc:
        raise StoreError(f"{display_dsn(cluster)}: {scrub_url(str(exc), cluster)}") from None
