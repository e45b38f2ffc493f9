"""Statements on the `execution` table of a shard (see `flowtide.store.pg`).

An execution's writers are serialised by its row lock (`lock`); a sub-playbook is created
under a share lock of its parent's row (`share_lock`), so a cancel of the parent either
sees the child or is seen by it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from flowtide.store.pg.pending import Pending

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CancelState",
    "Idle",
    "Outcome",
    "PlaybookSource",
    "count_by_status",
    "exists",
    "idle_executions",
    "in_flight",
    "lock",
    "open_children",
    "outcome",
    "parent_of",
    "playbook_source",
    "read_cancel_state",
    "request_cancel",
    "request_stop",
    "share_lock",
]


class CancelState(NamedTuple):
    """Where an execution stands, and whether a cancel (or finalize) was asked for."""

    status: str
    cancel_requested: float | None


class PlaybookSource(NamedTuple):
    """What an execution's state is folded from, besides its log."""

    text: str
    file: str | None
    status: str = "running"


class Outcome(NamedTuple):
    """An execution's status and its error as stored (JSON text, maybe sealed)."""

    status: str
    error: str | None


def _status(cur: psycopg.Cursor[Any]) -> str | None:
    row = cur.fetchone()
    return None if row is None else str(row[0])


def lock(conn: psycopg.Connection, execution_id: int) -> Pending[str | None]:
    """Lock the execution's row for the transaction (`FOR UPDATE`); its status, None
    when there is no such execution."""
    cur = conn.execute(
        "SELECT status FROM execution WHERE execution_id = %s FOR UPDATE", (execution_id,)
    )
    return Pending(cur, _status)


def share_lock(conn: psycopg.Connection, execution_id: int) -> CancelState | None:
    """Share-lock the execution's row (a child is being created under it)."""
    row = conn.execute(
        "SELECT status, cancel_requested FROM execution WHERE execution_id = %s FOR SHARE",
        (execution_id,),
    ).fetchone()
    return None if row is None else CancelState(*row)


def read_cancel_state(conn: psycopg.Connection, execution_id: int) -> CancelState | None:
    row = conn.execute(
        "SELECT status, cancel_requested FROM execution WHERE execution_id = %s",
        (execution_id,),
    ).fetchone()
    return None if row is None else CancelState(*row)


def playbook_source(conn: psycopg.Connection, execution_id: int) -> PlaybookSource | None:
    row = conn.execute(
        "SELECT playbook_text, playbook_file, status FROM execution WHERE execution_id = %s",
        (execution_id,),
    ).fetchone()
    return None if row is None else PlaybookSource(*row)


def exists(conn: psycopg.Connection, execution_id: int) -> bool:
    found = conn.execute(
        "SELECT 1 FROM execution WHERE execution_id = %s", (execution_id,)
    ).fetchone()
    return found is not None


def outcome(conn: psycopg.Connection, execution_id: int) -> Outcome | None:
    row = conn.execute(
        "SELECT status, error FROM execution WHERE execution_id = %s", (execution_id,)
    ).fetchone()
    return None if row is None else Outcome(*row)


def parent_of(conn: psycopg.Connection, execution_id: int) -> int | None:
    """The execution's parent (None: no parent, or no such execution)."""
    row = conn.execute(
        "SELECT parent_execution_id FROM execution WHERE execution_id = %s", (execution_id,)
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def request_cancel(conn: psycopg.Connection, execution_id: int, at: float) -> None:
    """Record a cancel request at `at` (workers learn it through cancellation-check)."""
    conn.execute(
        "UPDATE execution SET cancel_requested = %s WHERE execution_id = %s",
        (at, execution_id),
    )


def request_stop(conn: psycopg.Connection, execution_id: int, at: float) -> None:
    """`request_cancel`, keeping the time of an earlier request."""
    conn.execute(
        "UPDATE execution SET cancel_requested = COALESCE(cancel_requested, %s)"
        " WHERE execution_id = %s",
        (at, execution_id),
    )


def open_children(
    conn: psycopg.Connection, execution_id: int, terminal: Collection[str]
) -> list[int]:
    """The sub-playbook executions of `execution_id` whose status is not in `terminal`."""
    rows = conn.execute(
        "SELECT execution_id FROM execution WHERE parent_execution_id = %s AND status <> ALL(%s)",
        (execution_id, sorted(terminal)),
    ).fetchall()
    return [int(r[0]) for r in rows]


def count_by_status(conn: psycopg.Connection) -> dict[str, int]:
    """Executions by status: an index-only scan of execution_status, not of the wide rows
    (measured: about 0.25 s per million executions)."""
    rows = conn.execute("SELECT status, count(*) FROM execution GROUP BY status").fetchall()
    return {str(status): int(n) for status, n in rows}


class OpenExecutions(NamedTuple):
    #: When the oldest `running` execution was created (None when none runs).
    oldest_created: float | None
    #: `running` executions unchanged since before the threshold given, with no command
    #: issued or claimed: what the stall watch would re-drive or fail.
    idle: int


def open_executions(conn: psycopg.Connection, idle_before: float | None) -> OpenExecutions:
    """The oldest running execution and the idle ones (`OpenExecutions`): the first row
    of the execution_status index (ids grow with time), then the running rows only."""
    row = conn.execute(
        "SELECT created FROM execution WHERE status = 'running' ORDER BY execution_id LIMIT 1"
    ).fetchone()
    if row is None:
        return OpenExecutions(None, 0)
    idle = 0
    if idle_before is not None:
        found = conn.execute(
            "SELECT count(*) FROM execution x WHERE x.status = 'running' AND x.updated < %s"
            " AND NOT EXISTS (SELECT 1 FROM command c WHERE c.execution_id = x.execution_id"
            " AND c.status IN ('issued', 'claimed'))",
            (idle_before,),
        ).fetchone()
        idle = int(found[0]) if found else 0
    return OpenExecutions(float(row[0]), idle)


def count_estimate(conn: psycopg.Connection) -> int | None:
    """PostgreSQL's estimate of the execution rows (its statistics; None before the
    table was ever analysed): cheap at any size, unlike count(*)."""
    row = conn.execute(
        "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass('execution')"
    ).fetchone()
    return None if row is None or row[0] is None or int(row[0]) < 0 else int(row[0])


def put_summary(conn: psycopg.Connection, execution_id: int, format: int, doc: str) -> None:
    """Keep an ended execution's summary (`Store.put_summary`), in the caller's
    transaction: `doc` is its JSON text."""
    conn.execute(
        "INSERT INTO execution_summary (execution_id, format, doc) VALUES (%s, %s, %s)"
        " ON CONFLICT (execution_id) DO UPDATE SET format = excluded.format, doc = excluded.doc",
        (execution_id, format, doc),
    )


#: A playbook's deadline columns by kind (`timeout:` -> deadline, `sla:` -> sla).
_DEADLINE_COLUMNS = {"timeout": "deadline", "sla": "sla"}


class DueDeadline(NamedTuple):
    execution_id: int
    #: timeout or sla
    kind: str
    deadline: float
    created: float


def deadlines_due(
    conn: psycopg.Connection, now: float, ended: Sequence[str], limit: int = 100
) -> list[DueDeadline]:
    """Executions not `ended` whose timeout or sla has passed by `now` (indexed scans)."""
    rows = conn.execute(
        "(SELECT execution_id, 'timeout', deadline, created FROM execution"
        " WHERE deadline <= %s AND status <> ALL(%s) LIMIT %s)"
        " UNION ALL"
        " (SELECT execution_id, 'sla', sla, created FROM execution"
        " WHERE sla <= %s AND status <> ALL(%s) LIMIT %s)",
        (now, list(ended), limit, now, list(ended), limit),
    ).fetchall()
    return [DueDeadline(int(r[0]), str(r[1]), float(r[2]), float(r[3])) for r in rows]


def take_deadline(conn: psycopg.Connection, execution_id: int, kind: str) -> bool:
    """Clear the execution's `kind` deadline in the caller's transaction; False when
    another transaction took it first (its event is recorded once)."""
    column = _DEADLINE_COLUMNS[kind]
    row = conn.execute(
        f"UPDATE execution SET {column} = NULL"  # noqa: S608 - a name from the table above
        f" WHERE execution_id = %s AND {column} IS NOT NULL RETURNING 1",
        (execution_id,),
    ).fetchone()
    return row is not None


class Idle(NamedTuple):
    """A running execution with nothing in flight (`idle_executions`): the time of its
    last event."""

    execution_id: int
    last: float


def idle_executions(conn: psycopg.Connection, before: float, limit: int = 20) -> list[Idle]:
    """Executions `running` whose last event is older than `before` and that have no
    command issued or claimed and no outbox row to publish: nothing is in flight, nothing
    will wake them."""
    rows = conn.execute(
        "SELECT x.execution_id, l.time FROM execution x"
        " CROSS JOIN LATERAL (SELECT e.time FROM event e WHERE e.execution_id = x.execution_id"
        " ORDER BY e.seq DESC LIMIT 1) l"
        " WHERE x.status = 'running' AND x.updated < %s AND l.time < %s"
        " AND NOT EXISTS (SELECT 1 FROM command c WHERE c.execution_id = x.execution_id"
        " AND c.status IN ('issued', 'claimed'))"
        " AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.execution_id = x.execution_id"
        " AND o.published IS NULL)"
        " ORDER BY x.execution_id LIMIT %s",
        (before, before, limit),
    ).fetchall()
    return [Idle(int(r[0]), float(r[1])) for r in rows]


def in_flight(conn: psycopg.Connection, execution_id: int) -> bool:
    """Whether the execution has a command issued or claimed (read under its row lock)."""
    row = conn.execute(
        "SELECT 1 FROM command WHERE execution_id = %s AND status IN ('issued', 'claimed') LIMIT 1",
        (execution_id,),
    ).fetchone()
    return row is not None
