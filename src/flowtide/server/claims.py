"""Claims: a worker asks for the commands its notifications name, and exactly one worker
gets each.

A batch of claims is one transaction: the command rows are locked in id order, each item
is judged (`judge`, a pure function) against the rows as the items before it left them,
and the writes, the read of the commands' issue times and the commit go in one round
trip. The reply's playbook and context come from the last committed state this process
holds (a `Snapshot`), so a claim does not wait behind its execution's running step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from flowtide.engine.events import Command
from flowtide.errors import ClaimConflict, NotFoundError, WrongPool
from flowtide.ids import Snowflake
from flowtide.server import metrics
from flowtide.server.statecache import Snapshot, StateCache
from flowtide.store import pg
from flowtide.store.pg.commands import ClaimRow
from flowtide.store.pg.events import ClaimedEvent
from flowtide.wire import Claimed, ClaimItem, ExecutionShare

if TYPE_CHECKING:
    from flowtide.store.postgres import PostgresStore

__all__ = ["ClaimBatch", "ClaimConflict", "ClaimItem", "Claims", "Taken", "WrongPool", "judge"]


@dataclass
class ClaimBatch:
    """The reply to `claim_many`: per item, the command's part of the reply or the error
    it got; per execution, what its commands share (playbook, context, cancelled)."""

    results: list[Claimed | Exception] = field(default_factory=list)
    executions: dict[int, ExecutionShare] = field(default_factory=dict)

    def shares_for(self, known: Mapping[int, int]) -> dict[int, ExecutionShare]:
        """`executions` as sent to a worker holding the revisions `known` names: the
        shares it holds with their revision and cancelled flag only."""
        return {
            eid: share.as_held() if known.get(eid) == share.revision else share
            for eid, share in self.executions.items()
        }


@dataclass
class Taken:
    """A claim granted: what the claim transaction read of the command it gave (or gave
    again) to the worker."""

    step: str
    attempt: int
    instance: int | None
    index: int | None
    pool: str
    #: The execution is cancelled or being cancelled (or finalized).
    stopping: bool
    #: The worker held it already (its first claim's answer was lost): a new lease only.
    repeat: bool = False
    #: When the command was issued (its `command.issued` event), for the claim latency.
    issued_at: float | None = None


def judge(
    rows: Mapping[int, ClaimRow],
    items: Sequence[ClaimItem],
    worker_id: str,
    only_pool: str | None,
) -> list[Taken | Exception]:
    """Each item's verdict, in order, as if each came alone after the ones before it
    (a command won by an earlier item is then the worker's): the claim granted, or the
    NotFoundError / WrongPool / ClaimConflict it gets. `rows`: the commands' rows;
    `only_pool`: the worker's pool when it may claim only that pool's commands."""
    rows = dict(rows)
    out: list[Taken | Exception] = []
    for item in items:
        row = rows.get(item.command_id)
        if row is None or row.execution_id != item.execution_id:
            out.append(NotFoundError(f"command {item.command_id} not found"))
            continue
        # Read from the row, not only from a state: another server process may have
        # cancelled the execution since this one last stepped it.
        stopping = row.execution_status == "cancelled" or row.cancel_requested is not None
        taken = Taken(
            row.step,
            row.attempt,
            row.loop_instance,
            row.loop_index,
            row.pool or "default",
            stopping,
        )
        if only_pool is not None and taken.pool != only_pool:
            out.append(
                WrongPool(
                    f"command {item.command_id} is of pool {taken.pool!r}, not the"
                    f" worker's {only_pool!r}"
                )
            )
        elif row.issued_event_id is not None and row.issued_event_id != item.event_id:
            out.append(
                ClaimConflict(
                    f"command {item.command_id}: event {item.event_id} is not its latest issue"
                )
            )
        elif row.status == "claimed" and row.worker_id == worker_id:
            # The same worker again: its first claim went through but the answer was lost
            # (a server restart, a broken connection). Same claim, new lease.
            taken.repeat = True
            out.append(taken)
        elif row.status != "issued":
            holder = row.worker_id
            out.append(
                ClaimConflict(
                    f"command {item.command_id} is {row.status}"
                    + (f" by {holder}" if row.status == "claimed" and holder else ""),
                    holder=holder,
                )
            )
        else:
            rows[item.command_id] = replace(row, status="claimed", worker_id=worker_id)
            out.append(taken)
    return out


def _reply_part(item: ClaimItem, got: Taken, snap: Snapshot, lease: float) -> Claimed:
    """The command's part of a claim's reply: what its worker needs to run it."""
    record = snap.commands.get(item.command_id)
    command = Command(
        command_id=item.command_id,
        execution_id=item.execution_id,
        step=got.step,
        attempt=got.attempt,
        loop_instance=got.instance,
        loop_index=got.index,
        issued_event_id=item.event_id,
        extra={"cursor": True} if record is not None and record.cursor else {},
    )
    part = Claimed(command, lease=lease)
    if got.index is not None and not command.extra:
        loop = snap.loops.get((got.step, got.instance or 0))
        if loop is not None:
            part.iterator = loop.iterator
            part.element = loop.collection[got.index]
            part.size = None if loop.cursor else loop.size  # a cursor's collection grows
            if record is not None and record.pending is not None:
                # A chunk: the iterations it has not reported (all, but for a chunk
                # issued again after its worker reported some and was lost).
                part.chunk = [(i, loop.collection[i]) for i in sorted(record.pending)]
    return part


class Claims:
    """Hands out commands: the claim transaction and the replies."""

    def __init__(
        self, store: PostgresStore, cache: StateCache, ids: Snowflake, *, lease: float
    ) -> None:
        self.store = store
        self.cache = cache
        self.ids = ids
        self.lease = lease

    async def claim_many(
        self, worker_id: str, items: Sequence[ClaimItem], *, pool: str | None = None
    ) -> ClaimBatch:
        """See `Coordinator.claim_many`."""
        now = time.time()
        taken = await asyncio.to_thread(self._take, worker_id, items, now, pool)
        return await self.replies(items, taken, now)

    async def replies(
        self, items: Sequence[ClaimItem], taken: Sequence[Taken | Exception], now: float
    ) -> ClaimBatch:
        """The reply to claims judged and committed at `now` (`taken`: each item's
        verdict), counted in the claim metrics."""
        batch = ClaimBatch()
        snaps: dict[int, Snapshot] = {}
        for item, got in zip(items, taken, strict=True):
            if isinstance(got, Exception):
                batch.results.append(got)
                continue
            if not got.repeat:
                metrics.COMMANDS_CLAIMED.labels(got.pool).inc()
            if got.issued_at is not None:
                metrics.CLAIM_LATENCY.labels(got.pool).observe(max(0.0, now - got.issued_at))
            snap = await self._snapshot(snaps, item)
            batch.results.append(_reply_part(item, got, snap, self.lease))
            shared = batch.executions.get(item.execution_id)
            cancelled = got.stopping or snap.status in ("cancelling", "cancelled")
            if shared is None:
                batch.executions[item.execution_id] = ExecutionShare(
                    snap.playbook.text,
                    snap.playbook.file,
                    snap.parts,
                    cancelled,
                    snap.revision,
                    traceparent=snap.traceparent,
                )
            elif cancelled:
                shared.cancelled = True
        return batch

    async def _snapshot(self, snaps: dict[int, Snapshot], item: ClaimItem) -> Snapshot:
        """The committed state a claim's reply reads: the last one this process holds when
        it already has this issue of the command (the usual case: this process issued
        it), so a claim does not wait behind the execution's running step; otherwise the
        execution is caught up under its lock. Any state at or after the issue is one the
        command may run against. One snapshot per execution per batch."""
        snap = snaps.get(item.execution_id) or self.cache.snapshot(item.execution_id)
        record = snap.commands.get(item.command_id) if snap is not None else None
        if snap is None or record is None or record.issued_event_id != item.event_id:
            async with self.cache.lock(item.execution_id):
                await self.cache.read_locked(item.execution_id)
                snap = self.cache.snapshot(item.execution_id)
                assert snap is not None
        snaps[item.execution_id] = snap
        return snap

    def _take(
        self, worker_id: str, items: Sequence[ClaimItem], now: float, only_pool: str | None
    ) -> list[Taken | Exception]:
        """The claims' transaction (see the module's docstring)."""
        lease_until = now + self.lease
        with self.store.transaction("claim") as conn:
            rows = pg.commands.lock_for_claim(conn, [i.command_id for i in items])
            out = judge(rows, items, worker_id, only_pool)
            granted = [
                (item, got) for item, got in zip(items, out, strict=True) if isinstance(got, Taken)
            ]
            renew = [item.command_id for item, got in granted if got.repeat]
            won = [(item, got) for item, got in granted if not got.repeat]
            events = [
                ClaimedEvent(
                    item.execution_id,
                    self.ids.next_id(),
                    got.step,
                    got.attempt,
                    item.event_id,
                    item.command_id,
                    worker_id,
                    now,
                )
                for item, got in won
            ]
            # The writes, the read of the issue times and the commit in one round trip.
            times = None
            with conn.pipeline():
                if renew:
                    pg.commands.renew_leases(conn, renew, lease_until, now)
                if won:
                    claimed = [item.command_id for item, _ in won]
                    pg.commands.claim(conn, claimed, worker_id, now=now, lease_until=lease_until)
                    pg.events.insert_claimed(conn, events)
                    times = pg.events.issue_times(
                        conn,
                        sorted({e.execution_id for e in events}),
                        [e.parent_event_id for e in events],
                    )
                conn.commit()
            if times is not None:
                issued_at = times.result()
                for item, got in won:
                    got.issued_at = issued_at.get(item.event_id)
            return out
