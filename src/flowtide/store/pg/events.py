"""Statements on the `event` table of a shard: the log (see `flowtide.store.pg`).

Two orders of the log matter. `seq` is the insertion order: a server process catches up
on what others appended since it last stepped an execution by `seq`, under the
execution's row lock (event ids of workers are not in arrival order). `(xact, seq)` is
the commit order, for readers that follow the log without a lock (the live stream): rows
of a transaction older than every transaction in progress can no longer appear before
rows already read.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.sealing import SEALED_PREFIX
from flowtide.store.codec import EVENT_COLUMNS, decode_events, event_row, load_json
from flowtide.store.pg.pending import Pending

if TYPE_CHECKING:
    import psycopg

    from flowtide.sealing import Sealer

__all__ = [
    "START",
    "ClaimedEvent",
    "CtxWrite",
    "LogPosition",
    "LoggedEvent",
    "any_after",
    "ctx_writes",
    "insert_claimed",
    "issue_times",
    "known_ids",
    "last_seq",
    "position",
    "read_snapshot",
    "settled_after",
    "since",
]


class LoggedEvent(NamedTuple):
    event: Event
    #: Its place in the insertion order of the execution's log.
    seq: int


class LogPosition(NamedTuple):
    """A place in the commit order of an execution's log: (transaction id as text, seq)."""

    xact: str
    seq: int


#: Before the first event of any log.
START: Final = LogPosition("0", 0)


class ClaimedEvent(NamedTuple):
    """A `command.claimed` event written by the claim transaction."""

    execution_id: int
    event_id: int
    step: str
    #: The command's attempt (the event's payload).
    attempt: int
    #: The command's `command.issued` event.
    parent_event_id: int
    command_id: int
    worker_id: str
    time: float


@dataclass(frozen=True, slots=True)
class CtxWrite:
    """An event that may set or unset top-level `ctx` keys, payload decoded."""

    event_id: int
    type: str
    step: str | None
    payload: dict[str, Any]
    time: float


#: The seq of an execution's last event (also a subquery of `commands.issue`).
LAST_SEQ: Final = "SELECT seq FROM event WHERE execution_id = %s ORDER BY seq DESC LIMIT 1"

# Transaction ids older than every transaction still in progress belong to finished
# transactions, and every transaction to come gets a larger one: below this horizon the
# (xact, seq) order of the log is final. Transactions of other databases of the server
# cannot write this log, so they do not hold the stream back.
_HORIZON: Final = (
    "SELECT COALESCE((SELECT min(x) FROM pg_snapshot_xip(pg_current_snapshot()) AS x"
    " WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.backend_xid = xid(x)"
    " AND a.datname <> current_database())), pg_snapshot_xmax(pg_current_snapshot()))"
)


def since(
    conn: psycopg.Connection,
    execution_id: int,
    seq: int,
    sealer: Sealer | None,
    types: Collection[str] | None = None,
) -> Pending[list[LoggedEvent]]:
    """What the execution's log got after `seq`, in insertion order (only events of
    `types` when given)."""
    sql = f"SELECT {EVENT_COLUMNS}, seq FROM event WHERE execution_id = %s AND seq > %s"
    params: list[Any] = [execution_id, seq]
    if types is not None:
        sql += " AND type = ANY(%s)"
        params.append(sorted(types))
    cur = conn.execute(sql + " ORDER BY seq", params)

    def read(cur: psycopg.Cursor[Any]) -> list[LoggedEvent]:
        rows = cur.fetchall()
        events = decode_events([r[:11] for r in rows], sealer)
        return [LoggedEvent(e, r[11]) for e, r in zip(events, rows, strict=True)]

    return Pending(cur, read)


def _last_seq(cur: psycopg.Cursor[Any]) -> int:
    row = cur.fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


def last_seq(conn: psycopg.Connection, execution_id: int) -> Pending[int]:
    """The seq of the execution's last event (0: none)."""
    return Pending(conn.execute(LAST_SEQ, (execution_id,)), _last_seq)


#: A lookup in the primary key per (execution id, event id) pair of two arrays, with the
#: event's time. Not `execution_id = %s AND event_id = ANY(%s)`, nor a join: psycopg
#: prepares a statement after its fifth run, and PostgreSQL's generic plan for those may
#: scan the whole execution's log and filter or hash it against the array (1.6 ms at
#: 12,000 events and growing with the log, measured on the step's path). A LATERAL
#: subquery with LIMIT is never flattened, so each pair stays one index probe. Never
#: prepared (`prepare=False`): planned each time against the log's actual size. A plan
#: made while the table was nearly empty (a new database) costs every index that starts
#: with execution_id the same and may probe through `event_xact`, reading the whole
#: execution once per id (1 s for 500 ids at 30,000 events, measured in a 10,000-
#: iteration loop's steps); psycopg would keep that plan for the connection's life.
_PROBES: Final = (
    "SELECT u.event_id, f.time FROM unnest(%s::bigint[]) AS x(execution_id)"
    " CROSS JOIN unnest(%s::bigint[]) AS u(event_id),"
    " LATERAL (SELECT e.time FROM event e WHERE e.execution_id = x.execution_id"
    " AND e.event_id = u.event_id LIMIT 1) AS f"
)


def _ids(cur: psycopg.Cursor[Any]) -> set[int]:
    return {r[0] for r in cur.fetchall()}


def known_ids(
    conn: psycopg.Connection, execution_id: int, event_ids: list[int]
) -> Pending[set[int]]:
    """Which of `event_ids` the execution's log already holds."""
    cur = conn.execute(_PROBES, ([execution_id], event_ids), prepare=False)
    return Pending(cur, _ids)


def _claimed_payload(attempt: int) -> str:
    payload: ev.CommandClaimedPayload = {"attempt": attempt}
    return json.dumps(payload)


def insert_claimed(conn: psycopg.Connection, events: Sequence[ClaimedEvent]) -> None:
    """Append `command.claimed` events (status `claimed`)."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO event (execution_id, event_id, type, step, status,"
            " payload, parent_event_id, command_id, worker_id, time)"
            " VALUES (%s, %s, %s, %s, 'claimed', %s, %s, %s, %s, %s)",
            [
                (
                    e.execution_id,
                    e.event_id,
                    ev.COMMAND_CLAIMED,
                    e.step,
                    _claimed_payload(e.attempt),
                    e.parent_event_id,
                    e.command_id,
                    e.worker_id,
                    e.time,
                )
                for e in events
            ],
        )


def _times(cur: psycopg.Cursor[Any]) -> dict[int, float]:
    return {int(r[0]): r[1] for r in cur.fetchall()}


def issue_times(
    conn: psycopg.Connection, execution_ids: list[int], event_ids: list[int]
) -> Pending[dict[int, float]]:
    """event id -> time of the events `event_ids` of the executions `execution_ids`."""
    cur = conn.execute(_PROBES, (execution_ids, event_ids), prepare=False)
    return Pending(cur, _times)


# -- the live stream, in commit order -------------------------------------------------


def position(conn: psycopg.Connection, execution_id: int, event_id: int) -> LogPosition | None:
    """Where event `event_id` is in the commit order (None: not in this execution)."""
    row = conn.execute(
        "SELECT xact::text, seq FROM event WHERE execution_id = %s AND event_id = %s",
        (execution_id, event_id),
    ).fetchone()
    return None if row is None else LogPosition(str(row[0]), int(row[1]))


def read_snapshot(conn: psycopg.Connection) -> None:
    """Make the transaction a read-only snapshot (every statement after this sees the
    same database); its first statement."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


def settled_after(
    conn: psycopg.Connection,
    execution_id: int,
    after: LogPosition | tuple[str, int],
    limit: int,
    sealer: Sealer | None,
) -> list[tuple[Event, LogPosition]]:
    """Up to `limit` events after `after` in commit order whose place is final (below
    the horizon of transactions in progress), each with its position."""
    rows = conn.execute(
        f"SELECT {EVENT_COLUMNS}, xact::text, seq FROM event WHERE execution_id = %s"
        " AND (xact, seq) > (%s::text::xid8, %s)"
        f" AND xact < ({_HORIZON}) ORDER BY xact, seq LIMIT %s",
        (execution_id, *after, limit),
    ).fetchall()
    return [(event_row(r[:11], sealer), LogPosition(str(r[11]), int(r[12]))) for r in rows]


def any_after(
    conn: psycopg.Connection, execution_id: int, after: LogPosition | tuple[str, int]
) -> bool:
    """Whether the log holds any event after `after` in commit order (settled or not)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM event WHERE execution_id = %s"
        " AND (xact, seq) > (%s::text::xid8, %s))",
        (execution_id, *after),
    ).fetchone()
    return bool(row and row[0])


# -- variables' history ---------------------------------------------------------------


def ctx_writes(
    conn: psycopg.Connection, execution_id: int, sealer: Sealer | None
) -> list[CtxWrite]:
    """The events that can have changed the execution's `ctx`, in log order:
    `ctx.updated` and `step.exit` with a `set` or `unset`, command reports with a `ctx`.
    A sealed payload's text says nothing, so every sealed one of those types is read and
    unsealed too."""
    sealed = SEALED_PREFIX + "%"
    rows = conn.execute(
        "SELECT event_id, type, step, payload, time FROM event WHERE execution_id = %s"
        " AND ((type IN (%s, %s) AND (payload LIKE %s OR payload LIKE %s OR payload LIKE %s))"
        " OR (type IN (%s, %s) AND (payload LIKE %s OR payload LIKE %s))) ORDER BY seq",
        (
            execution_id,
            ev.CTX_UPDATED,
            ev.STEP_EXIT,
            '%"set":{%',
            '%"unset":[%',
            sealed,
            ev.COMMAND_COMPLETED,
            ev.COMMAND_FAILED,
            '%"ctx":{%',
            sealed,
        ),
    ).fetchall()
    return [
        CtxWrite(
            int(event_id),
            type_,
            step,
            load_json(payload, sealer, f"event {event_id}: payload") if payload else {},
            at,
        )
        for event_id, type_, step, payload, at in rows
    ]
