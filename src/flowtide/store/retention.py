"""Retention, the port part: which ended executions may go, and removing them with
everything the store holds of them (`flowtide gc`).

An execution may go when it ended (completed, failed or cancelled; or the statuses
asked for, among those) before the cutoff, and no execution it started is still open
(a parent waits for its children). What goes with it: its events, commands, kept
summary, notification deliveries (and, on PostgreSQL, its outbox rows). Trigger firings
stay: they say which slot, delivery or message already started a run, and forgetting
that would start it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Collected", "RetentionStore"]


@dataclass
class Collected:
    """Rows removed per table (or, dry, that would be)."""

    executions: int = 0
    rows: dict[str, int] = field(default_factory=dict)


class RetentionStore(Protocol):
    def collectable(self, *, before: float, statuses: Sequence[str], limit: int = 500) -> list[int]:
        """Ids of executions of `statuses` (ended ones) last updated before `before`
        whose children have all ended, oldest first, at most `limit`."""
        ...

    def collect(self, execution_ids: Sequence[int], *, dry_run: bool = False) -> Collected:
        """Remove the executions and their rows in one transaction (counted, and rolled
        back when `dry_run`)."""
        ...

    def reclaim(self) -> None:
        """Give the space freed back (SQLite: VACUUM; PostgreSQL: left to autovacuum)."""
        ...
