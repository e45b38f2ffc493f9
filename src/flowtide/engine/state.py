"""Execution state and the fold that builds it from events.

`fold(playbook, events)` rebuilds the state from a log; `state.apply(event)` applies one
more event. Applying is the only way state changes, so the cached state of a running
execution and the state re-folded from its log are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowtide.engine import events as ev
from flowtide.engine.context import NO_ENV, SparkLoopView, base_context, result_view
from flowtide.engine.events import Event, payload_of
from flowtide.engine.records import CommandRecord as CommandRecord
from flowtide.engine.records import LoopRecord as LoopRecord
from flowtide.engine.records import StepRecord as StepRecord
from flowtide.engine.reported import reported_count, reported_duration, reported_rate
from flowtide.playbook.model import Playbook


class ExecutionState:
    """Everything the engine knows about one execution."""

    def __init__(
        self, playbook: Playbook, execution_id: int, env: Mapping[str, str] = NO_ENV
    ) -> None:
        self.playbook = playbook
        self.execution_id = execution_id
        # The environment variables templates see (`env`), chosen by the runtime.
        self.env = env
        self.status = "pending"  # pending | running | completed | failed | cancelled
        self.workload: dict[str, Any] = {}
        self.ctx: dict[str, Any] = {}
        self.steps: dict[str, StepRecord] = {name: StepRecord() for name in playbook.steps}
        self.active: set[str] = set()
        self.waiting: set[str] = set()  # fan-in steps with at least one arrived arc
        self.loops: dict[tuple[str, int], LoopRecord] = {}
        self.current_loop: dict[str, int] = {}
        self.commands: dict[int, CommandRecord] = {}
        # (from, to) -> how many times a step's exit took that arc.
        self.taken: dict[tuple[str, str], int] = {}
        self.last_finished: str | None = None
        self.error: dict[str, Any] | None = None
        self.parent_execution_id: int | None = None
        self.parent_command_id: int | None = None
        #: Notify targets its trigger added to the playbook's (`NotifyTarget.to_json`).
        self.trigger_notify: tuple[dict[str, Any], ...] = ()
        #: The W3C traceparent it started under (`flowtide.tracing`), and when it started.
        self.traceparent: str | None = None
        self.started_at: float | None = None
        #: The deadlines recorded as missed (`timeout`, `sla`): each is recorded once.
        self.deadlines_missed: frozenset[str] = frozenset()
        self.last_event_id: int = 0
        self.event_count: int = 0
        # False when the last command report applied was a late or duplicate one
        # (decide must not act on it either).
        self.last_report_counted = True
        # The command record the last counted report closed (None when not counted); for
        # a chunk, a record of the one iteration it reported.
        self.last_report: CommandRecord | None = None
        # Values the execution's tools touched (`secrets.added`): what is stored holding
        # one is sealed, what is shown is masked. Never part of the render context.
        self.secrets: frozenset[str] = frozenset()
        self._base: dict[str, Any] | None = None
        #: The id of the last event that changed `context_parts()` (0: none yet). The
        #: same log gives the same revision in every process, so a worker holding the
        #: parts of a revision need not be sent them again (`wire.ExecutionShare`).
        self.context_rev: int = 0
        self._applying: int = 0

    # -- reading -----------------------------------------------------------------------

    #: Whether `decide` may issue several iterations of a loop as one command (a chunk):
    #: the runtime that holds the state runs chunks (the server's and the embedded
    #: runtime's do).
    batching = False

    @property
    def terminal(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")

    def context(self) -> dict[str, Any]:
        """The base render context (a snapshot: never mutated once returned)."""
        if self._base is None:
            self._base = context_from_parts(
                self.playbook, self.execution_id, self.context_parts(), self.env
            )
        return self._base

    def context_parts(self) -> dict[str, Any]:
        """The JSON-serialisable inputs of `context()`: workload, step results (with their
        tasks) and ctx. A remote worker rebuilds the context with `context_from_parts`."""
        return {
            "workload": self.workload,
            "results": {
                name: {"result": rec.result, "tasks": rec.tasks}
                for name, rec in self.steps.items()
                if rec.status in ("completed", "failed") or rec.runs and rec.result is not None
            },
            "ctx": self.ctx,
        }

    def loop_of(self, step: str) -> LoopRecord | None:
        instance = self.current_loop.get(step)
        return None if instance is None else self.loops.get((step, instance))

    def result(self) -> Any:
        """The execution's result: the last completed step's. A cancelled execution has
        none (None), whatever its steps finished before the cancel (they keep theirs)."""
        if self.last_finished is None or self.status in ("cancelling", "cancelled"):
            return None
        return self.steps[self.last_finished].result

    # -- applying ----------------------------------------------------------------------

    def _touch(self) -> None:
        """The context parts changed (every handler that changes what `context_parts`
        reads calls this)."""
        self._base = None
        self.context_rev = self._applying

    def apply(self, event: Event) -> None:
        """Apply one event. Events of other executions are a programming error."""
        self.last_event_id = max(self.last_event_id, event.event_id)
        self.event_count += 1
        handler = _APPLY.get(event.type)
        if handler is not None:
            self._applying = event.event_id
            handler(self, event)

    def _on_initialized(self, event: Event) -> None:
        payload = payload_of(event, ev.PLAYBOOK_INITIALIZED)
        self.workload = dict(payload.get("workload") or {})
        self.parent_execution_id = payload.get("parent_execution_id")
        self.parent_command_id = payload.get("parent_command_id")
        self.trigger_notify = tuple(payload.get("notify") or ())
        self.traceparent = payload.get("traceparent")
        self.started_at = event.time
        self.status = "running"
        self._touch()

    def _on_step_enter(self, event: Event) -> None:
        step = event.step or ""
        rec = self.steps[step]
        rec.runs += 1
        rec.status = "running"
        rec.error = None
        rec.started, rec.ended = event.time, None
        rec.items = None
        self.active.add(step)
        self.waiting.discard(step)
        # A step entered again leaves the context until it has a result (context_parts).
        self._touch()

    def _on_loop_started(self, event: Event) -> None:
        payload = payload_of(event, ev.LOOP_STARTED)
        step = event.step or ""
        instance = int(payload["instance"])
        collection = list(payload.get("collection") or [])
        self.loops[(step, instance)] = LoopRecord(
            step=step,
            instance=instance,
            iterator=str(payload["iterator"]),
            collection=collection,
            max_in_flight=int(payload.get("max_in_flight") or 1),
            results=[None] * len(collection),
            done=[False] * len(collection),
            cursor=bool(payload.get("cursor")),
            process=str(payload.get("process") or "row"),
        )
        self.current_loop[step] = instance

    def _on_loop_claimed(self, event: Event) -> None:
        payload = payload_of(event, ev.LOOP_CLAIMED)
        loop = self.loops.get((event.step or "", int(payload.get("instance") or 0)))
        if loop is None:
            return
        rows = list(payload.get("rows") or [])
        items: list[Any] = [rows] if loop.process == "frame" and rows else rows
        loop.collection.extend(items)
        loop.results.extend([None] * len(items))
        loop.done.extend([False] * len(items))
        loop.claims += 1
        if payload.get("exhausted"):
            loop.exhausted = True

    def _on_command_issued(self, event: Event) -> None:
        payload = payload_of(event, ev.COMMAND_ISSUED)
        cid = int(event.command_id or payload["command_id"])
        instance = payload.get("loop_instance")
        index = payload.get("loop_index")
        count = int(payload.get("loop_count") or 1)
        pending = None
        if count > 1 and index is not None:
            before = self.commands.get(cid)
            # Issued again (its lease ran out): what its first issue had not reported.
            pending = (
                set(before.pending)
                if before is not None and before.pending is not None
                else set(range(int(index), int(index) + count))
            )
        self.commands[cid] = CommandRecord(
            command_id=cid,
            step=event.step or "",
            attempt=int(payload.get("attempt") or 1),
            loop_instance=instance,
            loop_index=index,
            issued_event_id=event.event_id,
            cursor=bool(payload.get("cursor")),
            count=count,
            pending=pending,
        )
        rec = self.steps.get(event.step or "")
        if rec is not None and rec.items is not None:
            rec.items = None  # a spark loop issued again starts its items again
        if payload.get("cursor") and instance is not None:
            loop = self.loops.get((event.step or "", int(instance)))
            if loop is not None:
                loop.claiming = True
        elif instance is not None and index is not None:
            loop = self.loops.get((event.step or "", int(instance)))
            if loop is not None:
                if pending is not None:
                    loop.in_flight.update(pending)
                else:
                    loop.in_flight.add(int(index))
                loop.commands.add(cid)
                loop.next_index = max(loop.next_index, int(index) + count)

    def _on_command_done(self, event: Event) -> None:
        cid = event.command_id
        # command.completed or command.failed: the same payload
        payload = payload_of(event, ev.COMMAND_COMPLETED)
        cmd = self.commands.get(cid) if cid is not None else None
        if cmd is not None and cmd.pending is not None:
            cmd = self._chunk_iteration(cmd, payload)
        elif cmd is not None:
            del self.commands[cmd.command_id]
        self.last_report_counted = cmd is not None
        self.last_report = cmd
        if cmd is None:
            return  # a duplicate or late report: the first one counted
        status = payload.get("status", "ok" if event.type == ev.COMMAND_COMPLETED else "error")
        result = payload.get("result")
        if cmd.cursor:
            # A claim: its rows join the loop through the `loop.claimed` that follows.
            loop = self.loops.get((cmd.step, cmd.loop_instance or 0))
            if loop is None or loop.finished:
                self.last_report_counted = False
                return
            loop.claiming = False
            if event.type == ev.COMMAND_FAILED or status != "ok":
                loop.broken = True
                loop.fail_error = event.error or {
                    "kind": "error",
                    "message": "cursor claim failed",
                }
            return
        if payload.get("ctx") and isinstance(payload["ctx"], dict):
            self.ctx = {**self.ctx, **payload["ctx"]}
            self._touch()
        if cmd.loop_instance is not None and cmd.loop_index is not None:
            loop = self.loops.get((cmd.step, cmd.loop_instance))
            if loop is None or loop.done[cmd.loop_index]:
                self.last_report_counted = False
                return
            index = cmd.loop_index
            loop.in_flight.discard(index)
            if cmd.command_id not in self.commands:
                loop.commands.discard(cmd.command_id)
            loop.done[index] = True
            loop.results[index] = result
            if status == "ok":
                loop.success += 1
            else:
                loop.failed += 1
            action = payload.get("action")
            if action == "break":
                loop.broken = True
            elif action == "fail":
                loop.broken = True
                loop.fail_error = event.error or {
                    "kind": "error",
                    "message": "loop iteration failed",
                }
            if action in ("break", "fail"):
                self._stop_chunk(loop, cmd.command_id)
            return
        rec = self.steps[cmd.step]
        rec.result = result
        self._touch()
        rec.tasks = payload.get("tasks")
        rec.error = event.error
        rec.outcome = ev.CALL_DONE if status == "ok" else ev.CALL_ERROR

    def _chunk_iteration(self, cmd: CommandRecord, payload: Any) -> CommandRecord | None:
        """A report of one iteration of the chunk `cmd`: a record of that iteration (the
        chunk closed once none is left), or None when it is not one still to report."""
        index = cmd.iteration(payload)
        if index is None or cmd.pending is None:
            return None
        cmd.pending.discard(index)
        if not cmd.pending:
            del self.commands[cmd.command_id]
        return CommandRecord(
            cmd.command_id,
            cmd.step,
            cmd.attempt,
            cmd.loop_instance,
            index,
            cmd.issued_event_id,
        )

    def _stop_chunk(self, loop: LoopRecord, command_id: int) -> None:
        """An iteration broke or failed the loop: its chunk's worker runs no more of it, so
        the chunk's iterations not reported are no longer in flight (never run)."""
        cmd = self.commands.get(command_id)
        if cmd is None or cmd.pending is None:
            return
        loop.in_flight.difference_update(cmd.pending)
        loop.commands.discard(command_id)
        del self.commands[command_id]

    def _on_command_progress(self, event: Event) -> None:
        cid = event.command_id
        if cid is None or cid not in self.commands:
            return  # a late report of a command that ended
        payload = payload_of(event, ev.COMMAND_PROGRESS)
        rec = self.steps.get(event.step or "")
        if rec is None:
            return
        # A worker's word: whole numbers, done within total, failed within done, a
        # finite rate (the documents built from it are JSON; a reader trusts them).
        total = reported_count(payload.get("total"))
        done = min(reported_count(payload.get("done")), total)
        items: dict[str, Any] = {
            "done": done,
            "total": total,
            "per_second": reported_rate(payload.get("per_second")),
        }
        if "failed" in payload:
            items["failed"] = min(reported_count(payload.get("failed")), done)
        rec.items = items

    def _on_call(self, event: Event) -> None:
        rec = self.steps.get(event.step or "")
        if rec is None:
            return
        rec.attempts += 1
        payload = payload_of(event, ev.CALL_DONE)
        # A worker's word: a number it sends may be anything JSON holds (10**400 too).
        attempt = payload.get("attempt")
        if isinstance(attempt, int | float) and not isinstance(attempt, bool) and attempt > 1:
            rec.retries += 1
        loop = self.loop_of(event.step or "")
        took = reported_duration(payload.get("duration_ms"))
        if loop is not None and not loop.finished and took is not None:
            loop.busy_ms += took
            loop.calls += 1

    def _on_loop_done(self, event: Event) -> None:
        step = event.step or ""
        loop = self.loop_of(step)
        if loop is None:
            return
        loop.finished = True
        rec = self.steps[step]
        rec.result = loop.aggregate()
        self._touch()
        rec.tasks = None
        rec.outcome = ev.LOOP_DONE

    def _on_ctx_updated(self, event: Event) -> None:
        payload = payload_of(event, ev.CTX_UPDATED)
        updates = payload.get("set") or {}
        removed = [name for name in payload.get("unset") or () if name in self.ctx]
        if updates or removed:
            ctx = {**self.ctx, **updates}
            for name in removed:
                del ctx[name]
            self.ctx = ctx
            self._touch()

    def _on_step_exit(self, event: Event) -> None:
        step = event.step or ""
        payload = payload_of(event, ev.STEP_EXIT)
        rec = self.steps[step]
        rec.status = event.status or "completed"
        rec.ended = event.time
        if event.error:
            rec.error = event.error
        self.active.discard(step)
        updates = payload.get("set") or {}
        if updates:
            self.ctx = {**self.ctx, **updates}
        for target in payload.get("next") or []:
            self.taken[(step, target)] = self.taken.get((step, target), 0) + 1
            if len(self.playbook.upstreams.get(target, ())) > 1:
                self.waiting.add(target)
        if rec.status == "completed":
            self.last_finished = step
        self._touch()

    def _on_terminal(self, event: Event) -> None:
        if event.type == ev.PLAYBOOK_COMPLETED:
            self.status = "completed"
        elif event.type == ev.PLAYBOOK_FAILED:
            self.status = "failed"
            self.error = event.error
        elif event.type == ev.PLAYBOOK_CANCELLED:
            self.status = "cancelled"
            self.error = event.error
        self.commands.clear()
        # One truth per run: a step still running when its execution ends (a parallel
        # branch when another failed it, a cancel) will get no step.exit; it ended here.
        for rec in self.steps.values():
            if rec.status == "running":
                rec.status = "cancelled"
                if rec.ended is None:
                    rec.ended = event.time

    def _on_cancel(self, event: Event) -> None:
        if not self.terminal:
            self.status = "cancelling"

    def _on_deadline_missed(self, event: Event) -> None:
        kind = payload_of(event, ev.EXECUTION_DEADLINE_MISSED).get("kind")
        self.deadlines_missed = self.deadlines_missed | {str(kind)}

    def _on_secrets_added(self, event: Event) -> None:
        added = secret_values(event)
        if not added <= self.secrets:
            self.secrets = self.secrets | added


def secret_values(event: Event) -> frozenset[str]:
    """The values a `secrets.added` event adds to its execution's secret set."""
    values = payload_of(event, ev.SECRETS_ADDED).get("values") or ()
    return frozenset(v for v in values if isinstance(v, str) and v)


def _view(playbook: Playbook, name: str, value: Any, tasks: Mapping[str, Any] | None) -> Any:
    """A step's result as templates see it (`result_view`; a spark loop's without its
    `results`: a `SparkLoopView`)."""
    step = playbook.steps.get(name)
    loop = step.loop if step is not None else None
    if loop is not None and loop.mode == "spark" and isinstance(value, dict):
        if "results" not in value:
            return SparkLoopView(value, name, loop.results_max)
    return result_view(value, tasks)


def context_from_parts(
    playbook: Playbook,
    execution_id: int,
    parts: Mapping[str, Any],
    env: Mapping[str, str] = NO_ENV,
) -> dict[str, Any]:
    """The base render context from `ExecutionState.context_parts()`."""
    results = {
        name: _view(playbook, name, r["result"], r.get("tasks"))
        for name, r in parts["results"].items()
    }
    return base_context(
        execution_id, parts["workload"], list(playbook.steps), results, parts["ctx"], env
    )


_APPLY = {
    ev.PLAYBOOK_INITIALIZED: ExecutionState._on_initialized,
    ev.STEP_ENTER: ExecutionState._on_step_enter,
    ev.LOOP_STARTED: ExecutionState._on_loop_started,
    ev.COMMAND_ISSUED: ExecutionState._on_command_issued,
    ev.COMMAND_PROGRESS: ExecutionState._on_command_progress,
    ev.COMMAND_COMPLETED: ExecutionState._on_command_done,
    ev.COMMAND_FAILED: ExecutionState._on_command_done,
    ev.CALL_DONE: ExecutionState._on_call,
    ev.CALL_ERROR: ExecutionState._on_call,
    ev.LOOP_CLAIMED: ExecutionState._on_loop_claimed,
    ev.LOOP_DONE: ExecutionState._on_loop_done,
    ev.CTX_UPDATED: ExecutionState._on_ctx_updated,
    ev.STEP_EXIT: ExecutionState._on_step_exit,
    ev.PLAYBOOK_COMPLETED: ExecutionState._on_terminal,
    ev.PLAYBOOK_FAILED: ExecutionState._on_terminal,
    ev.PLAYBOOK_CANCELLED: ExecutionState._on_terminal,
    ev.EXECUTION_CANCELLED: ExecutionState._on_cancel,
    ev.EXECUTION_DEADLINE_MISSED: ExecutionState._on_deadline_missed,
    ev.SECRETS_ADDED: ExecutionState._on_secrets_added,
}


def fold(
    playbook: Playbook,
    execution_id: int,
    events: list[Event],
    env: Mapping[str, str] = NO_ENV,
) -> ExecutionState:
    """Rebuild an execution's state from its event log."""
    state = ExecutionState(playbook, execution_id, env)
    for event in events:
        state.apply(event)
    return state


#: The event types whose `apply` changes more than the state's counters (`event_count`,
#: `last_event_id`): a reader that needs only the fold may read these alone.
FOLDED_TYPES: frozenset[str] = frozenset(_APPLY)
