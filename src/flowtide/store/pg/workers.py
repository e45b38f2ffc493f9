"""Statements on the `worker` table of the cluster database (see `flowtide.store.pg` and
`flowtide.server.worker_registry`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "WorkerRow",
    "deregister",
    "get",
    "heartbeat",
    "ids_of",
    "list_all",
    "register",
]


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    pool: str
    hostname: str | None
    pid: int | None
    concurrency: int
    heartbeat: float
    status: str
    running: int
    #: The credential it registered under (a principal's `subject`; None without auth).
    subject: str | None


_COLUMNS: Final = (
    "worker_id, pool, hostname, pid, concurrency, heartbeat, status, running, token_id"
)


def _row(r: Sequence[Any]) -> WorkerRow:
    return WorkerRow(*r)


def register(
    conn: psycopg.Connection,
    *,
    worker_id: str,
    pool: str,
    hostname: str | None,
    pid: int | None,
    concurrency: int,
    subject: str | None,
    now: float,
    lost_before: float,
) -> WorkerRow | None:
    """Record (or renew) a worker under `subject`, in one statement: an existing row is
    taken over only when it is the same subject's, stopped, or lost (no heartbeat since
    `lost_before`). The row; None when it belongs to another live worker."""
    row = conn.execute(
        "INSERT INTO worker (worker_id, pool, hostname, pid, concurrency, registered,"
        " heartbeat, status, token_id) VALUES (%s,%s,%s,%s,%s,%s,%s,'ready',%s)"
        " ON CONFLICT (worker_id) DO UPDATE SET pool = excluded.pool,"
        " hostname = excluded.hostname, pid = excluded.pid,"
        " concurrency = excluded.concurrency, heartbeat = excluded.heartbeat,"
        " status = 'ready', token_id = excluded.token_id"
        " WHERE worker.token_id IS NOT DISTINCT FROM excluded.token_id"
        " OR worker.status = 'stopped' OR worker.heartbeat < %s"
        f" RETURNING {_COLUMNS}",
        (worker_id, pool, hostname, pid, concurrency, now, now, subject, lost_before),
    ).fetchone()
    return None if row is None else _row(row)


def get(conn: psycopg.Connection, worker_id: str) -> WorkerRow | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM worker WHERE worker_id = %s", (worker_id,)
    ).fetchone()
    return None if row is None else _row(row)


def heartbeat(conn: psycopg.Connection, worker_id: str, running: int, now: float) -> bool:
    """Record a heartbeat; False when the worker is not registered."""
    cur = conn.execute(
        "UPDATE worker SET heartbeat = %s, running = %s WHERE worker_id = %s",
        (now, running, worker_id),
    )
    return bool(cur.rowcount)


def deregister(conn: psycopg.Connection, worker_id: str, now: float) -> bool:
    """Mark the worker stopped; False when it is not registered."""
    cur = conn.execute(
        "UPDATE worker SET status = 'stopped', heartbeat = %s WHERE worker_id = %s",
        (now, worker_id),
    )
    return bool(cur.rowcount)


def list_all(conn: psycopg.Connection) -> list[WorkerRow]:
    """Every worker, by pool and id."""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM worker ORDER BY pool, worker_id").fetchall()
    return [_row(r) for r in rows]


def ids_of(conn: psycopg.Connection, subject: str | None) -> list[str]:
    """The worker ids registered under `subject`."""
    rows = conn.execute("SELECT worker_id FROM worker WHERE token_id = %s", (subject,)).fetchall()
    return [r[0] for r in rows]
