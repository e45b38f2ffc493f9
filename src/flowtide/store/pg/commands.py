"""Statements on the `command` table of a shard (see `flowtide.store.pg`): the rows an
engine step reads and closes, claims, and leases.

A claimed command carries a lease (`lease_until`): its worker extends it with heartbeats,
and once it runs out the command is issued again. `release` ends a lease at 0, which
tells a command handed back by its worker from one whose lease expired.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from flowtide.store.pg.events import LAST_SEQ
from flowtide.store.pg.pending import Pending

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "ClaimRow",
    "ExpiredLease",
    "Holder",
    "Issued",
    "ToIssue",
    "claim",
    "close_open",
    "end_leases",
    "executions_with_expired_leases",
    "extend_leases",
    "held_by_any",
    "holds_live_claim",
    "issue",
    "issue_many",
    "lock_expired",
    "lock_for_claim",
    "lock_reported",
    "renew_leases",
]


class Holder(NamedTuple):
    """Who holds a command now: what a worker's report is judged against."""

    status: str | None
    worker_id: str | None
    attempt: int | None
    #: The execution and step the command is of (None: not known, nothing checked).
    execution_id: int | None = None
    step: str | None = None


class ExpiredLease(NamedTuple):
    command_id: int
    #: 0 when its worker handed it back (`end_leases`).
    lease_until: float


class Issued(NamedTuple):
    """What `issue` returns: the outbox row of each command, and the log's last seq."""

    #: command id -> outbox row id.
    outbox_ids: dict[int, int]
    last_seq: int


@dataclass(frozen=True, slots=True)
class ClaimRow:
    """A command row as the claim transaction locked it, with its execution's state."""

    command_id: int
    execution_id: int
    status: str
    worker_id: str | None
    attempt: int
    #: The `command.issued` event of its latest issue (from the row's payload).
    issued_event_id: int | None
    step: str
    loop_instance: int | None
    loop_index: int | None
    pool: str | None
    execution_status: str
    cancel_requested: float | None


# -- the step's rows --------------------------------------------------------------------


def _holders(cur: psycopg.Cursor[Any]) -> dict[int, Holder]:
    return {r[0]: Holder(r[1], r[2], r[3], r[4], r[5]) for r in cur.fetchall()}


def lock_reported(conn: psycopg.Connection, command_ids: list[int]) -> Pending[dict[int, Holder]]:
    """Lock the rows of the commands workers report on; command id -> its holder."""
    cur = conn.execute(
        "SELECT command_id, status, worker_id, attempt, execution_id, step FROM command"
        " WHERE command_id = ANY(%s) FOR UPDATE",
        (command_ids,),
    )
    return Pending(cur, _holders)


def lock_expired(conn: psycopg.Connection, execution_id: int, now: float) -> list[ExpiredLease]:
    """Lock the execution's claimed commands whose lease ended before `now`."""
    rows = conn.execute(
        "SELECT command_id, lease_until FROM command WHERE execution_id = %s"
        " AND status = 'claimed' AND lease_until < %s FOR UPDATE",
        (execution_id, now),
    ).fetchall()
    return [ExpiredLease(int(r[0]), r[1]) for r in rows]


def close_open(conn: psycopg.Connection, execution_id: int, now: float) -> None:
    """Cancel the execution's issued and claimed commands (it ended)."""
    conn.execute(
        "UPDATE command SET status = 'cancelled', updated = %s"
        " WHERE execution_id = %s AND status IN ('issued', 'claimed')",
        (now, execution_id),
    )


def _issued(cur: psycopg.Cursor[Any]) -> Issued:
    rows = cur.fetchall()
    last = rows[0][2] if rows else None
    return Issued({int(r[1]): int(r[0]) for r in rows}, int(last) if last is not None else 0)


class ToIssue(NamedTuple):
    """One execution's new commands for `issue_many`: their ids and notification
    payloads, in order, its pool and subject."""

    execution_id: int
    pool: str
    subject: str
    command_ids: list[int]
    payloads: list[str]


def issue_many(
    conn: psycopg.Connection,
    items: Sequence[ToIssue],
    *,
    created: float,
    locked_until: float | None,
    attempts: int,
) -> Pending[dict[int, Issued]]:
    """`issue` for the new commands of several executions (none claimed by a reporting
    worker): one statement for all, each execution's `Issued` by its id. A batch of runs
    created together (`Stepper.create_many`) pays one statement, not one per run."""
    executions: list[int] = []
    pools: list[str] = []
    subjects: list[str] = []
    command_ids: list[int] = []
    payloads: list[str] = []
    for item in items:
        for command_id, payload in zip(item.command_ids, item.payloads, strict=True):
            executions.append(item.execution_id)
            pools.append(item.pool)
            subjects.append(item.subject)
            command_ids.append(command_id)
            payloads.append(payload)
    cur = conn.execute(
        "WITH p AS (UPDATE command c SET pool = v.pool"
        " FROM unnest(%s::bigint[], %s::text[]) AS v(command_id, pool)"
        " WHERE c.command_id = v.command_id),"
        " o AS (INSERT INTO outbox (execution_id, command_id, subject, payload,"
        " created, published, locked_until, attempts)"
        " SELECT u.execution_id, u.command_id, u.subject, u.payload, %s, NULL, %s::float8, %s"
        " FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[]) WITH ORDINALITY"
        " AS u(execution_id, command_id, subject, payload, n) ORDER BY u.n"
        " RETURNING id, command_id, execution_id)"
        " SELECT o.id, o.command_id, o.execution_id, (SELECT e.seq FROM event e"
        " WHERE e.execution_id = o.execution_id ORDER BY e.seq DESC LIMIT 1) FROM o",
        (
            command_ids,
            pools,
            created,
            locked_until,
            attempts,
            executions,
            command_ids,
            subjects,
            payloads,
        ),
    )
    return Pending(cur, _issued_many)


def _issued_many(cur: psycopg.Cursor[Any]) -> dict[int, Issued]:
    found: dict[int, Issued] = {}
    for outbox_id, command_id, execution_id, last in cur.fetchall():
        issued = found.setdefault(int(execution_id), Issued({}, int(last or 0)))
        issued.outbox_ids[int(command_id)] = int(outbox_id)
    return found


def issue(
    conn: psycopg.Connection,
    execution_id: int,
    *,
    pool: str,
    subject: str,
    command_ids: list[int],
    payloads: list[str],
    created: float,
    locked_until: float | None,
    attempts: int,
    claimed: Sequence[int] = (),
) -> Pending[Issued]:
    """Set the pool of commands just written, add their outbox rows (notification
    `payloads[i]` for `command_ids[i]`, in that order, on `subject`) and read the log's
    last seq: one statement (the CTE and the subquery see the writes queued before it;
    each statement less is ~0.1 ms of the issue's path).

    `locked_until` and `attempts`: a row the writer publishes itself is written locked
    (the relay leaves it alone until then) and counted as one attempt. The rows of
    `claimed` (commands claimed in the same transaction: nothing to notify) are written
    published at `created`.
    """
    cur = conn.execute(
        "WITH p AS (UPDATE command SET pool = %s WHERE command_id = ANY(%s)),"
        " o AS (INSERT INTO outbox (execution_id, command_id, subject, payload,"
        " created, published, locked_until, attempts)"
        " SELECT %s, u.command_id, %s, u.payload, %s,"
        " CASE WHEN u.command_id = ANY(%s::bigint[]) THEN %s::float8 END,"
        " CASE WHEN u.command_id = ANY(%s::bigint[]) THEN NULL ELSE %s::float8 END, %s"
        " FROM unnest(%s::bigint[], %s::text[]) WITH ORDINALITY"
        " AS u(command_id, payload, n) ORDER BY u.n RETURNING id, command_id)"
        f" SELECT o.id, o.command_id, ({LAST_SEQ}) FROM o",
        (
            pool,
            command_ids,
            execution_id,
            subject,
            created,
            list(claimed),
            created,
            list(claimed),
            locked_until,
            attempts,
            command_ids,
            payloads,
            execution_id,
        ),
    )
    return Pending(cur, _issued)


# -- claims -------------------------------------------------------------------------------


def _claim_row(r: Sequence[Any]) -> ClaimRow:
    issued = (json.loads(r[5]) if r[5] else {}).get("issued_event_id")
    return ClaimRow(
        command_id=r[0],
        execution_id=r[1],
        status=r[2],
        worker_id=r[3],
        attempt=r[4],
        issued_event_id=int(issued) if issued is not None else None,
        step=r[6],
        loop_instance=r[7],
        loop_index=r[8],
        pool=r[9],
        execution_status=r[10],
        cancel_requested=r[11],
    )


def lock_for_claim(conn: psycopg.Connection, command_ids: Sequence[int]) -> dict[int, ClaimRow]:
    """Lock the commands' rows in id order (two claim transactions never wait on each
    other in a cycle); command id -> row, with its execution's status."""
    rows = conn.execute(
        "SELECT c.command_id, c.execution_id, c.status, c.worker_id, c.attempt,"
        " c.payload, c.step, c.loop_instance, c.loop_index, c.pool, e.status,"
        " e.cancel_requested"
        " FROM command c JOIN execution e ON e.execution_id = c.execution_id"
        " WHERE c.command_id = ANY(%s) ORDER BY c.command_id FOR UPDATE OF c",
        (sorted(set(command_ids)),),
    ).fetchall()
    return {r[0]: _claim_row(r) for r in rows}


def renew_leases(
    conn: psycopg.Connection, command_ids: Sequence[int], lease_until: float, now: float
) -> None:
    """A new lease on commands their worker claimed already (it claims them again)."""
    with conn.cursor() as cur:
        cur.executemany(
            "UPDATE command SET lease_until = %s, updated = %s WHERE command_id = %s",
            [(lease_until, now, c) for c in command_ids],
        )


def claim(
    conn: psycopg.Connection,
    command_ids: Sequence[int],
    worker_id: str,
    *,
    now: float,
    lease_until: float,
) -> None:
    """Give the commands to `worker_id` with a lease until `lease_until`."""
    claim_each(conn, [(c, worker_id) for c in command_ids], now=now, lease_until=lease_until)


def claim_each(
    conn: psycopg.Connection,
    claims: Sequence[tuple[int, str]],
    *,
    now: float,
    lease_until: float,
) -> None:
    """Give each command (`claims`: command id, worker id) to its worker with a lease
    until `lease_until`."""
    with conn.cursor() as cur:
        cur.executemany(
            "UPDATE command SET status = 'claimed', worker_id = %s, claimed = %s,"
            " lease_until = %s, updated = %s WHERE command_id = %s",
            [(worker_id, now, lease_until, now, c) for c, worker_id in claims],
        )


# -- leases -------------------------------------------------------------------------------


def holds_live_claim(
    conn: psycopg.Connection, execution_id: int, command_id: int, worker_id: str, now: float
) -> bool:
    """Whether `worker_id` holds the command with a lease that runs past `now`."""
    row = conn.execute(
        "SELECT 1 FROM command WHERE command_id = %s AND execution_id = %s"
        " AND status = 'claimed' AND worker_id = %s AND lease_until > %s",
        (command_id, execution_id, worker_id, now),
    ).fetchone()
    return row is not None


def extend_leases(
    conn: psycopg.Connection, worker_id: str, lease_until: float, command_ids: list[int] | None
) -> int:
    """Move the leases `worker_id` holds to `lease_until`: those of `command_ids`, or all
    of them (None); how many."""
    if command_ids is None:
        return int(
            conn.execute(
                "UPDATE command SET lease_until = %s WHERE worker_id = %s AND status = 'claimed'",
                (lease_until, worker_id),
            ).rowcount
        )
    if not command_ids:
        return 0
    return int(
        conn.execute(
            "UPDATE command SET lease_until = %s WHERE worker_id = %s"
            " AND status = 'claimed' AND command_id = ANY(%s)",
            (lease_until, worker_id, command_ids),
        ).rowcount
    )


def end_leases(conn: psycopg.Connection, worker_id: str, command_ids: list[int]) -> list[int]:
    """End now (at 0) the leases `worker_id` holds of `command_ids`; the execution of each
    command released (one entry per command)."""
    rows = conn.execute(
        "UPDATE command SET lease_until = 0 WHERE worker_id = %s"
        " AND status = 'claimed' AND command_id = ANY(%s) RETURNING execution_id",
        (worker_id, command_ids),
    ).fetchall()
    return [int(r[0]) for r in rows]


def executions_with_expired_leases(conn: psycopg.Connection, now: float, limit: int) -> list[int]:
    """Up to `limit` executions with a claimed command whose lease ended before `now`."""
    rows = conn.execute(
        "SELECT DISTINCT execution_id FROM command WHERE status = 'claimed'"
        " AND lease_until < %s LIMIT %s",
        (now, limit),
    ).fetchall()
    return [int(r[0]) for r in rows]


def held_by_any(conn: psycopg.Connection, execution_id: int, worker_ids: list[str]) -> bool:
    """Whether one of `worker_ids` holds or held a command of the execution."""
    row = conn.execute(
        "SELECT 1 FROM command WHERE execution_id = %s AND worker_id = ANY(%s) LIMIT 1",
        (execution_id, worker_ids),
    ).fetchone()
    return row is not None
