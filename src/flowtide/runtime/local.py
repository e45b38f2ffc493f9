"""The embedded runtime: engine, store, KV and workers in one process.

One asyncio loop owns every execution's state. Workers are threads (blocking tools must
not serialise a parallel loop: the pool is sized well above any max_in_flight) that run
a command and post its events back to the loop. The loop applies events, asks the engine
what follows, writes the whole batch to the store in one transaction (group commit) and
only then dispatches the new commands, so a crash never loses a decision that a worker
acted on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowtide import tracing
from flowtide.engine import events as ev
from flowtide.engine.events import Command, Event
from flowtide.engine.start import start_execution
from flowtide.engine.state import ExecutionState, fold
from flowtide.home import find_home
from flowtide.ids import Snowflake
from flowtide.logfiles import FileSpool
from flowtide.loopstate import LoopState
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook
from flowtide.playbook.template import visible_env
from flowtide.redaction import remember
from flowtide.runlock import RunLocks
from flowtide.runtime.advance import Advance, Advancer
from flowtide.runtime.children import ChildPlaybooks
from flowtide.runtime.command import run_chunk, run_command
from flowtide.runtime.deadlines import arm_deadlines
from flowtide.runtime.notifying import LocalNotifier
from flowtide.runtime.pipeline import StepRunner
from flowtide.runtime.spans import execution_ended
from flowtide.runtime.threads import WorkerPool
from flowtide.settings import LimitsSection, current
from flowtide.store.base import ExecutionUpdate, Store
from flowtide.store.triggers import Firing
from flowtide.tools.registry import cancel_running, warm_tools

Listener = Callable[[list[Event], Mapping[int, ExecutionState]], None]

log = logging.getLogger(__name__)


#: Seconds between the posts of what a chunk's thread finished (`_work_chunk`).
CHUNK_POST_EVERY = 0.01


@dataclass
class _Execution:
    state: ExecutionState
    runner: StepRunner
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: The playbook's `timeout:`/`sla:` timers (cancelled when it ends).
    timers: list[asyncio.TimerHandle] = field(default_factory=list)


class LocalRuntime(ChildPlaybooks):
    """Runs playbooks in this process. Use as `async with LocalRuntime(...) as rt:`."""

    def __init__(
        self,
        store: Store,
        *,
        kv: Any = None,
        credentials: Any = None,
        max_workers: int = 64,
        worker_id: str = "local",
        listener: Listener | None = None,
        data_dir: Path | None = None,
        template_env: Mapping[str, str] | None = None,
        locks: RunLocks | None = None,
        on_finished: Callable[[ExecutionState], None] | None = None,
        batching: bool = True,
    ) -> None:
        self.store = store
        #: Whether loops issue several iterations per command (`flowtide.engine.chunks`).
        self.batching = batching
        # Called with each execution's final state once it is written (e.g. to keep the
        # UI's summary of it); an error there is logged, never raised.
        self.on_finished = on_finished
        # Held for each execution this runtime runs, so no other process resumes it.
        self.locks = locks
        # Embedded: the user's own machine, so templates see the user's environment
        # (FLOWTIDE_* names excepted; FLOWTIDE_TEMPLATE_ENV narrows it).
        self.template_env = (
            template_env if template_env is not None else visible_env(os.environ, embedded=True)
        )
        # Datasets that tools write (spark results without a sink) live here, one folder
        # per execution; absolute, because a Spark Connect server or cluster reads it too.
        self.data_dir = (data_dir or find_home() / "data").absolute()
        self.logs = FileSpool(self.data_dir / "logs")
        # The result limits, read now: a bad value stops the run before its first step.
        current(LimitsSection)
        self.kv = kv
        self.loopstate = LoopState(kv) if kv is not None else None
        self.credentials = credentials
        self.worker_id = worker_id
        self.listener = listener
        self.ids = Snowflake()
        self._advancer = Advancer(
            self.loopstate,
            self.ids.next_id,
            # An in-process KV answers without a round trip (no batching of records).
            local_kv=kv is None or type(kv).__module__ == "flowtide.kv.memory",
        )
        self._pool = WorkerPool(max_workers=max_workers)
        self._outbox: list[list[Event]] = []
        self._outbox_lock = threading.Lock()
        self._executions: dict[int, _Execution] = {}
        self._states: dict[int, ExecutionState] = {}
        self._inbox: asyncio.Queue[list[Event]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._closed = False
        self._warmed: set[str] = set()
        self.notifier = LocalNotifier(self)

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> LocalRuntime:
        self._loop = asyncio.get_running_loop()
        self._inbox = asyncio.Queue()
        tracing.start("embedded")
        if self.kv is None:
            from flowtide.kv import connect

            self.kv = await connect("memory://", "flowtide_state", ttl=3600)
            self.loopstate = self._advancer.loopstate = LoopState(self.kv)
        self._pump_task = asyncio.create_task(self._pump(), name="flowtide-engine")
        # Deliveries an earlier process left owed go out from this one.
        if await asyncio.to_thread(self.store.pending_notifications):
            self.notifier.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        await self.notifier.finish(list(self._executions), self.wait)
        self._closed = True
        unfinished = False
        for execution in self._executions.values():
            unfinished = unfinished or not execution.done.is_set()
            execution.cancelled.set()
        if unfinished:
            # Ctrl-C or an abandoned run: Spark jobs keep running on a Connect server or
            # cluster unless they are stopped before this process goes away.
            cancel_running()
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
        self._pool.shutdown()
        if self.locks is not None:
            self.locks.release_all()

    # -- public API --------------------------------------------------------------------

    async def start(
        self,
        playbook: Playbook,
        *,
        workload: Mapping[str, Any] | None = None,
        catalog_version: int | None = None,
        parent_execution_id: int | None = None,
        parent_command_id: int | None = None,
        firing: Firing | None = None,
        notify: Sequence[dict[str, Any]] = (),
        traceparent: str | None = None,
    ) -> int:
        """Create an execution of `playbook` and start it. Returns its execution_id.
        `firing` (a trigger's) is recorded with it; with traces on, the execution's trace
        is `traceparent`'s when one is given.

        Raises:
            TemplateError: the workload does not render.
            AlreadyFired: `firing` fired before; nothing started.
        """
        parent = self._states.get(parent_execution_id) if parent_execution_id else None
        start = start_execution(
            playbook,
            workload or {},
            next_id=self.ids.next_id,
            now=time.time(),
            env=self.template_env,
            catalog_version=catalog_version,
            parent_execution_id=parent_execution_id,
            parent_command_id=parent_command_id,
            inherited=parent.secrets if parent is not None else frozenset(),
            notify=notify,
            traceparent=traceparent if tracing.enabled else None,
        )
        if self.locks is not None:
            self.locks.acquire(start.execution_id)
        try:
            self.store.create_execution(start.execution_id, **start.columns(), firing=firing)
        except BaseException:
            if self.locks is not None:
                self.locks.release(start.execution_id)
            raise
        self._register(playbook, start.execution_id)
        self._arm_deadlines(start.execution_id, playbook, start.created)
        await self._warm(playbook)
        await self._post(start.events)
        return start.execution_id

    async def resume(self, execution_id: int) -> ExecutionState:
        """Load a stopped execution from its event log and carry on where it stopped.

        Completed steps and loop iterations are not run again; commands that were issued
        but never reported are issued to workers again (at-least-once).

        Raises:
            ExecutionBusy: another live process runs it (with `locks`).
        """
        if execution_id in self._executions:
            return self._executions[execution_id].state
        if self.locks is not None:
            self.locks.acquire(execution_id)
        try:
            row = self.store.get_execution(execution_id)
        except BaseException:
            if self.locks is not None:
                self.locks.release(execution_id)
            raise
        playbook = parse_playbook(row.playbook_text, row.playbook_file)
        state = fold(playbook, execution_id, self.store.events(execution_id), self.template_env)
        remember(state.secrets)
        if self.loopstate is not None and not state.terminal:
            # The log is what a resume rebuilds from. The KV can be ahead of it: an
            # iteration recorded there whose report never reached the log (the process
            # died between the two). Its re-run would count as a duplicate and the loop
            # would wait forever; without the keys, duplicates of reports that did reach
            # the log are still dropped by the folded state.
            await self.loopstate.cleanup(execution_id)
        execution = self._register(playbook, execution_id, state)
        self._arm_deadlines(execution_id, playbook, row.created)
        await self._warm(playbook)
        if state.terminal:
            execution.done.set()
            if self.locks is not None:
                self.locks.release(execution_id)
            return state
        self._abandon_children(execution_id)
        for record in list(state.commands.values()):
            self._dispatch(execution, record.to_command(execution_id, record.attempt + 1))
        if not state.commands:
            # Nothing in flight: the log ended right after a decision with no command
            # (e.g. a fan-in waiting on settled upstreams). Nudge the engine.
            await self._post([])
        return state

    def _abandon_children(self, execution_id: int) -> None:
        """Sub-playbook runs that were in flight when the parent stopped: the parent's
        command runs again and starts new ones, so the old ones are closed as cancelled."""
        for row in self.store.list_executions(status="running", limit=10_000):
            if row.parent_execution_id != execution_id:
                continue
            error = {"kind": "abandoned", "message": f"parent execution {execution_id} was resumed"}
            self._close_cancelled(row.execution_id, error)

    def _close_cancelled(self, execution_id: int, error: dict[str, Any]) -> None:
        now = time.time()
        event = Event(
            event_id=self.ids.next_id(),
            execution_id=execution_id,
            type=ev.PLAYBOOK_CANCELLED,
            status="cancelled",
            error=error,
            time=now,
        )
        self.store.append(
            [event],
            execution_updates=[ExecutionUpdate(execution_id, "cancelled", now, error=error)],
        )

    def cancel_stopped(self, execution_id: int, reason: str = "cancelled by user") -> None:
        """Close an execution that no process runs any more (its row still says running:
        the process that ran it was stopped) as cancelled, without running anything.

        Raises:
            ExecutionBusy: a live process runs it (with `locks`): cancel it there.
        """
        if self.locks is not None:
            self.locks.acquire(execution_id)
        try:
            row = self.store.get_execution(execution_id)
            if row.status not in ("completed", "failed", "cancelled"):
                self._close_cancelled(execution_id, {"kind": "cancelled", "message": reason})
        finally:
            if self.locks is not None:
                self.locks.release(execution_id)

    async def wait(self, execution_id: int, timeout: float | None = None) -> ExecutionState:
        execution = self._executions[execution_id]
        if timeout is None:
            await execution.done.wait()
        else:
            await asyncio.wait_for(execution.done.wait(), timeout)
        return execution.state

    async def run(self, playbook: Playbook, **kwargs: Any) -> ExecutionState:
        execution_id = await self.start(playbook, **kwargs)
        return await self.wait(execution_id)

    async def cancel(self, execution_id: int, reason: str = "cancelled by user") -> None:
        execution = self._executions.get(execution_id)
        if execution is None or execution.state.terminal:
            return
        execution.cancelled.set()
        cancel_running(execution_id)
        await self._post(
            [
                Event(
                    event_id=self.ids.next_id(),
                    execution_id=execution_id,
                    type=ev.EXECUTION_CANCELLED,
                    status="cancelled",
                    error={"kind": "cancelled", "message": reason},
                    time=time.time(),
                )
            ]
        )
        # Its sub-playbook executions go with it, and theirs with them. One still being
        # started (its first event not in yet) is cancelled by `_run_child` once it is.
        for child_id, child in list(self._executions.items()):
            if child.state.parent_execution_id == execution_id:
                await self.cancel(child_id, f"parent execution {execution_id} cancelled")

    async def _warm(self, playbook: Playbook) -> None:
        kinds = {t.kind for s in playbook.steps.values() for t in s.tasks}
        kinds |= {s.loop.cursor.kind for s in playbook.steps.values() if s.loop and s.loop.cursor}
        kinds |= {t.kind for t in playbook.workbook.values()}
        # A spark loop: the session, and its python workers ready to run items.
        spark_loops = any(s.loop and s.loop.mode == "spark" for s in playbook.steps.values())
        if spark_loops and "spark loops" not in self._warmed:
            kinds |= {"spark", "spark loops"}
        kinds -= self._warmed
        if kinds:
            self._warmed |= kinds
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                None,
                lambda: warm_tools(
                    kinds,
                    executor=playbook.executor,
                    data_dir=self.data_dir,
                    spark_loops="spark loops" in kinds,
                ),
            )

    def state(self, execution_id: int) -> ExecutionState:
        return self._states[execution_id]

    def _arm_deadlines(self, execution_id: int, playbook: Playbook, created: float) -> None:
        self._executions[execution_id].timers += arm_deadlines(
            execution_id, playbook, created, self._states.get, self.ids.next_id, self._post
        )

    # -- internals ---------------------------------------------------------------------

    def _register(
        self, playbook: Playbook, execution_id: int, state: ExecutionState | None = None
    ) -> _Execution:
        state = state or ExecutionState(playbook, execution_id, self.template_env)
        state.batching = self.batching
        runner = StepRunner(
            playbook,
            credentials=self.credentials,
            run_playbook=self._run_child_blocking,
            data_dir=self.data_dir,
        )
        execution = _Execution(state=state, runner=runner)
        self._executions[execution_id] = execution
        self._states[execution_id] = state
        return execution

    async def _post(self, events: list[Event]) -> None:
        assert self._inbox is not None
        await self._inbox.put(events)

    def _post_threadsafe(self, events: list[Event]) -> None:
        """Hand a worker's events to the engine loop. Only the worker that finds the
        outbox empty wakes the loop; the others ride along (one wake-up per batch)."""
        assert self._loop is not None
        with self._outbox_lock:
            wake = not self._outbox
            self._outbox.append(events)
        if wake:
            try:
                self._loop.call_soon_threadsafe(self._drain_outbox)
            except RuntimeError:
                pass  # the loop is closed: the runtime is shutting down

    def _drain_outbox(self) -> None:
        assert self._inbox is not None
        with self._outbox_lock:
            batches, self._outbox = self._outbox, []
        merged = [event for batch in batches for event in batch]
        self._inbox.put_nowait(merged)

    async def _pump(self) -> None:
        assert self._inbox is not None
        while True:
            batch = list(await self._inbox.get())
            # Group commit: take everything that has arrived, up to a bound.
            while len(batch) < 2048:
                try:
                    batch.extend(self._inbox.get_nowait())
                except asyncio.QueueEmpty:
                    break
            try:
                await self._process(batch)
            except Exception as exc:  # noqa: BLE001 - a bug here must not hang waiters
                for execution in self._executions.values():
                    if not execution.done.is_set():
                        execution.state.error = {
                            "kind": "internal_error",
                            "message": f"{type(exc).__name__}: {exc}",
                        }
                        execution.done.set()
                raise

    async def _process(self, batch: list[Event]) -> None:
        out = await self._advancer.advance(self._states, batch, time.time())
        owed = self.notifier.owed(self._states, out.recorded)
        if out.recorded or out.command_rows:
            self.store.append(
                out.recorded,
                commands=out.command_rows,
                execution_updates=out.execution_rows,
                secrets=self._secrets_of(out),
                notifications=owed,
            )
            self.notifier.written(owed)
        for command in out.commands:
            execution = self._executions[command.execution_id]
            if not execution.state.terminal:
                self._dispatch(execution, command)
        for execution_id in out.finished:
            execution = self._executions[execution_id]
            execution.cancelled.set()
            if (execution.state.error or {}).get("kind") == "deadline_exceeded":
                # Past its timeout: what still runs is stopped (python children killed,
                # Spark jobs cancelled), as a cancel would.
                cancel_running(execution_id)
            for timer in execution.timers:
                timer.cancel()
            execution_ended(execution.state, time.time())
            # Clean up before waking waiters: a caller that closes the runtime as soon as
            # `wait` returns would cancel a cleanup still waiting on a remote KV.
            if self.loopstate is not None:
                await self.loopstate.cleanup(execution_id)
            if self.on_finished is not None:
                try:
                    self.on_finished(execution.state)
                except Exception:  # noqa: BLE001 - a hook must not break the engine loop
                    log.exception("execution %s: on_finished failed", execution_id)
            execution.done.set()
            if self.locks is not None:
                self.locks.release(execution_id)
        if self.listener is not None and out.recorded:
            self.listener(out.recorded, self._states)

    def _secrets_of(self, out: Advance) -> dict[int, frozenset[str]]:
        """The secret sets of the executions a batch writes to (what it must seal)."""
        ids = {e.execution_id for e in out.recorded}
        ids.update(u.execution_id for u in out.execution_rows)
        found = {eid: self._states[eid].secrets for eid in ids if eid in self._states}
        return {eid: values for eid, values in found.items() if values}

    def _dispatch(self, execution: _Execution, command: Command) -> None:
        state = execution.state
        base = state.context()
        ctx = state.ctx
        iterator = element = size = None
        if command.loop_index is not None:
            loop = state.loops[(command.step, command.loop_instance or 0)]
            iterator = loop.iterator
            element = loop.collection[command.loop_index]
            size = None if loop.cursor else loop.size  # a cursor's collection grows
            record = state.commands.get(command.command_id)
            if record is not None and record.pending is not None:
                items = [(i, loop.collection[i]) for i in sorted(record.pending)]
                parts = state.context_parts()
                self._pool.submit(
                    self._work_chunk, execution, command, base, parts, items, iterator, size
                )
                return
        self._pool.submit(self._work, execution, command, base, ctx, iterator, element, size)

    def _work_chunk(
        self,
        execution: _Execution,
        command: Command,
        base: Mapping[str, Any],
        parts: Mapping[str, Any],
        items: list[tuple[int, Any]],
        iterator: str,
        size: int | None,
    ) -> None:
        """Worker thread: run a chunk of loop iterations, posting what finished every 10 ms
        (`CHUNK_POST_EVERY`: fewer wake-ups of the engine loop than one per iteration)."""
        rest = run_chunk(
            execution.runner,
            command,
            base,
            parts,
            items,
            post=self._post_threadsafe,
            every=CHUNK_POST_EVERY,
            next_id=self.ids.next_id,
            worker_id=threading.current_thread().name,
            iterator=iterator,
            size=size,
            env=self.template_env,
            cancelled=execution.cancelled.is_set,
            traceparent=execution.state.traceparent,
            logs=self.logs,
            secrets=lambda: execution.state.secrets,
            on_started=self._post_threadsafe,
        )
        self._post_threadsafe(rest)

    def _work(
        self,
        execution: _Execution,
        command: Command,
        base: Mapping[str, Any],
        ctx: Mapping[str, Any],
        iterator: str | None,
        element: Any,
        size: int | None,
    ) -> None:
        """Worker thread: run the command and post its events."""
        events = run_command(
            execution.runner,
            command,
            base,
            ctx,
            next_id=self.ids.next_id,
            worker_id=threading.current_thread().name,
            iterator=iterator,
            element=element,
            size=size,
            cancelled=execution.cancelled.is_set,
            traceparent=execution.state.traceparent,
            logs=self.logs,
            secrets=lambda: execution.state.secrets,
            on_started=self._post_threadsafe,
            report=self._post_threadsafe,
        )
        self._post_threadsafe(events)
