"""A server's watch over its shard's deadlines: a playbook's `timeout:` and `sla:` are
instants on the execution row (set when it is created), found with one indexed scan a
few times a second, and recorded as `execution.deadline_missed` through a step (the
engine fails a run past its timeout). However many servers of the shard scan, each
deadline is recorded once: the step's transaction clears the column first and gives up
when another transaction did."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Final

from flowtide.runtime.deadlines import deadline_event
from flowtide.server.coordinator import TERMINAL, Coordinator
from flowtide.store import pg

if TYPE_CHECKING:
    import psycopg

__all__ = ["DeadlineWatch"]

log = logging.getLogger("flowtide.server")

#: Seconds between two scans: a run past its timeout fails within about this.
SCAN_INTERVAL: Final = 0.25


class _Taken(Exception):
    """Another server recorded this deadline first."""


class DeadlineWatch:
    """Records the deadlines of the coordinator's shard as they pass (`run`)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SCAN_INTERVAL)
            try:
                await self.sweep(time.time())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep watching
                log.warning("deadlines: %s", exc)

    async def sweep(self, now: float) -> int:
        """Record every deadline passed by `now`; how many were recorded here."""
        store = self.coordinator.store

        def due() -> list[pg.executions.DueDeadline]:
            with store.transaction("deadlines due") as conn:
                return pg.executions.deadlines_due(conn, now, sorted(TERMINAL))

        recorded = 0
        for found in await asyncio.to_thread(due):
            event = deadline_event(
                found.execution_id,
                found.kind,
                found.deadline,
                found.deadline - found.created,
                event_id=self.coordinator.ids.next_id(),
                now=time.time(),
            )

            def take(conn: psycopg.Connection, found: pg.executions.DueDeadline = found) -> None:
                if not pg.executions.take_deadline(conn, found.execution_id, found.kind):
                    raise _Taken

            try:
                await self.coordinator.steps.step(found.execution_id, [event], prepare=take)
            except _Taken:
                continue
            recorded += 1
        return recorded
