"""Listeners: each subscription's messages start runs, in every long-running flowtide
process (`flowtide scheduler` and `flowtide ui` embedded; every server for the
subscriptions its shard owns, the servers of a shard sharing one durable consumer).

**Each message starts exactly one run.** A message's run is created with a `Firing`
keyed by the message (`Delivery.key`: `<stream>:<sequence>` for JetStream) in the
transaction that creates the execution, and the message is acked only after that
transaction committed. A redelivery (the listener died before its ack, or a slow one's
ack wait ran out and another server got it) finds the key (`AlreadyFired`) and is just
acked. A run that cannot start (a missing or invalid playbook, a workload template that
does not render) is recorded as a `failed` firing with the reason and the message is
delivered again after a backoff (`nak`), at most `max_deliver` times, then dropped
(`term`); a later delivery that starts its run takes the record over.

**Batches** (`batch: {size, max_wait}`): one run for up to `size` messages (fewer when
`max_wait` passes after the first), workload `messages: [...]`. The batch's firing is
keyed `<stream>:<first>-<last>` (its lowest and highest sequence) and each of its
messages is recorded with it (status `batched`, same transaction). The rule: a message
that fired before, alone or in any batch, refuses the whole batch; the listener then
acks the messages that fired and starts the rest as a batch of their own. So however a
redelivery regroups messages, none starts two runs.

**Rate** (`rate: N/s`): the fetch is paced (`Pacer`): no more messages are taken from
the source than the rate allows, so the rest wait in the stream, not in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flowtide.errors import (
    AlreadyFired,
    FlowtideError,
    NotFoundError,
    PlaybookError,
    TemplateError,
    TriggerError,
)
from flowtide.store.triggers import Firing, TriggerRow
from flowtide.triggers.source import Delivery, Source
from flowtide.triggers.sources import open_source
from flowtide.triggers.subscription import SubscriptionSpec, subscription_from_json
from flowtide.triggers.targets import load_target, render_workload

if TYPE_CHECKING:
    from flowtide.playbook.model import Playbook
    from flowtide.triggers.scheduler import Firer

__all__ = ["Listener", "Listeners", "Pacer", "batch_key", "nak_delay"]

log = logging.getLogger("flowtide.subscriptions")

#: How often the definitions are read again (one added on another server starts
#: listening within this).
REFRESH_SECONDS = 2.0
#: Messages taken from the source at once, and runs started at once, per subscription.
CHUNK = 64
CONCURRENT_STARTS = 16
#: How long a fetch waits for a first message (then the listener looks at its stop flag).
POLL_SECONDS = 1.0
#: The playbook a listener starts is read again after this (a new catalog version).
PLAYBOOK_TTL = 2.0
#: What a run that cannot start is (the message is refused, not the listener).
REFUSALS = (PlaybookError, TemplateError, NotFoundError, TriggerError)


def nak_delay(attempt: int) -> float:
    """Seconds before a message whose run could not start is delivered again: 1 s, 2 s,
    4 s... at most a minute."""
    return float(min(2 ** max(attempt - 1, 0), 60))


def batch_key(deliveries: Sequence[Delivery]) -> str:
    """A batch's firing key: `<stream>:<first>-<last>` for JetStream messages (their
    lowest and highest stream sequence), else `<first key>..<last key>`."""
    keys = [d.key for d in deliveries]
    seqs = [d.message.get("seq") for d in deliveries]
    streams = {k.rpartition(":")[0] for k in keys}
    if all(isinstance(s, int) for s in seqs) and len(streams) == 1:
        numbers = [int(s) for s in seqs if s is not None]
        return f"{streams.pop()}:{min(numbers)}-{max(numbers)}"
    return f"{keys[0]}..{keys[-1]}"


@dataclass
class Pacer:
    """A token bucket of `rate` messages per second holding at most `burst` (time passed
    in): how many messages may be taken now, and how long until the next one may."""

    rate: float
    burst: float = 0.0
    tokens: float = -1.0
    at: float | None = None

    def __post_init__(self) -> None:
        if self.burst <= 0:
            self.burst = max(1.0, self.rate)
        if self.tokens < 0:
            self.tokens = self.burst

    def _fill(self, now: float) -> None:
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + max(now - self.at, 0.0) * self.rate)
        self.at = now

    def allowance(self, now: float) -> int:
        """Messages that may be taken now."""
        self._fill(now)
        return int(self.tokens)

    def wait(self, now: float) -> float:
        """Seconds until one message may be taken."""
        self._fill(now)
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def take(self, count: int, now: float) -> None:
        self._fill(now)
        self.tokens -= count


@dataclass
class Listener:
    """One subscription's listener (see the module docstring)."""

    row: TriggerRow
    spec: SubscriptionSpec
    firer: Firer
    credentials: Callable[[str], dict[str, Any]]
    clock: Callable[[], float] = time.time
    #: Called with (name, error) when the source fails or a run cannot start.
    on_error: Callable[[str, BaseException], None] | None = None
    started: int = 0
    acked: int = 0
    refused: int = 0
    connected: bool = False
    error: str | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _playbook: tuple[float, Playbook, int | None] | None = None

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict[str, Any]:
        """What the process knows of its listener (API documents, status lines)."""
        return {
            "connected": self.connected,
            "started": self.started,
            "acked": self.acked,
            "refused": self.refused,
            "error": self.error,
        }

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), max(seconds, 0.0))

    async def run(self) -> None:
        """Connect, consume until `stop`; reconnect after a failure (backing off)."""
        failures = 0
        while not self._stop.is_set():
            source: Source | None = None
            try:
                source = open_source(self.spec, self.credentials)
                await source.open()
                self.connected, self.error, failures = True, None, 0
                log.info("subscription %s: listening", self.row.name)
                await self.consume(source)
            except FlowtideError as exc:
                failures += 1
                self._report(exc)
            except Exception as exc:  # noqa: BLE001 - a listener outlives its failures
                failures += 1
                log.exception("subscription %s: listener failed", self.row.name)
                self._report(exc)
            finally:
                self.connected = False
                if source is not None:
                    with contextlib.suppress(Exception):
                        await source.close()
            if not self._stop.is_set():
                await self._sleep(min(2.0**failures, 30.0))

    async def consume(self, source: Source) -> None:
        """Take messages from an opened source and start their runs until `stop`."""
        spec = self.spec
        pacer = Pacer(spec.rate) if spec.rate else None
        gate = asyncio.Semaphore(CONCURRENT_STARTS)

        async def one(delivery: Delivery) -> None:
            async with gate:
                await self.start_one(delivery)

        while not self._stop.is_set():
            limit = spec.batch.size if spec.batch else CHUNK
            if pacer is not None:
                allowed = pacer.allowance(self.clock())
                if allowed < 1:
                    await self._sleep(pacer.wait(self.clock()))
                    continue
                limit = min(limit, allowed)
            if spec.batch is not None:
                deliveries = await self._gather(source, limit, spec.batch.max_wait)
            else:
                deliveries = await source.fetch(limit, POLL_SECONDS)
            if not deliveries:
                continue
            if pacer is not None:
                pacer.take(len(deliveries), self.clock())
            if spec.batch is not None:
                await self.start_batch(deliveries)
            else:
                await asyncio.gather(*(one(d) for d in deliveries))

    async def _gather(self, source: Source, size: int, max_wait: float) -> list[Delivery]:
        got: list[Delivery] = []
        deadline = 0.0
        while len(got) < size and not self._stop.is_set():
            timeout = POLL_SECONDS if not got else deadline - self.clock()
            if got and timeout <= 0:
                break
            more = await source.fetch(size - len(got), timeout)
            if more and not got:
                deadline = self.clock() + max_wait
            got += more
            if not got:
                break
        return got

    # -- starting runs ---------------------------------------------------------------

    async def _target(self) -> tuple[Playbook, int | None]:
        now = self.clock()
        if self._playbook is None or now - self._playbook[0] > PLAYBOOK_TTL:
            ref: dict[str, Any] = {"path": self.spec.playbook, "version": self.spec.version}
            if self.spec.playbook.startswith("/"):
                ref = {"file": self.spec.playbook}
            playbook, version = await asyncio.to_thread(load_target, self.firer.store, ref)
            self._playbook = (now, playbook, version)
        return self._playbook[1], self._playbook[2]

    async def _start(self, firing: Firing, context: dict[str, Any]) -> int:
        playbook, version = await self._target()
        if self.spec.workload:
            workload = render_workload(dict(self.spec.workload), context)
        else:
            workload = {k: v for k, v in context.items() if k in ("message", "messages")}
        return await self.firer.start(playbook, workload=workload, version=version, firing=firing)

    def _firing(self, key: str, members: tuple[str, ...] = ()) -> Firing:
        return Firing(
            trigger_id=self.row.trigger_id,
            kind="subscription",
            name=self.row.name,
            key=key,
            slot=self.clock(),
            members=members,
        )

    async def start_one(self, delivery: Delivery) -> None:
        """Start the message's run, then ack it (see the module docstring)."""
        context = {"message": delivery.message, "subscription": {"name": self.row.name}}
        try:
            execution_id = await self._start(self._firing(delivery.key), context)
        except AlreadyFired:
            await delivery.ack()
            self.acked += 1
            return
        except REFUSALS as exc:
            await self._refuse([delivery], exc)
            return
        except Exception as exc:  # noqa: BLE001 - the store may be down: try again later
            self._report(exc)
            await delivery.nak(nak_delay(delivery.attempt))
            return
        await delivery.ack()
        self.started += 1
        self.acked += 1
        log.debug("subscription %s: %s started %s", self.row.name, delivery.key, execution_id)

    async def start_batch(self, deliveries: Sequence[Delivery]) -> None:
        """Start one run for the batch (its messages that fired before acked, not
        started again), then ack them (see the module docstring)."""
        pending = sorted(deliveries, key=lambda d: (d.message.get("seq") or 0, d.key))
        for _ in range(len(pending) + 1):
            if not pending:
                return
            key = batch_key(pending)
            members = tuple(d.key for d in pending)
            context = {
                "messages": [d.message for d in pending],
                "subscription": {"name": self.row.name, "batch": key},
            }
            try:
                await self._start(self._firing(key, members), context)
            except AlreadyFired as exc:
                fired = await asyncio.to_thread(self._fired, members)
                if not fired:
                    fired = set(members) if exc.key == key else {exc.key}
                for d in pending:
                    if d.key in fired:
                        await d.ack()
                        self.acked += 1
                pending = [d for d in pending if d.key not in fired]
                continue
            except REFUSALS as exc:
                await self._refuse(pending, exc)
                return
            except Exception as exc:  # noqa: BLE001 - the store may be down: try again later
                self._report(exc)
                for d in pending:
                    await d.nak(nak_delay(d.attempt))
                return
            for d in pending:
                await d.ack()
            self.started += 1
            self.acked += len(pending)
            return

    def _fired(self, keys: Sequence[str]) -> set[str]:
        store = self.firer.store
        out = set()
        for key in keys:
            row = store.firing(self.row.trigger_id, key)
            if row is not None and row.status in ("started", "batched"):
                out.add(key)
        return out

    async def _refuse(self, deliveries: Sequence[Delivery], exc: BaseException) -> None:
        """The run cannot start: record why, deliver again later (or never)."""
        self._report(exc)
        self.refused += len(deliveries)
        now = self.clock()
        failed = [
            Firing(
                trigger_id=self.row.trigger_id,
                kind="subscription",
                name=self.row.name,
                key=d.key,
                slot=now,
                status="failed",
                reason=f"delivery {d.attempt}: {exc}"[:2000],
            )
            for d in deliveries
        ]
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.firer.store.record_firings, failed, now=now)
        for d in deliveries:
            if d.attempt >= self.spec.max_deliver:
                await d.term()
            else:
                await d.nak(nak_delay(d.attempt))

    def _report(self, exc: BaseException) -> None:
        self.error = str(exc)[:2000]
        log.warning("subscription %s: %s", self.row.name, exc)
        if self.on_error is not None:
            self.on_error(self.row.name, exc)


@dataclass
class _Running:
    listener: Listener
    task: asyncio.Task[None]
    updated: float


@dataclass
class Listeners:
    """A listener for each subscription that `firer` owns and that is not paused; the
    definitions are read again every few seconds (or at once after `changed`)."""

    firer: Firer
    credentials: Callable[[str], dict[str, Any]]
    clock: Callable[[], float] = time.time
    on_error: Callable[[str, BaseException], None] | None = None
    running: dict[int, _Running] = field(default_factory=dict)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        """Keep the listeners in line with the definitions until `stop`."""
        try:
            while not self._stop.is_set():
                try:
                    await self.refresh()
                except Exception:  # noqa: BLE001 - the next round tries again
                    log.exception("subscriptions: reading the definitions failed")
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), REFRESH_SECONDS)
        finally:
            await self._stop_all(list(self.running))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def changed(self) -> None:
        """Read the definitions again now (one was added or changed here)."""
        self._wake.set()

    @property
    def started(self) -> int:
        return sum(r.listener.started for r in self.running.values())

    def status(self, trigger_id: int) -> dict[str, Any] | None:
        """The state of this process's listener of the subscription (None: it runs none)."""
        running = self.running.get(trigger_id)
        return None if running is None else running.listener.status()

    async def refresh(self) -> None:
        """Start the listeners of new (or changed, or resumed) subscriptions, stop those
        of deleted, changed or paused ones."""
        rows = await asyncio.to_thread(self.firer.store.list_triggers, "subscription")
        wanted = {r.trigger_id: r for r in rows if not r.paused and self.firer.owns(r.trigger_id)}
        gone = [
            tid
            for tid, run in self.running.items()
            if tid not in wanted or wanted[tid].updated != run.updated or run.task.done()
        ]
        await self._stop_all(gone)
        for tid, row in wanted.items():
            if tid in self.running:
                continue
            try:
                spec = subscription_from_json(row.spec)
            except FlowtideError as exc:
                log.warning("subscription %s: %s", row.name, exc)
                continue
            listener = Listener(
                row, spec, self.firer, self.credentials, self.clock, on_error=self.on_error
            )
            task = asyncio.create_task(listener.run(), name=f"flowtide-sub-{row.name}")
            self.running[tid] = _Running(listener, task, row.updated)

    async def _stop_all(self, ids: Sequence[int]) -> None:
        stopping = [self.running.pop(tid) for tid in ids if tid in self.running]
        for run in stopping:
            run.listener.stop()
        for run in stopping:
            try:
                await asyncio.wait_for(run.task, 10.0)
            except (TimeoutError, asyncio.CancelledError):
                run.task.cancel()
            except Exception:  # noqa: BLE001 - it failed while stopping: it is stopped
                log.exception("subscription %s: stopping", run.listener.row.name)
