"""The notification outbox (`flowtide.store.notifications`), written once for SQLite and
PostgreSQL. A row is written with the transition it reports (`append`'s `notifications`,
or `flowtide.store.pg.notifications.enqueue` in the server's step), leased by a relay
(PostgreSQL: `FOR UPDATE SKIP LOCKED`, so the servers of a shard never take one row at
once), and settled with the event that records the attempt, in one transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, ClassVar, Final

from flowtide.engine.events import Event
from flowtide.store.codec import decode, encode_value, event_params
from flowtide.store.notifications import NotificationRow, PendingNotification
from flowtide.store.sql.adapter import SQLAdapter

__all__ = ["INSERT_NOTIFICATION", "NotificationTables", "notification_params"]

INSERT_NOTIFICATION: Final = (
    "INSERT INTO notification (execution_id, event_id, on_transition, target, doc, attempts,"
    " next_at, created) VALUES (?, ?, ?, ?, ?, 0, ?, ?)"
)
_COLUMNS: Final = "id, execution_id, event_id, on_transition, target, doc, attempts, created"
_INSERT_EVENT: Final = (
    "INSERT INTO event (execution_id, event_id, type, step, status, payload, error,"
    " parent_event_id, command_id, worker_id, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def notification_params(rows: Sequence[PendingNotification]) -> list[tuple[Any, ...]]:
    """`INSERT_NOTIFICATION`'s parameters of each row."""
    return [
        (
            r.execution_id,
            r.event_id,
            r.on,
            encode_value(r.target, "notification target"),
            encode_value(r.doc, "notification document"),
            r.created,
            r.created,
        )
        for r in rows
    ]


def _row(r: Sequence[Any]) -> NotificationRow:
    return NotificationRow(
        id=int(r[0]),
        execution_id=int(r[1]),
        event_id=int(r[2]),
        on=str(r[3]),
        target=decode(r[4]),
        doc=decode(r[5]),
        attempts=int(r[6]),
        created=float(r[7]),
    )


class NotificationTables(SQLAdapter):
    """The notification outbox (shard part)."""

    #: What the lease's inner SELECT ends with: PostgreSQL skips rows another relay holds.
    SKIP_LOCKED: ClassVar[str] = ""
    #: Whether settling locks the execution's row first: on PostgreSQL the event then
    #: takes its place in the log (`seq`) in the order steps commit theirs, which is
    #: what the servers' catch-up and the live stream read by (SQLite has one writer).
    LOCK_EXECUTION: ClassVar[bool] = False

    def lease_notifications(self, *, now: float, lease: float, limit: int) -> list[NotificationRow]:
        """See `flowtide.store.notifications.NotificationStore.lease_notifications`."""
        sql = self._sql(
            "UPDATE notification SET locked_until = ? WHERE id IN (SELECT id FROM notification"
            " WHERE next_at <= ? AND (locked_until IS NULL OR locked_until <= ?)"
            f" ORDER BY next_at LIMIT ?{self.SKIP_LOCKED}) RETURNING {_COLUMNS}"
        )
        with self.transaction("lease notifications") as conn:
            rows = conn.execute(sql, (now + lease, now, now, limit)).fetchall()
        return sorted((_row(r) for r in rows), key=lambda r: r.id)

    def settle_notification(
        self,
        row_id: int,
        event: Event,
        *,
        retry_at: float | None,
        secrets: Collection[str] = (),
    ) -> None:
        """See `flowtide.store.notifications.NotificationStore.settle_notification`."""
        params = event_params(
            [event], self.sealer, {event.execution_id: secrets} if secrets else None
        )
        with self.transaction("settle notification") as conn:
            if self.LOCK_EXECUTION:
                conn.execute(
                    self._sql("SELECT 1 FROM execution WHERE execution_id = ? FOR UPDATE"),
                    (event.execution_id,),
                )
            conn.execute(self._sql(_INSERT_EVENT), params[0])
            if retry_at is None:
                conn.execute(self._sql("DELETE FROM notification WHERE id = ?"), (row_id,))
            else:
                conn.execute(
                    self._sql(
                        "UPDATE notification SET attempts = attempts + 1, next_at = ?,"
                        " locked_until = NULL WHERE id = ?"
                    ),
                    (retry_at, row_id),
                )

    def pending_notifications(self, execution_ids: Sequence[int] | None = None) -> int:
        """See `flowtide.store.notifications.NotificationStore.pending_notifications`."""
        if execution_ids is None:
            rows = self._read("pending notifications", "SELECT COUNT(*) FROM notification")
        elif not execution_ids:
            return 0
        else:
            marks = ", ".join("?" * len(execution_ids))
            rows = self._read(
                "pending notifications",
                f"SELECT COUNT(*) FROM notification WHERE execution_id IN ({marks})",
                list(execution_ids),
            )
        return int(rows[0][0])
