"""Statements on the `machine_lease` table of the cluster database: the 1,024 snowflake
machine ids, each leased by at most one live process (`flowtide.machines`).

Expiry is judged by the database's clock alone (`clock_timestamp()`), so the processes'
clocks never have to agree with each other. A row's `issued_until_ms` is the last Unix
millisecond its holder could have put in an id: whoever takes the id next starts after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "SERVER_IDS",
    "WORKER_IDS",
    "Lease",
    "acquire",
    "holders",
    "release",
    "release_prefixed",
    "renew",
]

_NOW = "extract(epoch FROM clock_timestamp())"


class Lease(NamedTuple):
    machine_id: int
    #: The previous holder's last possible millisecond (0: never used).
    floor_ms: int


#: Machine ids of server processes and of workers: apart, so that workers (whose
#: tokens may be many) can never take the ids servers need to start.
SERVER_IDS = range(0, 256)
WORKER_IDS = range(256, 1024)


def acquire(
    conn: psycopg.Connection, holder: str, seconds: float, among: range = range(1024)
) -> Lease | None:
    """Take a machine id for `seconds`: of the free ones, the one whose last use is
    oldest (never used first; None: all ids of `among` are held), so a new holder rarely has to
    start after a recent holder's last millisecond. Concurrent callers get different ids
    (SKIP LOCKED)."""
    row = conn.execute(
        f"""
        UPDATE machine_lease SET holder = %(holder)s, expires = {_NOW} + %(seconds)s
        WHERE machine_id = (
            SELECT machine_id FROM machine_lease
            WHERE expires < {_NOW} AND machine_id >= %(low)s AND machine_id < %(high)s
            ORDER BY issued_until_ms, machine_id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING machine_id, issued_until_ms
        """,
        {"holder": holder, "seconds": seconds, "low": among.start, "high": among.stop},
    ).fetchone()
    return None if row is None else Lease(int(row[0]), int(row[1]))


def renew(
    conn: psycopg.Connection, machine_id: int, holder: str, seconds: float, issued_until_ms: int
) -> bool:
    """Extend `holder`'s lease of `machine_id` by `seconds` from now; False when it is no
    longer theirs (it expired and someone else took it, or it expired at all: a lapsed
    lease is not revived). `issued_until_ms` bounds the holder's ids over the renewed
    term by its clock; the row keeps the later of that and the term by the database's,
    so a holder that dies leaves a floor that covers whatever it issued."""
    row = conn.execute(
        f"""
        UPDATE machine_lease SET expires = {_NOW} + %(seconds)s,
            issued_until_ms = GREATEST(issued_until_ms, %(issued)s,
                (({_NOW} + %(seconds)s) * 1000)::bigint + 1)
        WHERE machine_id = %(machine)s AND holder = %(holder)s AND expires >= {_NOW}
        RETURNING 1
        """,
        {"seconds": seconds, "issued": issued_until_ms, "machine": machine_id, "holder": holder},
    ).fetchone()
    return row is not None


def release(conn: psycopg.Connection, machine_id: int, holder: str, issued_until_ms: int) -> None:
    """Give `machine_id` back at once (a process that stops, having ended its lease),
    recording the last millisecond it used: the renewals' bound on the whole term is
    replaced by that exact one, so the next holder need not start in the future."""
    conn.execute(
        """
        UPDATE machine_lease SET expires = 0, holder = NULL, issued_until_ms = %(issued)s
        WHERE machine_id = %(machine)s AND holder = %(holder)s
        """,
        {"issued": issued_until_ms, "machine": machine_id, "holder": holder},
    )


def release_prefixed(conn: psycopg.Connection, prefix: str) -> int:
    """Give back every lease whose holder starts with `prefix` (a worker registering
    again: its earlier process is gone, or it is this one starting over); how many. The
    earlier holder may still issue until its lease's term, so that term becomes the
    floor of the next holder (`acquire` takes such an id last)."""
    cur = conn.execute(
        """
        UPDATE machine_lease SET expires = 0, holder = NULL,
            issued_until_ms = GREATEST(issued_until_ms, (expires * 1000)::bigint + 1)
        WHERE starts_with(holder, %s)
        """,
        (prefix,),
    )
    return cur.rowcount


def holders(conn: psycopg.Connection) -> dict[int, str]:
    """Live leases: machine id -> holder."""
    rows = conn.execute(
        f"SELECT machine_id, holder FROM machine_lease WHERE expires >= {_NOW} ORDER BY 1"
    ).fetchall()
    return {int(m): str(h) for m, h in rows}
