"""decide(state, event, now, new_id) -> (events, commands). Pure: no I/O, no clock.

The runtime applies an event to the state, then asks `decide` what follows from it;
every event returned is applied and decided on in turn. Routing decisions (step `set`,
arc `when`/`set`) are taken when a step finishes and recorded in its `step.exit`
event, so replaying a log never re-evaluates a template.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from flowtide.engine import events as ev
from flowtide.engine.chunks import chunk_size
from flowtide.engine.context import envelope, layered, loop_view, plain, result_view
from flowtide.engine.events import (
    Command,
    CommandIssuedPayload,
    Event,
    EventPayload,
    LoopClaimedPayload,
    LoopDonePayload,
    LoopItemPayload,
    LoopStartedPayload,
    PlaybookCompletedPayload,
    StepExitPayload,
    payload_of,
)
from flowtide.engine.state import ExecutionState, LoopRecord
from flowtide.errors import TemplateError
from flowtide.playbook.model import Step
from flowtide.playbook.template import render, render_budget, truthy

DEFAULT_PARALLEL = 16

Decision = tuple[list[Event], list[Command]]
IdSource = Callable[[], int]


class _Out:
    def __init__(self, state: ExecutionState, cause: Event, now: float, new_id: IdSource) -> None:
        self.state = state
        self.cause = cause
        self.now = now
        self.new_id = new_id
        self.events: list[Event] = []
        self.commands: list[Command] = []

    def emit(
        self,
        type_: str,
        step: str | None = None,
        *,
        status: str | None = None,
        payload: EventPayload | None = None,
        error: dict[str, Any] | None = None,
        command_id: int | None = None,
    ) -> Event:
        event = Event(
            event_id=self.new_id(),
            execution_id=self.state.execution_id,
            type=type_,
            step=step,
            status=status,
            payload=payload,
            error=error,
            parent_event_id=self.cause.event_id,
            command_id=command_id,
            time=self.now,
        )
        self.events.append(event)
        return event

    def issue(
        self,
        step: str,
        *,
        instance: int | None = None,
        index: int | None = None,
        attempt: int = 1,
        cursor: bool = False,
        count: int = 1,
    ) -> None:
        command_id = self.new_id()
        payload: CommandIssuedPayload = {"command_id": command_id, "attempt": attempt}
        if cursor:
            payload["loop_instance"] = instance
            payload["cursor"] = True
        elif instance is not None:
            payload["loop_instance"] = instance
            payload["loop_index"] = index
            if count > 1:
                payload["loop_count"] = count
        issued = self.emit(
            ev.COMMAND_ISSUED, step, status="issued", payload=payload, command_id=command_id
        )
        self.commands.append(
            Command(
                command_id=command_id,
                execution_id=self.state.execution_id,
                step=step,
                attempt=attempt,
                loop_instance=instance,
                loop_index=index,
                issued_event_id=issued.event_id,
                extra={"cursor": True} if cursor else {},
            )
        )

    def result(self) -> Decision:
        return self.events, self.commands


def _template_error(exc: TemplateError) -> dict[str, Any]:
    return {
        "kind": "template_error",
        "message": str(exc),
        "expression": exc.expression,
        "missing": exc.missing,
        "retryable": False,
    }


def _assign(target: dict[str, Any], key: str, value: Any) -> None:
    """Assign `ctx.a.b`-style keys (prefix already stripped) into a fresh ctx dict."""
    parts = key.split(".")
    cur = target
    for part in parts[:-1]:
        nxt = cur.get(part)
        nxt = dict(nxt) if isinstance(nxt, dict) else {}
        cur[part] = nxt
        cur = nxt
    cur[parts[-1]] = value


def render_set(
    spec: Mapping[str, Any],
    context: Mapping[str, Any],
    ctx: Mapping[str, Any],
    *,
    step: str,
    field: str,
) -> dict[str, Any]:
    """Render a `set:` block into ctx updates (top-level ctx keys -> new values)."""
    updated: dict[str, Any] = {}
    merged = dict(ctx)
    for key, raw in spec.items():
        value = plain(render(raw, context, step=step, field=f"{field}.{key}"))
        name = key[4:] if key.startswith("ctx.") else key[5:] if key.startswith("vars.") else key
        if key.startswith("iter."):
            continue  # iteration-local; only meaningful inside a loop iteration
        _assign(merged, name, value)
        top = name.split(".", 1)[0]
        updated[top] = merged[top]
    return updated


def _collection(value: Any) -> list[Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(
                f"loop 'in' rendered to a string, expected a list: {value[:80]!r}"
            ) from exc
    if value is None:
        return []
    if isinstance(value, dict):
        raise ValueError("loop 'in' rendered to a mapping, expected a list")
    if isinstance(value, list | tuple):
        return list(value)
    raise ValueError(f"loop 'in' rendered to {type(value).__name__}, expected a list")


def _max_in_flight(step: Step, context: Mapping[str, Any]) -> int:
    assert step.loop is not None
    raw = step.loop.max_in_flight
    if raw is None:
        return 1 if step.loop.mode in ("sequential", "cursor") else DEFAULT_PARALLEL
    if step.loop.mode == "sequential":
        return 1
    value = render(raw, context, step=step.name, field="loop.spec.max_in_flight")
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"max_in_flight rendered to {value!r}, expected a positive integer"
        ) from exc
    return max(1, number)


def _exit(
    out: _Out,
    step: Step,
    status: str,
    error: dict[str, Any] | None = None,
    jump_to: str | None = None,
) -> None:
    """Finish `step`: apply its `set`, choose arcs, record both in `step.exit`."""
    state = out.state
    rec = state.steps[step.name]
    if status != "completed":
        nowhere: StepExitPayload = {"next": []}
        out.emit(ev.STEP_EXIT, step.name, status="failed", error=error, payload=nowhere)
        return
    raw = rec.result
    if rec.outcome == ev.CALL_ERROR:
        output = envelope("error", raw, rec.error, 1, 0.0)
    else:
        output = envelope("ok", raw, None, 1, 0.0)
    front: dict[str, Any] = {
        "output": output,
        "result": result_view(raw, rec.tasks),
        "response": result_view(raw, rec.tasks),
        "event": {"name": rec.outcome, "step": step.name},
    }
    if rec.outcome == ev.CALL_ERROR:
        # NoETL's render context binds `error` (= `output.error`) only when there is one.
        front["error"] = output["error"]
    loop = state.loop_of(step.name) if step.loop is not None else None
    if loop is not None:
        front["loop"] = finished_loop(loop)
    elif step.loop is not None and step.loop.mode == "spark" and isinstance(raw, dict):
        # A spark loop has no loop record: its stats say how many items it ran.
        total = (raw.get("stats") or {}).get("total")
        if isinstance(total, int):
            ran = int(raw.get("row_count") or 0)
            front["loop"] = loop_view(max(ran - 1, 0), total, done=True)
            front["loop"]["first"] = ran == 1
    base = state.context()
    updates: dict[str, Any] = {}
    targets: list[str] = []
    # One work and output budget for the step's `set` and all its arcs: many small
    # templates over the same values must not add up to what one may not do.
    try:
        with render_budget():
            if step.set:
                updates = render_set(
                    step.set, layered(front, base), state.ctx, step=step.name, field="set"
                )
            ctx_now = {**state.ctx, **updates}
            scope = layered({**front, "ctx": ctx_now, "vars": ctx_now}, base)
            if jump_to is not None:
                targets = [jump_to]
            else:
                for arc in step.next.arcs:
                    if (
                        arc.when is None
                        or (isinstance(arc.when, bool) and arc.when)
                        or (
                            not isinstance(arc.when, bool)
                            and truthy(
                                render(arc.when, scope, step=step.name, field="next.arcs.when")
                            )
                        )
                    ):
                        if arc.set:
                            arc_updates = render_set(
                                arc.set, scope, ctx_now, step=step.name, field="next.arcs.set"
                            )
                            updates.update(arc_updates)
                            ctx_now = {**ctx_now, **arc_updates}
                            scope = layered({**front, "ctx": ctx_now, "vars": ctx_now}, base)
                        if arc.step not in targets:
                            targets.append(arc.step)
                        if step.next.mode == "exclusive":
                            break
    except TemplateError as exc:
        failed: StepExitPayload = {"next": []}
        out.emit(
            ev.STEP_EXIT, step.name, status="failed", error=_template_error(exc), payload=failed
        )
        return
    payload: StepExitPayload = {"next": targets}
    if updates:
        payload["set"] = updates
    out.emit(ev.STEP_EXIT, step.name, status="completed", payload=payload)


def finished_loop(loop: LoopRecord) -> dict[str, Any]:
    """`loop` on the arcs and `set` of a loop step (`loop_view`), as NoETL's render context
    has it once the loop is done: `index` the last element issued, `first` whether only
    one was, `length` the collection's size, `done` true."""
    issued = loop.next_index
    view = loop_view(max(issued - 1, 0), loop.size, done=True)
    view["first"] = issued == 1
    return view


def _admitted(step: Step, context: Mapping[str, Any]) -> bool:
    for when, allow in step.admit:
        if when is None or (isinstance(when, bool) and when):
            return allow
        if not isinstance(when, bool) and truthy(
            render(when, context, step=step.name, field="spec.policy.admit")
        ):
            return allow
    return True


def _enter_step(out: _Out, name: str) -> None:
    state = out.state
    step = state.playbook.steps[name]
    if step.admit:
        try:
            admitted = _admitted(step, state.context())
        except TemplateError as exc:
            _exit(out, step, "failed", _template_error(exc))
            return
        if not admitted:
            skipped: StepExitPayload = {"next": [], "reason": "not admitted"}
            out.emit(ev.STEP_EXIT, name, status="skipped", payload=skipped)
            return
    # A `mode: spark` loop is one command: its items run as Spark tasks in the runtime
    # that claims it (flowtide.spark.loop), its result a reference with their stats.
    if step.loop is not None and step.loop.mode != "spark":
        base = state.context()
        # A cursor loop's collection grows with each claim (`loop.claimed`).
        cursor = step.loop.mode == "cursor"
        try:
            collection = (
                []
                if cursor
                else _collection(render(step.loop.collection, base, step=name, field="loop.in"))
            )
            mif = _max_in_flight(step, base)
        except TemplateError as exc:
            _exit(out, step, "failed", _template_error(exc))
            return
        except ValueError as exc:
            _exit(
                out, step, "failed", {"kind": "loop_error", "message": str(exc), "retryable": False}
            )
            return
        payload: LoopStartedPayload = {
            "instance": state.steps[name].runs,
            "iterator": step.loop.iterator,
            "mode": step.loop.mode,
            "max_in_flight": mif,
            "size": len(collection),
            "collection": [plain(x) for x in collection],
        }
        if cursor:
            payload["cursor"] = True
            payload["process"] = step.loop.frame_process
            payload["max_rows"] = step.loop.frame_max_rows
        out.emit(ev.LOOP_STARTED, name, payload=payload)
        return
    if not step.tasks:
        _exit(out, step, "completed")
        return
    out.issue(name)


def _maybe_finish(out: _Out, entering: set[str] | None = None) -> None:
    """Release fan-in steps no running (or just entered) step can still reach; finish the
    workflow when nothing is left to do."""
    state = out.state
    if state.terminal or state.status == "cancelling":
        return
    order = list(state.playbook.steps)
    released = False
    for join in sorted(state.waiting, key=order.index):
        blockers = (state.active | state.waiting | (entering or set())) - {join}
        if any(join in state.playbook.reachable.get(b, ()) for b in blockers):
            continue
        out.emit(ev.STEP_ENTER, join, status="running")
        released = True
    if released or entering:
        return
    if not state.active and not state.waiting and not state.commands:
        completed: PlaybookCompletedPayload = {
            "last_step": state.last_finished,
            "result": state.result(),
        }
        out.emit(ev.WORKFLOW_COMPLETED, status="completed")
        out.emit(ev.PLAYBOOK_COMPLETED, status="completed", payload=completed)


def _seconds(limit: float) -> str:
    """`90s`, `15m`, `2h` as a playbook writes them (whole units when they fit)."""
    for unit, size in (("h", 3600), ("m", 60)):
        if limit >= size and limit % size == 0:
            return f"{int(limit // size)}{unit}"
    return f"{limit:g}s"


def _fail(out: _Out, step: str | None, error: dict[str, Any] | None) -> None:
    err = dict(error or {})
    err.setdefault("step", step)
    definition = out.state.playbook.steps.get(step or "")
    if definition is not None and definition.line is not None:
        # where the failing step is written, so the message can point into the file
        err.setdefault("line", definition.line)
    out.emit(ev.WORKFLOW_FAILED, step, status="failed", error=err)
    out.emit(ev.PLAYBOOK_FAILED, step, status="failed", error=err)


def _advance_loop(out: _Out, name: str) -> None:
    state = out.state
    loop = state.loop_of(name)
    if loop is None or loop.finished:
        return
    if loop.fail_error is not None:
        step = state.playbook.steps[name]
        _exit(out, step, "failed", loop.fail_error)
        return
    if loop.cursor:
        _advance_cursor(out, name)
        return
    if not loop.broken:
        # A chunk of iterations is one command in flight (`flowtide.engine.chunks`).
        in_flight = len(loop.commands)
        next_index = loop.next_index
        step = state.playbook.steps[name]
        while in_flight < loop.max_in_flight and next_index < loop.size:
            count = chunk_size(state, step, loop, next_index)
            out.issue(name, instance=loop.instance, index=next_index, count=count)
            next_index += count
            in_flight += 1
    if (
        not loop.in_flight
        and not any(c.step == name for c in out.commands)
        and (loop.broken or loop.completed == loop.size)
    ):
        _loop_done(out, name, loop)


def _loop_done(out: _Out, name: str, loop: LoopRecord) -> None:
    done: LoopDonePayload = {
        "instance": loop.instance,
        "stats": {"total": loop.size, "success": loop.success, "failed": loop.failed},
    }
    out.emit(ev.LOOP_DONE, name, status="completed", payload=done)


def _advance_cursor(out: _Out, name: str) -> None:
    """A cursor loop: issue claimed items up to max_in_flight; claim again (one claim at a
    time) when every claimed item is issued, there is room and no claim came back empty;
    finish once a claim came back empty and nothing is in flight."""
    state = out.state
    loop = state.loop_of(name)
    assert loop is not None
    in_flight = len(loop.in_flight)
    next_index = loop.next_index
    claiming = loop.claiming
    if not loop.broken:
        while in_flight < loop.max_in_flight and next_index < loop.size:
            out.issue(name, instance=loop.instance, index=next_index)
            next_index += 1
            in_flight += 1
        if (
            not claiming
            and not loop.exhausted
            and next_index >= loop.size
            and in_flight < loop.max_in_flight
        ):
            out.issue(name, instance=loop.instance, cursor=True)
            claiming = True
    if (
        not loop.in_flight
        and not claiming
        and not any(c.step == name for c in out.commands)
        and (loop.broken or (loop.exhausted and loop.completed == loop.size))
    ):
        _loop_done(out, name, loop)


def _rows_of(result: Any) -> list[Any]:
    """The rows a claim returned: a postgres result's `rows`, or a plain list."""
    if isinstance(result, dict):
        result = result.get("rows")
    if isinstance(result, list | tuple):
        return [plain(row) for row in result]
    return []


def decide(state: ExecutionState, event: Event, now: float, new_id: IdSource) -> Decision:
    """What follows from `event`, which has already been applied to `state`."""
    out = _Out(state, event, now, new_id)
    kind = event.type
    if state.terminal and kind not in (ev.PLAYBOOK_INITIALIZED,):
        return out.result()
    if kind == ev.PLAYBOOK_INITIALIZED:
        out.emit(ev.WORKFLOW_INITIALIZED, status="running")
    elif kind == ev.WORKFLOW_INITIALIZED:
        out.emit(ev.STEP_ENTER, state.playbook.entry, status="running")
    elif kind == ev.EXECUTION_CANCELLED:
        out.emit(
            ev.PLAYBOOK_CANCELLED,
            status="cancelled",
            error=event.error or {"kind": "cancelled", "message": "cancelled"},
        )
    elif state.status == "cancelling":
        pass
    elif kind == ev.EXECUTION_DEADLINE_MISSED:
        missed = payload_of(event, ev.EXECUTION_DEADLINE_MISSED)
        if missed.get("kind") == "timeout":
            # Past the playbook's `timeout:` the run fails; an `sla:` only tells someone.
            _fail(
                out,
                None,
                {
                    "kind": "deadline_exceeded",
                    "message": f"the run went past its timeout of {_seconds(missed['limit'])}",
                },
            )
    elif kind == ev.EXECUTION_STALLED:
        stalled = payload_of(event, ev.EXECUTION_STALLED)
        _fail(
            out,
            None,
            {
                "kind": "stalled",
                "message": f"nothing ran or waited for {_seconds(stalled['idle'])} and a"
                " re-drive found nothing to do: the run cannot go on",
            },
        )
    elif kind == ev.STEP_ENTER:
        _enter_step(out, event.step or "")
    elif kind == ev.LOOP_STARTED:
        _advance_loop(out, event.step or "")
    elif kind in (ev.COMMAND_COMPLETED, ev.COMMAND_FAILED):
        _on_command_result(out, event)
    elif kind in (ev.LOOP_ITEM, ev.LOOP_CLAIMED):
        _advance_loop(out, event.step or "")
    elif kind == ev.LOOP_DONE:
        _exit(out, state.playbook.steps[event.step or ""], "completed")
    elif kind == ev.STEP_EXIT:
        if event.status == "failed":
            _fail(out, event.step, event.error)
        else:
            entering: list[str] = []
            for target in payload_of(event, ev.STEP_EXIT).get("next") or []:
                if len(state.playbook.upstreams.get(target, ())) > 1:
                    continue  # fan-in: entered by _maybe_finish once its upstreams settle
                if target in state.active or target in entering:
                    continue
                entering.append(target)
                out.emit(ev.STEP_ENTER, target, status="running")
            _maybe_finish(out, entering=set(entering))
    return out.result()


def _on_command_result(out: _Out, event: Event) -> None:
    state = out.state
    if not state.last_report_counted:
        return  # apply ignored it (late or duplicate): nothing follows from it
    payload = payload_of(event, ev.COMMAND_COMPLETED)  # or command.failed: the same
    claim = state.last_report
    # Which step and iteration it ends: the issued command's, never what the report
    # says (a worker's report of one iteration must not end the whole loop).
    index = claim.loop_index if claim is not None else payload.get("loop_index")
    instance = claim.loop_instance if claim is not None else payload.get("loop_instance")
    step = state.playbook.steps.get(claim.step if claim is not None else event.step or "")
    if step is None:
        return
    if claim is not None and claim.cursor:
        loop = state.loops.get((step.name, claim.loop_instance or 0))
        if loop is not None and loop.fail_error is not None:
            _advance_loop(out, step.name)  # the claim failed: so does the step
            return
        rows = _rows_of(payload.get("result"))
        claimed: LoopClaimedPayload = {
            "instance": claim.loop_instance,
            "rows": rows,
            "count": len(rows),
            "exhausted": not rows,
        }
        out.emit(
            ev.LOOP_CLAIMED, step.name, status="ok", payload=claimed, command_id=event.command_id
        )
        return
    if index is not None:
        item: LoopItemPayload = {"instance": instance, "index": index}
        out.emit(
            ev.LOOP_ITEM,
            step.name,
            status=payload.get("status", "ok"),
            payload=item,
            command_id=event.command_id,
        )
        return
    rec = state.steps[step.name]
    if rec.status != "running":
        return  # the step already finished: a duplicate report
    action = payload.get("action", "continue")
    if action == "fail":
        _exit(out, step, "failed", event.error or {"kind": "error", "message": "step failed"})
        return
    _exit(out, step, "completed", jump_to=payload.get("jump_to"))
