"""Statements on the `server_endpoint` table of the cluster database: the live server
processes and the shard each serves (`flowtide.server.servers`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import psycopg

__all__ = ["ServerRow", "beat", "live", "register", "remove"]

_NOW = "extract(epoch FROM clock_timestamp())"


class ServerRow(NamedTuple):
    server_id: str
    shard_index: int
    url: str | None
    started: float
    #: Seconds since its last heartbeat, by the database's clock.
    age: float


def register(conn: psycopg.Connection, server_id: str, shard_index: int, url: str | None) -> None:
    conn.execute(
        f"INSERT INTO server_endpoint (server_id, shard_index, url, started, heartbeat)"
        f" VALUES (%s, %s, %s, {_NOW}, {_NOW})"
        " ON CONFLICT (server_id) DO UPDATE SET shard_index = EXCLUDED.shard_index,"
        " url = EXCLUDED.url, heartbeat = EXCLUDED.heartbeat",
        (server_id, shard_index, url),
    )


def beat(conn: psycopg.Connection, server_id: str) -> bool:
    """False when the row is gone (removed as dead while this process was away)."""
    row = conn.execute(
        f"UPDATE server_endpoint SET heartbeat = {_NOW} WHERE server_id = %s RETURNING 1",
        (server_id,),
    ).fetchone()
    return row is not None


def remove(conn: psycopg.Connection, server_id: str) -> None:
    conn.execute("DELETE FROM server_endpoint WHERE server_id = %s", (server_id,))


def live(conn: psycopg.Connection, within: float, *, forget_after: float) -> list[ServerRow]:
    """Servers that beat within `within` seconds, by shard; rows silent for longer than
    `forget_after` are deleted on the way (processes that died without a goodbye)."""
    conn.execute(f"DELETE FROM server_endpoint WHERE heartbeat < {_NOW} - %s", (forget_after,))
    rows = conn.execute(
        f"SELECT server_id, shard_index, url, started, {_NOW} - heartbeat AS age"
        f" FROM server_endpoint WHERE heartbeat >= {_NOW} - %s"
        " ORDER BY shard_index, server_id",
        (within,),
    ).fetchall()
    return [ServerRow(str(r[0]), int(r[1]), r[2], float(r[3]), float(r[4])) for r in rows]
