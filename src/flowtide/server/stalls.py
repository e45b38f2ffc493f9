"""A server's watch over its shard's stalled executions: `running`, with no command
issued or claimed, nothing in the outbox, and no event for `stalled_after` seconds.
Nothing will ever wake such a run (NoETL's production had thousands: "a start and no
end", the oldest 160 days old). Each is re-driven once: a step with nothing new, which
issues again what a lost lease left behind and lets the engine act on what it holds. A
run that still has nothing in flight afterwards is failed with `error.kind: stalled`,
through the engine (`execution.stalled`), so its end, notifications and summary are
those of any failed run. A run is failed once, never re-driven in a loop: the step that
records the stall holds its lock and looks again under it; the next scan no longer
finds it (not running)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Final

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.server import metrics
from flowtide.server.coordinator import Coordinator
from flowtide.store import pg

if TYPE_CHECKING:
    import psycopg

__all__ = ["StallWatch"]

log = logging.getLogger("flowtide.server")

#: Seconds between two scans.
SCAN_INTERVAL: Final = 30.0


class _Moving(Exception):
    """The re-drive (or a worker) gave the run something to do: not stalled."""


class StallWatch:
    """Fails the coordinator's shard's stalled executions (`run`; `sweep` once)."""

    def __init__(self, coordinator: Coordinator, stalled_after: float) -> None:
        self.coordinator = coordinator
        self.stalled_after = stalled_after

    async def run(self) -> None:
        while True:
            await asyncio.sleep(min(SCAN_INTERVAL, self.stalled_after))
            try:
                await self.sweep(time.time())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep watching
                log.warning("stalled executions: %s", exc)

    async def sweep(self, now: float) -> list[int]:
        """Re-drive, then fail, the executions idle since before `now - stalled_after`;
        the ids failed."""
        store = self.coordinator.store
        before = now - self.stalled_after

        def idle() -> list[pg.executions.Idle]:
            with store.transaction("stalled executions") as conn:
                return pg.executions.idle_executions(conn, before)

        failed: list[int] = []
        for found in await asyncio.to_thread(idle):
            eid = found.execution_id
            steps = self.coordinator.steps
            # The re-drive: catch up, issue again what an expired lease left behind.
            await steps.step(eid, [], reissue=True)
            metrics.EXECUTIONS_REDRIVEN.inc()
            payload: ev.StalledPayload = {"idle": round(now - found.last, 3), "since": found.last}
            event = Event(
                event_id=self.coordinator.ids.next_id(),
                execution_id=eid,
                type=ev.EXECUTION_STALLED,
                status="failed",
                payload=payload,
                time=time.time(),
            )

            def still_idle(conn: psycopg.Connection, eid: int = eid) -> None:
                # Under the row lock: another server's step is either seen or waits.
                if pg.executions.lock(conn, eid).result() != "running":
                    raise _Moving
                if pg.executions.in_flight(conn, eid):
                    raise _Moving

            try:
                result = await steps.step(eid, [event], prepare=still_idle)
            except _Moving:
                log.info("execution %s: re-driven, it goes on", eid)
                continue
            if result.status == "failed":
                metrics.EXECUTIONS_STALLED.inc()
                log.warning(
                    "execution %s: stalled (nothing in flight for %.0f s): failed",
                    eid,
                    now - found.last,
                )
                failed.append(eid)
        return failed
