"""Statements on the `shard_endpoint` table of the cluster database: the shard map of
phase G (`flowtide.topology`, `flowtide shards add|list|set`)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = ["Endpoint", "add", "endpoints", "update"]


@dataclass(frozen=True)
class Endpoint:
    shard_index: int
    host: str
    port: int
    database: str
    #: The alias of a credential (`user`, `password`) in the credential store.
    credential: str
    active: bool
    updated: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_COLUMNS = "shard_index, host, port, database, credential, active, updated"


def endpoints(conn: psycopg.Connection, *, active_only: bool = True) -> list[Endpoint]:
    """The map's rows by shard index ([] before the table exists: an older schema)."""
    exists = conn.execute("SELECT to_regclass('shard_endpoint') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return []
    where = " WHERE active" if active_only else ""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM shard_endpoint{where} ORDER BY shard_index"
    ).fetchall()
    return [Endpoint(int(r[0]), r[1], int(r[2]), r[3], r[4], bool(r[5]), float(r[6])) for r in rows]


def add(
    conn: psycopg.Connection, index: int, host: str, port: int, database: str, credential: str
) -> bool:
    """Add shard `index` (active); False when the index is taken."""
    row = conn.execute(
        f"INSERT INTO shard_endpoint ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, true, %s)"
        " ON CONFLICT (shard_index) DO NOTHING RETURNING 1",
        (index, host, port, database, credential, time.time()),
    ).fetchone()
    return row is not None


def update(conn: psycopg.Connection, index: int, changes: dict[str, Any]) -> bool:
    """Change the given fields of shard `index` (host, port, database, credential,
    active); False when there is no such shard."""
    allowed = {"host", "port", "database", "credential", "active"}
    fields = {k: v for k, v in changes.items() if k in allowed}
    assignments = ", ".join(f"{k} = %({k})s" for k in fields)
    row = conn.execute(
        f"UPDATE shard_endpoint SET {assignments}{', ' if assignments else ''}"
        " updated = %(updated)s WHERE shard_index = %(index)s RETURNING 1",
        {**fields, "updated": time.time(), "index": index},
    ).fetchone()
    return row is not None
