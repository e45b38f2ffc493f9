"""Running one command, the same way in every runtime that runs commands (the embedded
runtime's threads, a worker's threads): the step's tasks through a `StepRunner` (or a
cursor loop's claim query), then the events that report it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from flowtide import tracing
from flowtide.engine import events as ev
from flowtide.engine.events import (
    CallPayload,
    Command,
    CommandProgressPayload,
    CommandRef,
    CommandResultPayload,
    Event,
)
from flowtide.logs import CommandLog, LogKey, LogSpool, current_log
from flowtide.runtime.outcome import Outcome, crashed
from flowtide.runtime.pipeline import StepRunner

__all__ = ["outcome_events", "progress_event", "run_chunk", "run_command", "started_event"]


def run_command(
    runner: StepRunner,
    command: Command,
    base: Mapping[str, Any],
    ctx: Mapping[str, Any],
    *,
    next_id: Callable[[], int],
    worker_id: str,
    iterator: str | None = None,
    element: Any = None,
    size: int | None = None,
    credentials: Any = None,
    cancelled: Callable[[], bool] | None = None,
    traceparent: str | None = None,
    logs: LogSpool | None = None,
    secrets: Callable[[], Iterable[str]] | None = None,
    on_started: Callable[[list[Event]], None] | None = None,
    report: Callable[[list[Event]], None] | None = None,
    started: bool = True,
) -> list[Event]:
    """Run `command` (a cursor loop's claim, or the step's tasks for the loop `element`
    when it is an iteration, `size` its loop's collection size when known) against the
    execution's context `base` and `ctx`; the events to report, ids from `next_id`. A
    runtime bug becomes a failed command, never a lost one. `credentials`: the command's
    resolver (default: the runner's own).
    With traces on, the command is a span of its execution's trace (`traceparent`: what
    the execution started under), current while its tools run.
    `logs`: where what the step prints goes while it runs (masked with `secrets` too);
    `on_started`: given `command.started` as the command starts (else it is reported
    with the other events). `report`: given events while the command runs (a spark
    loop's `command.progress`; thread-safe, never blocking: it may be called from any
    thread); without it no progress is reported before the end. `started` False: no
    `command.started` at all (a chunk's iterations after its first).
    """
    if on_started is not None:
        on_started([started_event(command, next_id(), worker_id, time.time())])
    log = None
    if logs is not None:
        key = LogKey(command.execution_id, command.command_id, command.step, command.loop_index)
        log = CommandLog(key, logs, secrets)
    token = current_log.set(log)
    progress = None
    if report is not None:

        def progress(items: dict[str, Any]) -> None:
            report([progress_event(command, next_id(), worker_id, time.time(), items)])

    args = (runner, command, base, ctx, iterator, element, size, credentials, cancelled)
    span = None
    try:
        if not tracing.enabled:
            outcome = _outcome(*args, progress)
        else:
            span = tracing.command_context(
                command.execution_id, command.command_id, command.attempt, traceparent
            )
            with tracing.use(span.header):
                outcome = _outcome(*args, progress)
    finally:
        current_log.reset(token)
        if log is not None:
            try:
                log.close()
            except Exception:  # noqa: BLE001 - a log that cannot be written loses no command
                pass
    events = outcome_events(
        command, outcome, next_id, worker_id, started=started and on_started is None
    )
    if span is not None:
        tracing.record_command(
            execution_id=command.execution_id,
            command_id=command.command_id,
            attempt=command.attempt,
            step=command.step,
            worker_id=worker_id,
            traceparent=traceparent,
            started=outcome.started or events[0].time,
            ended=events[-1].time,
            status=outcome.status,
            error_kind=(outcome.error or {}).get("kind") if outcome.status == "error" else None,
            loop_index=command.loop_index,
        )
    return events


def run_chunk(
    runner: StepRunner,
    command: Command,
    base: Mapping[str, Any],
    parts: Mapping[str, Any],
    items: Sequence[tuple[int, Any]],
    *,
    post: Callable[[list[Event]], None],
    every: float,
    next_id: Callable[[], int],
    worker_id: str,
    iterator: str | None,
    size: int | None,
    env: Mapping[str, str],
    credentials: Any = None,
    cancelled: Callable[[], bool] | None = None,
    traceparent: str | None = None,
    logs: LogSpool | None = None,
    secrets: Callable[[], Iterable[str]] | None = None,
    on_started: Callable[[list[Event]], None] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> list[Event]:
    """Run a chunk of loop iterations (`items`: (index, element) pairs, in order) one
    after another, each as its own command would run (`run_command`: its own `call.*` and
    `command.completed`, whose `loop_index` says which; `command.started` for the first
    only). What finished goes to `post` every `every` seconds (0: after each iteration);
    the rest is returned. It stops after an iteration that breaks or fails the loop, and
    before the next one once `cancelled` or `stopped` (the server no longer takes the
    chunk's reports: it was issued again, or its execution ended). An iteration's `ctx`
    update is seen by the ones after it, as when the engine issues them one by one.
    `base`: the render context of `parts` (`ExecutionState.context_parts`), rebuilt from
    them when ctx changes."""
    from flowtide.engine.state import context_from_parts

    eid = command.execution_id
    ctx = parts["ctx"]
    held: list[Event] = []
    last = time.monotonic()
    for n, (index, element) in enumerate(items):
        if n and ((cancelled is not None and cancelled()) or (stopped is not None and stopped())):
            break
        events = run_command(
            runner,
            replace(command, loop_index=index),
            base,
            ctx,
            next_id=next_id,
            worker_id=worker_id,
            iterator=iterator,
            element=element,
            size=size,
            credentials=credentials,
            cancelled=cancelled,
            traceparent=traceparent,
            logs=logs,
            secrets=secrets,
            on_started=on_started if n == 0 else None,
            started=n == 0,
        )
        held.extend(events)
        end = ev.payload_of(events[-1], ev.COMMAND_COMPLETED)
        if end.get("action") in ("break", "fail"):
            break
        if end.get("ctx"):
            ctx = {**ctx, **end["ctx"]}
            base = context_from_parts(runner.playbook, eid, {**parts, "ctx": ctx}, env)
        now = time.monotonic()
        if now - last >= every and n + 1 < len(items):
            post(held)
            held, last = [], now
    return held


def _outcome(
    runner: StepRunner,
    command: Command,
    base: Mapping[str, Any],
    ctx: Mapping[str, Any],
    iterator: str | None,
    element: Any,
    size: int | None,
    credentials: Any,
    cancelled: Callable[[], bool] | None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> Outcome:
    step = runner.playbook.steps[command.step]
    try:
        if command.extra.get("cursor"):
            return runner.claim(
                step, base, ctx, execution_id=command.execution_id, credentials=credentials
            )
        if step.loop is not None and step.loop.mode == "spark":
            from flowtide.spark.loop import run_spark_loop

            return run_spark_loop(
                runner,
                step,
                base,
                ctx,
                execution_id=command.execution_id,
                cancelled=cancelled,
                credentials=credentials,
                progress=progress,
            )
        return runner.run(
            step,
            base,
            ctx,
            execution_id=command.execution_id,
            credentials=credentials,
            iterator=iterator,
            element=element,
            index=command.loop_index,
            size=size,
            cancelled=cancelled,
        )
    except Exception as exc:  # noqa: BLE001 - report, never lose a command
        return crashed(exc)


def _ref(command: Command) -> CommandRef:
    base: CommandRef = {"attempt": command.attempt}
    if command.extra.get("cursor"):
        base["loop_instance"] = command.loop_instance
        base["cursor"] = True
    elif command.loop_index is not None:
        base["loop_instance"] = command.loop_instance
        base["loop_index"] = command.loop_index
    return base


def started_event(command: Command, event_id: int, worker: str, at: float) -> Event:
    """The `command.started` of `command`."""
    return Event(
        event_id=event_id,
        execution_id=command.execution_id,
        type=ev.COMMAND_STARTED,
        step=command.step,
        status="running",
        payload=_ref(command),
        parent_event_id=command.issued_event_id,
        command_id=command.command_id,
        worker_id=worker,
        time=at,
    )


def progress_event(
    command: Command, event_id: int, worker: str, at: float, items: Mapping[str, Any]
) -> Event:
    """A `command.progress` of `command`: `items` is `{done, total, per_second}` (and
    `failed` in the last one)."""
    payload = cast(CommandProgressPayload, _ref(command))
    payload["done"] = int(items.get("done") or 0)
    payload["total"] = int(items.get("total") or 0)
    payload["per_second"] = round(float(items.get("per_second") or 0.0), 1)
    if "failed" in items:
        payload["failed"] = int(items.get("failed") or 0)
    return Event(
        event_id=event_id,
        execution_id=command.execution_id,
        type=ev.COMMAND_PROGRESS,
        step=command.step,
        status="running",
        payload=payload,
        parent_event_id=command.issued_event_id,
        command_id=command.command_id,
        worker_id=worker,
        time=at,
    )


def outcome_events(
    command: Command,
    outcome: Outcome,
    new_id: Callable[[], int],
    worker: str,
    *,
    started: bool = True,
) -> list[Event]:
    """The events a worker reports for one command: command.started (unless `started`
    is False: it was reported as the command started), `secrets.added` when the tools
    touched secrets, a call.done or call.error per tool call, then command.completed (or
    command.failed when the step's policy says fail)."""
    eid = command.execution_id
    base = _ref(command)
    out = [started_event(command, new_id(), worker, outcome.started)] if started else []
    if outcome.secrets:
        # Before the events that may hold the values: the whole report is sealed against
        # the set they join, on the server as in this process.
        out.append(
            Event(
                event_id=new_id(),
                execution_id=eid,
                type=ev.SECRETS_ADDED,
                step=command.step,
                status="ok",
                payload={"values": sorted(outcome.secrets)},
                parent_event_id=command.issued_event_id,
                command_id=command.command_id,
                worker_id=worker,
                time=outcome.started,
            )
        )
    for call in outcome.calls:
        payload: CallPayload = {
            "task": call.task,
            "attempt": call.attempt,
            "duration_ms": call.duration_ms,
        }
        if call.stdout:
            payload["stdout"] = call.stdout
        if call.meta:
            # What the tool recorded: `CallMeta`'s keys (a plugin's tool may add others).
            payload.update(cast(CallPayload, call.meta))
        out.append(
            Event(
                event_id=new_id(),
                execution_id=eid,
                type=ev.CALL_DONE if call.ok else ev.CALL_ERROR,
                step=command.step,
                status="ok" if call.ok else "error",
                payload=payload,
                error=call.error,
                parent_event_id=command.issued_event_id,
                command_id=command.command_id,
                worker_id=worker,
                time=call.started,
            )
        )
    if outcome.items is not None:
        out.append(progress_event(command, new_id(), worker, time.time(), outcome.items))
    # The command's keys first, then the outcome's (the order they are stored in).
    result = cast(CommandResultPayload, base.copy())
    result["status"] = outcome.status
    result["result"] = outcome.result
    result["action"] = outcome.action
    if outcome.jump_to:
        result["jump_to"] = outcome.jump_to
    if outcome.ctx:
        result["ctx"] = outcome.ctx
    if outcome.tasks:
        result["tasks"] = outcome.tasks
    completed = outcome.action != "fail"
    out.append(
        Event(
            event_id=new_id(),
            execution_id=eid,
            type=ev.COMMAND_COMPLETED if completed else ev.COMMAND_FAILED,
            step=command.step,
            status=outcome.status,
            payload=result,
            error=outcome.error,
            parent_event_id=command.issued_event_id,
            command_id=command.command_id,
            worker_id=worker,
            time=time.time(),
        )
    )
    return out
