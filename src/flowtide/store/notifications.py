"""The notifications part of the store port (`flowtide.notify`): the deliveries a
transition owes, written in the transaction that records the transition (an outbox), and
leased by the relays that send them. Adapter: `flowtide.store.sql.notifications` (SQLite
and PostgreSQL); the server writes its rows with `flowtide.store.pg.notifications`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flowtide.engine.events import Event


@dataclass(frozen=True, slots=True)
class PendingNotification:
    """A delivery owed: one target of one transition of one execution.

    `target` is the `NotifyTarget` as JSON; `doc` the notification document, already masked
    with the execution's secret set (nothing secret is stored here)."""

    execution_id: int
    event_id: int
    on: str
    target: dict[str, Any]
    doc: dict[str, Any]
    created: float


@dataclass(frozen=True, slots=True)
class NotificationRow:
    """A leased delivery: its row id, what it owes, the attempts made so far."""

    id: int
    execution_id: int
    event_id: int
    on: str
    target: dict[str, Any]
    doc: dict[str, Any]
    attempts: int
    created: float


class NotificationStore(Protocol):
    """Deliveries owed (the notification outbox, shard part)."""

    def lease_notifications(self, *, now: float, lease: float, limit: int) -> list[NotificationRow]:
        """Take up to `limit` deliveries due at `now` that nobody holds, for `lease` seconds
        (rows held by another relay are skipped, not waited for).

        Raises:
            StoreError: the store failed.
        """
        ...

    def settle_notification(
        self,
        row_id: int,
        event: Event,
        *,
        retry_at: float | None,
        secrets: Collection[str] = (),
    ) -> None:
        """Record one attempt (`event`, a `notification.sent`/`failed` of the row's
        execution) and, in the same transaction, drop the row (`retry_at` None: done) or
        make it due again at `retry_at`.

        Raises:
            StoreError: the store failed (nothing written: the lease runs out and the
                delivery is tried again).
        """
        ...

    def pending_notifications(self, execution_ids: Sequence[int] | None = None) -> int:
        """How many deliveries are still owed (of `execution_ids`, or of every execution).

        Raises:
            StoreError: the store failed.
        """
        ...
