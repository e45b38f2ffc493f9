"""Command leases: a claimed command is its worker's until the lease runs out.

A worker extends the leases of the commands it works on with its heartbeats
(`extend`). A command whose lease ran out (the worker died, or lost its connection) is
issued again by the next step of its execution (`nudge`, `reissue_events`); the reaper
looks for such executions every few seconds (`expired`). A worker that stops hands its
commands back (`release`): their lease ends at once, at 0. A notification that reached
no live worker is published again after two leases (`renotify`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import ExecutionState
from flowtide.store import pg
from flowtide.store.pg.commands import ExpiredLease

if TYPE_CHECKING:
    from flowtide.store.postgres import PostgresStore

__all__ = ["Leases", "reissue_events"]


def reissue_events(
    expired: list[ExpiredLease], state: ExecutionState, next_id: Callable[[], int], now: float
) -> list[Event]:
    """`command.issued` events issuing again the commands of `expired` (their next
    attempt); commands the state does not know are left alone."""
    out: list[Event] = []
    for command_id, lease_until in expired:
        record = state.commands.get(command_id)
        if record is None:
            continue
        payload: ev.CommandIssuedPayload = {
            "command_id": command_id,
            "attempt": record.attempt + 1,
            "reissued": True,
            # `release` ends a lease at 0: the worker handed the command back.
            "reason": "released by its worker" if not lease_until else "lease expired",
        }
        if record.loop_instance is not None:
            payload["loop_instance"] = record.loop_instance
        if record.loop_index is not None:
            payload["loop_index"] = record.loop_index
        if record.pending is not None:
            # A chunk: issued again for the iterations it has not reported.
            payload["loop_count"] = record.count
        if record.cursor:
            payload["cursor"] = True
        out.append(
            Event(
                event_id=next_id(),
                execution_id=state.execution_id,
                type=ev.COMMAND_ISSUED,
                step=record.step,
                status="issued",
                payload=payload,
                command_id=command_id,
                time=now,
            )
        )
    return out


class Leases:
    """The lease transactions (each its own, in a worker thread)."""

    def __init__(self, store: PostgresStore, *, lease: float) -> None:
        self.store = store
        self.lease = lease

    async def holds(self, worker_id: str, execution_id: int, command_id: int) -> bool:
        """Whether `worker_id` holds a live claim (lease not expired) on the command."""

        def read() -> bool:
            with self.store.transaction("command holder") as conn:
                return pg.commands.holds_live_claim(
                    conn, execution_id, command_id, worker_id, time.time()
                )

        return await asyncio.to_thread(read)

    async def extend(self, worker_id: str, command_ids: list[int] | None) -> int:
        """Extend the leases `worker_id` holds: those of `command_ids`, or all (None)."""
        lease_until = time.time() + self.lease

        def extend() -> int:
            with self.store.transaction("heartbeat") as conn:
                return pg.commands.extend_leases(conn, worker_id, lease_until, command_ids)

        return await asyncio.to_thread(extend)

    async def release(self, worker_id: str, command_ids: list[int]) -> list[int]:
        """End the leases `worker_id` holds of `command_ids` now; the execution of each
        command released."""
        if not command_ids:
            return []

        def expire() -> list[int]:
            with self.store.transaction("release") as conn:
                return pg.commands.end_leases(conn, worker_id, command_ids)

        return await asyncio.to_thread(expire)

    async def expired(self, limit: int) -> list[int]:
        """Up to `limit` executions with a command whose lease ran out."""

        def read() -> list[int]:
            with self.store.transaction("reap") as conn:
                return pg.commands.executions_with_expired_leases(conn, time.time(), limit)

        return await asyncio.to_thread(read)

    async def renotify(self) -> int:
        """Publish again the notification of commands nobody claimed for two leases (it
        went to a worker that died before claiming; a duplicate only loses a claim)."""

        def write() -> int:
            cutoff = time.time() - 2 * self.lease
            with self.store.transaction("renotify") as conn:
                return pg.outbox.renotify(conn, now=time.time(), before=cutoff)

        return await asyncio.to_thread(write)
