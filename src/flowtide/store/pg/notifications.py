"""Statements on the `notification` table of a shard (see `flowtide.store.pg` and
`flowtide.store.sql.notifications`): the deliveries a transition owes, written in the
step transaction that records the transition. The relays lease and settle them through
the store port (`PostgresStore.lease_notifications`, `FOR UPDATE SKIP LOCKED`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from flowtide.store.notifications import PendingNotification
from flowtide.store.sql.notifications import INSERT_NOTIFICATION, notification_params

if TYPE_CHECKING:
    import psycopg

__all__ = ["enqueue"]

_INSERT = INSERT_NOTIFICATION.replace("?", "%s")


def enqueue(conn: psycopg.Connection, rows: Sequence[PendingNotification]) -> None:
    """Write the deliveries `rows` owe, in the caller's transaction (a pipeline too)."""
    if rows:
        with conn.cursor() as cur:
            cur.executemany(_INSERT, notification_params(rows))
