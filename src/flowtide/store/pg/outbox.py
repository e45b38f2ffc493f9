"""Statements on the `outbox` table of a shard (see `flowtide.store.pg` and
`flowtide.server.outbox`): command notifications written with the step that issues the
commands (`commands.issue`), published to NATS afterwards.

Rows are claimed with `FOR UPDATE SKIP LOCKED` plus a lock lease (`locked_until`), so any
number of relays take disjoint rows; a row whose lease ran out is taken again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "Backlog",
    "OutboxRow",
    "backlog",
    "claim",
    "mark_failed",
    "mark_published",
    "prune",
    "renotify",
]


@dataclass(frozen=True)
class OutboxRow:
    id: int
    execution_id: int
    command_id: int
    subject: str
    payload: str
    attempts: int


class Backlog(NamedTuple):
    """The unpublished rows: how many, and when the oldest was written (None: none)."""

    pending: int
    oldest: float | None


def claim(conn: psycopg.Connection, *, now: float, lease: float, limit: int) -> list[OutboxRow]:
    """Lock up to `limit` unpublished rows nobody holds until `now + lease` (an attempt
    each); in id order."""
    rows = conn.execute(
        "UPDATE outbox SET locked_until = %s, attempts = attempts + 1"
        " WHERE id IN (SELECT id FROM outbox WHERE published IS NULL"
        " AND (locked_until IS NULL OR locked_until < %s)"
        " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
        " RETURNING id, execution_id, command_id, subject, payload, attempts",
        (now + lease, now, limit),
    ).fetchall()
    return sorted((OutboxRow(*r) for r in rows), key=lambda r: r.id)


def mark_published(conn: psycopg.Connection, ids: list[int], now: float) -> int:
    """Mark rows published at `now` (those not already); how many."""
    return int(
        conn.execute(
            "UPDATE outbox SET published = %s, locked_until = NULL, last_error = NULL"
            " WHERE id = ANY(%s) AND published IS NULL",
            (now, ids),
        ).rowcount
    )


def mark_failed(conn: psycopg.Connection, ids: list[int], error: str) -> int:
    """Unlock unpublished rows for another try, recording `error`; how many."""
    return int(
        conn.execute(
            "UPDATE outbox SET locked_until = NULL, last_error = %s"
            " WHERE id = ANY(%s) AND published IS NULL",
            (error, ids),
        ).rowcount
    )


def backlog(conn: psycopg.Connection) -> Backlog:
    row = conn.execute(
        "SELECT COUNT(*), MIN(created) FROM outbox WHERE published IS NULL"
    ).fetchone()
    count, oldest = row or (0, None)
    return Backlog(int(count), oldest)


def prune(conn: psycopg.Connection, published_before: float) -> int:
    """Delete rows published before `published_before`; how many."""
    return int(
        conn.execute(
            "DELETE FROM outbox WHERE published IS NOT NULL AND published < %s",
            (published_before,),
        ).rowcount
    )


def renotify(conn: psycopg.Connection, *, now: float, before: float) -> int:
    """Add a copy (written at `now`) of the last notification of every command still
    unclaimed since before `before` whose notification was published before then; how
    many."""
    return int(
        conn.execute(
            "INSERT INTO outbox (execution_id, command_id, subject, payload, created)"
            " SELECT o.execution_id, o.command_id, o.subject, o.payload, %s"
            " FROM command c JOIN LATERAL (SELECT * FROM outbox x"
            "  WHERE x.command_id = c.command_id ORDER BY x.id DESC LIMIT 1) o ON true"
            " WHERE c.status = 'issued' AND c.updated < %s"
            " AND o.published IS NOT NULL AND o.published < %s",
            (now, before, before),
        ).rowcount
    )
