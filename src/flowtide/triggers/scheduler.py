"""The scheduler: fires due schedules, in every long-running flowtide process.

One `Scheduler` runs in `flowtide scheduler` and `flowtide ui` (embedded, against the
local store) and in every server (each one firing the schedules its shard owns). It plans
each schedule with `triggers.plan` from the state the store keeps (the watermark, the
runs still going, the buffered slots) and carries the plan out through its `Firer`:

* a slot that fires starts its run with a `Firing` keyed by the slot, recorded in the
  transaction that creates the execution: a second server racing for the same slot, or a
  restarted one planning it again, finds the key and starts nothing (`AlreadyFired`);
* skipped and buffered slots are recorded the same way (once each), then the watermark
  moves past everything decided.

A buffered slot starts when the schedule's running run has ended (`plan.release`).
The clock is injected (`now`), and `tick` does one round, so tests drive it by hand.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol
from zoneinfo import ZoneInfo

from flowtide.errors import AlreadyFired, FlowtideError
from flowtide.store.triggers import Firing, TriggerRow, TriggerState
from flowtide.triggers.plan import Buffer, Cancel, Fire, Skip, backfill, plan, release
from flowtide.triggers.schedules import notify_targets
from flowtide.triggers.spec import ScheduleSpec, spec_from_json
from flowtide.triggers.targets import TriggeredRun, load_target, render_workload

if TYPE_CHECKING:
    from flowtide.playbook.model import Playbook
    from flowtide.store.base import Store

__all__ = ["Firer", "Scheduler", "fire_now", "run_backfill", "slot_key", "schedule_context"]

log = logging.getLogger("flowtide.scheduler")

#: How often the definitions are read again (a schedule added on another server starts
#: firing within this), and the longest sleep between two rounds.
REFRESH_SECONDS = 2.0
#: At most this many schedules fire at once (a minute's 1,000 schedules fire together):
#: their runs are created in batches (`_Batched`).
CONCURRENT_STARTS = 2048
#: A batch of runs to create goes when it has this many, or this long after its first.
BATCH_SIZE = 64
BATCH_WAIT = 0.005


class Firer(Protocol):
    """What the scheduler needs of the process it runs in."""

    @property
    def store(self) -> Store:
        """The store: definitions (cluster part), firings and executions (shard part)."""
        ...

    def owns(self, trigger_id: int) -> bool:
        """Whether this process fires the trigger (a server: its shard owns it)."""
        ...

    async def start(
        self,
        playbook: Playbook,
        *,
        workload: dict[str, Any],
        version: int | None,
        firing: Firing,
        notify: Sequence[dict[str, Any]] = (),
    ) -> int:
        """Create and start the run, recording `firing` with it (AlreadyFired: it fired
        before); `notify` (`NotifyTarget.to_json`s) adds to the playbook's `notify:`."""
        ...

    async def cancel(self, execution_id: int, reason: str) -> None:
        """Cancel a run (overlap policy cancel_other)."""
        ...

    # Optional: `start_many(runs: Sequence[TriggeredRun]) -> list[int | FlowtideError]`,
    # `start` for several runs at once (a server creates them in one transaction), in the
    # place of each its id or why it did not start. Without it runs start one by one.


class _Batched:
    """A `Firer` whose `start`s made close together (within `BATCH_WAIT`) go to the
    firer's `start_many` together, at most `BATCH_SIZE` at a time: a minute's thousand
    schedules are created in a few transactions, not a thousand."""

    def __init__(self, firer: Firer) -> None:
        self.firer = firer
        self._pending: list[tuple[TriggeredRun, asyncio.Future[int]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> Store:
        return self.firer.store

    def owns(self, trigger_id: int) -> bool:
        return self.firer.owns(trigger_id)

    async def cancel(self, execution_id: int, reason: str) -> None:
        await self.firer.cancel(execution_id, reason)

    async def start(
        self,
        playbook: Playbook,
        *,
        workload: dict[str, Any],
        version: int | None,
        firing: Firing,
        notify: Sequence[dict[str, Any]] = (),
    ) -> int:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._pending.append((TriggeredRun(playbook, workload, version, firing, notify), done))
        if len(self._pending) >= BATCH_SIZE:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(BATCH_WAIT, self._flush)
        return await done

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.create_task(self._start(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _start_many(self, runs: list[TriggeredRun]) -> Sequence[int | BaseException]:
        batched = getattr(self.firer, "start_many", None)
        if batched is not None:
            found: list[int | FlowtideError] = await batched(runs)
            return found
        return await asyncio.gather(*(self._one(run) for run in runs), return_exceptions=True)

    async def _one(self, run: TriggeredRun) -> int:
        assert run.firing is not None  # a trigger's run has one
        if run.notify:
            return await self.firer.start(
                run.playbook,
                workload=run.workload,
                version=run.catalog_version,
                firing=run.firing,
                notify=run.notify,
            )
        return await self.firer.start(
            run.playbook, workload=run.workload, version=run.catalog_version, firing=run.firing
        )

    async def _start(self, batch: list[tuple[TriggeredRun, asyncio.Future[int]]]) -> None:
        try:
            outcomes = await self._start_many([run for run, _ in batch])
        except Exception as exc:  # noqa: BLE001 - each waiting firing gets the error
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc)
            return
        for (_, done), outcome in zip(batch, outcomes, strict=True):
            if done.done():
                continue
            if isinstance(outcome, BaseException):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)


def slot_key(slot: float) -> str:
    """A slot's key: its UTC time in ISO 8601 (`2026-03-29T01:00:00Z`; milliseconds when
    the slot has them)."""
    at = datetime.datetime.fromtimestamp(slot, datetime.UTC)
    spec = "milliseconds" if at.microsecond else "seconds"
    return at.isoformat(timespec=spec).replace("+00:00", "Z")


def schedule_context(spec: ScheduleSpec, slot: float, *, now: float, key: str) -> dict[str, Any]:
    """What a schedule's workload templates see: `schedule.name`, `schedule.slot` (the
    key), `schedule.time` (the slot in the schedule's zone, ISO 8601), `schedule.timestamp`
    (Unix seconds) and `schedule.fired` (when it fired, UTC ISO 8601)."""
    zone = getattr(spec.when, "timezone", "UTC")
    local = datetime.datetime.fromtimestamp(slot, ZoneInfo(zone))
    return {
        "schedule": {
            "name": spec.name,
            "slot": key,
            "time": local.isoformat(),
            "timestamp": slot,
            "fired": slot_key(now),
        }
    }


class _Targets:
    """The playbooks one round starts, each read (and parsed) once however many of its
    schedules fire in the round: a thousand schedules of one playbook due at one instant
    cost one catalog read, not a thousand."""

    def __init__(self) -> None:
        self._found: dict[tuple[Any, ...], asyncio.Future[tuple[Playbook, int | None]]] = {}

    async def get(self, store: Store, ref: dict[str, Any]) -> tuple[Playbook, int | None]:
        key = tuple(sorted(ref.items()))
        found = self._found.get(key)
        if found is None:
            found = asyncio.ensure_future(asyncio.to_thread(load_target, store, ref))
            self._found[key] = found
        return await asyncio.shield(found)


@dataclass
class _Known:
    """What the scheduler remembers of one schedule between rounds."""

    row: TriggerRow
    spec: ScheduleSpec
    #: Plan again at this time at the latest (0: at the next round).
    wake: float = 0.0
    #: The watermark this scheduler last wrote (the store's may be ahead: another
    #: server's; never behind, so a round needs no read of it when nothing moved).
    mark: float = 0.0


@dataclass
class Scheduler:
    """Fires the due schedules that `firer` owns (see the module docstring)."""

    firer: Firer
    clock: Callable[[], float] = time.time
    #: Called with (name, error) when a schedule cannot fire (logged besides).
    on_error: Callable[[str, BaseException], None] | None = None
    _known: dict[int, _Known] = field(default_factory=dict)
    _loaded: float = float("-inf")
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    #: Runs started by this scheduler (count), for status lines and tests.
    started: int = 0
    _targets: _Targets | None = None
    _batched: _Batched = field(init=False)

    def __post_init__(self) -> None:
        self._batched = _Batched(self.firer)

    async def run(self) -> None:
        """Round after round until `stop`."""
        while not self._stop.is_set():
            try:
                wake = await self.tick()
            except Exception:  # noqa: BLE001 - the scheduler outlives a failing round
                log.exception("scheduler round failed")
                wake = self.clock() + 1.0
            delay = min(max(wake - self.clock(), 0.02), REFRESH_SECONDS)
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()

    def changed(self) -> None:
        """Read the definitions again at the next round (one was added or changed here)."""
        self._loaded = float("-inf")

    async def tick(self) -> float:
        """One round: fire what is due now. Returns when the next round is due."""
        now = self.clock()
        if now - self._loaded >= REFRESH_SECONDS:
            await self._load(now)
        due = [k for k in self._known.values() if k.wake <= now and not k.row.paused]
        if due:
            # One read of every due schedule's state (not three per schedule).
            ids = [k.row.trigger_id for k in due]
            needs_runs = any(k.spec.overlap != "allow" for k in due)
            states = await asyncio.to_thread(
                self.firer.store.trigger_states, ids, running=needs_runs
            )
            # The earliest due first: with many due at once, the oldest slots wait least.
            due.sort(key=lambda k: k.wake)
            gate = asyncio.Semaphore(CONCURRENT_STARTS)
            self._targets = _Targets()

            async def one(known: _Known) -> None:
                async with gate:
                    await self._round(known, now, states[known.row.trigger_id])

            await asyncio.gather(*(one(k) for k in due))
        wakes = [k.wake for k in self._known.values() if not k.row.paused]
        return min([*wakes, now + REFRESH_SECONDS])

    async def _load(self, now: float) -> None:
        rows = await asyncio.to_thread(self.firer.store.list_triggers, "schedule")
        known: dict[int, _Known] = {}
        for row in rows:
            if not self.firer.owns(row.trigger_id):
                continue
            before = self._known.get(row.trigger_id)
            if before is not None and before.row.updated == row.updated:
                known[row.trigger_id] = before
                continue
            try:
                # The row says whether it is paused now (pause/resume change the row).
                spec = replace(spec_from_json(row.spec), paused=row.paused)
            except FlowtideError as exc:
                self._report(row.name, exc)
                continue
            known[row.trigger_id] = _Known(row, spec)
        self._known = known
        self._loaded = now

    async def _round(self, known: _Known, now: float, state: TriggerState) -> None:
        row, spec = known.row, known.spec
        try:
            floor = max(row.created, row.resumed or 0.0)
            watermark = max(state.watermark or floor, floor, known.mark)
            running, buffered = state.running, [s for _, s in state.buffered]
            if buffered and not running:
                first = release(spec, running=running, buffered=buffered)
                if first is not None:
                    await self._fire(known, first.slot, now, watermark=None)
                    known.wake = 0.0
                    return
            decided = plan(spec, after=watermark, now=now, running=running, buffered=buffered)
            if decided.decisions or decided.watermark > watermark:
                await self._carry_out(known, decided.decisions, now, decided.watermark)
                known.mark = decided.watermark
            known.wake = decided.wake
            if running or buffered:
                # A run's end releases a buffered slot (or lets the next one fire): look
                # again soon rather than at the next slot only.
                known.wake = min(known.wake, now + 1.0)
        except Exception as exc:  # noqa: BLE001 - one schedule's failure is its own
            self._report(row.name, exc)
            known.wake = now + 5.0

    async def _carry_out(
        self, known: _Known, decisions: Sequence[Any], now: float, watermark: float
    ) -> None:
        row, store = known.row, self.firer.store
        quiet: list[Firing] = []
        for decision in decisions:
            if isinstance(decision, Fire):
                if quiet:
                    await asyncio.to_thread(store.record_firings, quiet, now=now)
                    quiet = []
                await self._fire(known, decision.slot, now, watermark=decision.slot)
            elif isinstance(decision, Skip | Buffer):
                status = "skipped" if isinstance(decision, Skip) else "buffered"
                reason = _reason(decision) if isinstance(decision, Skip) else None
                quiet.append(
                    Firing(
                        trigger_id=row.trigger_id,
                        kind="schedule",
                        name=row.name,
                        key=slot_key(decision.slot),
                        slot=decision.slot,
                        status=status,
                        reason=reason,
                        watermark=decision.slot,
                    )
                )
            elif isinstance(decision, Cancel):
                for execution_id in decision.execution_ids:
                    await self.firer.cancel(
                        execution_id, f"schedule {row.name!r}: overlap policy cancel_other"
                    )
        if quiet:
            await asyncio.to_thread(store.record_firings, quiet, now=now)
        last = decisions[-1] if decisions else None
        if not (isinstance(last, Fire | Skip | Buffer) and last.slot >= watermark):
            # (A recorded firing moved it in its own transaction already.)
            await asyncio.to_thread(store.move_watermark, row.trigger_id, watermark, now=now)

    async def _fire(
        self, known: _Known, slot: float, now: float, *, watermark: float | None
    ) -> int | None:
        key = slot_key(slot)
        firing = Firing(
            trigger_id=known.row.trigger_id,
            kind="schedule",
            name=known.row.name,
            key=key,
            slot=slot,
            watermark=watermark,
        )
        try:
            execution_id = await start_for(
                self._batched,
                known.spec,
                firing,
                schedule_context(known.spec, slot, now=now, key=key),
                self._targets,
            )
        except AlreadyFired:
            return None
        self.started += 1
        log.info("schedule %s: slot %s started execution %s", known.row.name, key, execution_id)
        return execution_id

    def _report(self, name: str, exc: BaseException) -> None:
        log.warning("schedule %s: %s", name, exc)
        if self.on_error is not None:
            self.on_error(name, exc)


def _reason(skip: Skip) -> str:
    """A skipped firing's reason; a run of missed slots is one firing (its latest slot)."""
    return f"{skip.reason} ({skip.count} slots)" if skip.count > 1 else skip.reason


def _state_of(store: Store, row: TriggerRow) -> tuple[float, list[int], list[tuple[str, float]]]:
    """The schedule's watermark (never before its creation or its last resume), its runs
    still going and its buffered slots."""
    floor = max(row.created, row.resumed or 0.0)
    watermark = store.trigger_watermark(row.trigger_id)
    return (
        max(watermark if watermark is not None else floor, floor),
        store.trigger_running(row.trigger_id),
        store.trigger_buffered(row.trigger_id),
    )


async def start_for(
    firer: Firer,
    spec: ScheduleSpec,
    firing: Firing,
    context: dict[str, Any],
    targets: _Targets | None = None,
) -> int:
    """Start the schedule's playbook for `firing` with its workload rendered over
    `context` (the playbook from `targets`, a round's cache, when given). Raises
    AlreadyFired, NotFoundError, PlaybookError, TemplateError."""
    ref = {"path": spec.playbook, "version": spec.version}
    if spec.playbook.startswith("/"):
        ref = {"file": spec.playbook}
    if targets is not None:
        playbook, version = await targets.get(firer.store, ref)
    else:
        playbook, version = await asyncio.to_thread(load_target, firer.store, ref)
    workload = render_workload(dict(spec.workload), context)
    notify = notify_targets(spec)
    if notify:
        return await firer.start(
            playbook, workload=workload, version=version, firing=firing, notify=notify
        )
    return await firer.start(playbook, workload=workload, version=version, firing=firing)


async def fire_now(firer: Firer, row: TriggerRow, *, now: float, key: str) -> int:
    """`schedule trigger NAME`: one run now, whatever the schedule's state and policy,
    keyed `key` (a manual firing's own id)."""
    spec = spec_from_json(row.spec)
    firing = Firing(trigger_id=row.trigger_id, kind="schedule", name=row.name, key=key, slot=now)
    return await start_for(firer, spec, firing, schedule_context(spec, now, now=now, key=key))


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill did: runs started (slot key -> execution id), slots buffered and
    skipped, and slots that had fired before (nothing done)."""

    started: dict[str, int]
    buffered: list[str]
    skipped: list[str]
    already: list[str]


async def run_backfill(
    firer: Firer,
    row: TriggerRow,
    *,
    start: float,
    end: float,
    now: float,
    limit: int = 1000,
    on_progress: Callable[[int, int], Awaitable[None] | None] | None = None,
) -> BackfillResult:
    """Every slot of the schedule in [start, end], by its overlap policy (catchup does not
    apply), at most `limit` slots (TriggerError beyond). Slots that fired before are left
    alone; skipped ones may run now."""
    spec = spec_from_json(row.spec)
    store = firer.store
    _, running, buffered = await asyncio.to_thread(_state_of, store, row)
    decisions = backfill(
        spec,
        start=start,
        end=end,
        running=running,
        buffered=[s for _, s in buffered],
        limit=limit,
    )
    started: dict[str, int] = {}
    done: dict[str, list[str]] = {"buffered": [], "skipped": [], "already": []}
    total = len(decisions)
    for index, decision in enumerate(decisions):
        if isinstance(decision, Fire):
            key = slot_key(decision.slot)
            firing = Firing(
                trigger_id=row.trigger_id,
                kind="schedule",
                name=row.name,
                key=key,
                slot=decision.slot,
            )
            context = schedule_context(spec, decision.slot, now=now, key=key)
            try:
                started[key] = await start_for(firer, spec, firing, context)
            except AlreadyFired:
                done["already"].append(key)
        elif isinstance(decision, Skip | Buffer):
            status = "skipped" if isinstance(decision, Skip) else "buffered"
            key = slot_key(decision.slot)
            firing = Firing(
                trigger_id=row.trigger_id,
                kind="schedule",
                name=row.name,
                key=key,
                slot=decision.slot,
                status=status,
                reason=_reason(decision) if isinstance(decision, Skip) else None,
            )
            new = await asyncio.to_thread(store.record_firings, [firing], now=now)
            done[status if new else "already"].append(key)
        elif isinstance(decision, Cancel):
            for execution_id in decision.execution_ids:
                await firer.cancel(execution_id, f"schedule {row.name!r}: backfill, cancel_other")
        if on_progress is not None:
            result = on_progress(index + 1, total)
            if asyncio.iscoroutine(result):
                await result
    return BackfillResult(started, done["buffered"], done["skipped"], done["already"])
