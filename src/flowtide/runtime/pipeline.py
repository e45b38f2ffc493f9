"""Run one step: its task(s), with policies, retries and task-level `set`.

This is the worker side (`flowtide.runtime.command` runs a whole command with it).
`StepRunner.run` orchestrates: each task rendered against the execution's context
snapshot plus the pipeline's own variables (`flowtide.runtime.rendering`), called, its
call recorded (`flowtide.runtime.outcome`), then what its policy decides on NoETL's
`output` envelope (`flowtide.engine.policy.next_action`) carried out. The `Outcome` it
returns, its results over the inline limit stored by reference (`_recorded`), is what
the engine turns into events. A cursor loop's claim query runs here too (`claim`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flowtide import artifacts
from flowtide.engine.context import envelope, layered, plain, result_view
from flowtide.engine.policy import Action, next_action
from flowtide.errors import TemplateError, ToolError
from flowtide.jsonvalues import dumps, to_json
from flowtide.logs import current_log
from flowtide.playbook.model import Playbook, Step, Task
from flowtide.playbook.template import render
from flowtide.redaction import remember
from flowtide.runtime.outcome import Call, Outcome, Record, error_dict
from flowtide.runtime.pytrace import with_traceback
from flowtide.runtime.rendering import (
    apply_set,
    own_result,
    pipeline_locals,
    prepare,
    sequence_names,
    shown_input,
    task_layers,
    timeout,
)
from flowtide.settings import LimitsSection, current
from flowtide.storable import bad_text, clean_text, clean_value, maybe_bad_json
from flowtide.tools.base import ToolContext
from flowtide.tools.registry import get_tool

STDOUT_LIMIT = 16 * 1024
# The result limits are the settings tree's (flowtide.settings.LimitsSection), read
# once per process when its first result is recorded:
# max_result_bytes (FLOWTIDE_MAX_RESULT_BYTES): largest result recorded in events, as
# JSON: results travel in events (to the server in a worker's report, into the event
# log). A bigger one is stored by reference (`flowtide.artifacts`); one that cannot be is
# a `result_too_large` error, never a report the server refuses.
# max_stored_result_bytes (FLOWTIDE_MAX_STORED_RESULT_BYTES, JSON bytes): the artifact
# store has a limit too; past it the step fails with `result_too_large`.


def _json_result(result: Any) -> tuple[Any, str | None]:
    """`result` as plain JSON by the one rule set (`flowtide.jsonvalues`), and its JSON
    text (None for None and booleans).

    The tools that make non-JSON values convert them themselves, so almost every result
    passes the strict encoding as is; this catches the rest (a tool added later, a
    sub-playbook's result), so that no step's result depends on the tool that made it.

    Raises:
        ToolError: code ResultNotSerializable (`to_json`).
    """
    if result is None or type(result) is bool:
        return result, None
    try:
        text = dumps(result)
    except (TypeError, ValueError):  # a NaN, a Decimal, a cycle, a non-text key...
        result = to_json(result)
        text = dumps(result)
    if maybe_bad_json(text):
        found = bad_text(result, "result")
        if found is not None:
            where, what = found
            raise ToolError(
                f"InvalidText: {where} holds {what}, which cannot be stored: results must"
                " be valid Unicode text without NUL (replace it, e.g."
                " text.encode('utf-8', 'replace').decode(), or return bytes as base64)",
                kind="invalid_result",
                code="InvalidText",
                data={"path": where},
            )
    return result, text


def _recorded(
    value: Any,
    text: str,
    spec: artifacts.OutputSpec,
    secrets: set[str],
    store: Any,
) -> Any:
    """What a step records for its result `value` (`text`: its JSON): the value itself, or,
    over the inline
    limit, the reference `store(value, text)` returns. The limit is the step's own
    `output.inline_max_bytes`, else NoETL's 64 KB for a step that declares an `output`,
    else MAX_RESULT_BYTES (what events can carry): a step that says nothing keeps every
    result events can hold inline, as before.

    Raises:
        ToolError: kind result_too_large (over MAX_RESULT_BYTES and holding a credential
            value the tools touched, which is never written to the artifact store: the
            event log seals such values, the store cannot; or over
            MAX_STORED_RESULT_BYTES), or the store's errors.
    """
    limits = current(LimitsSection)
    MAX_RESULT_BYTES = limits.max_result_bytes
    MAX_STORED_RESULT_BYTES = limits.max_stored_result_bytes
    size = len(text.encode("utf-8", "replace"))
    if spec.inline_max_bytes is not None:
        limit = spec.inline_max_bytes
    else:
        limit = limits.inline_max_bytes if spec.declared else MAX_RESULT_BYTES
    if size <= min(limit, MAX_RESULT_BYTES):
        return value
    if any(secret in text for secret in secrets):
        if size <= MAX_RESULT_BYTES:
            return value
        raise ToolError(
            f"the result is {size} bytes of JSON, over the {MAX_RESULT_BYTES}-byte limit"
            " (FLOWTIDE_MAX_RESULT_BYTES), and holds a credential value, so it is not"
            " stored by reference: write large data to a table or a file",
            kind="result_too_large",
        )
    if size > MAX_STORED_RESULT_BYTES:
        raise ToolError(
            f"the result is {size} bytes of JSON, over the {MAX_STORED_RESULT_BYTES}-byte"
            " limit of results stored by reference (FLOWTIDE_MAX_STORED_RESULT_BYTES):"
            " write large data to a table or a file",
            kind="result_too_large",
        )
    return store(value, text)


_CONTINUE = Action("continue")


class _Made:
    """What one attempt of a task made, and the scopes its policy and `set` read (made
    when first read: a loop's item without rules or `set` never needs them)."""

    __slots__ = (
        "status",
        "result",
        "error",
        "output",
        "scope",
        "text",
        "_task",
        "_step",
        "_ended",
        "_view",
        "_policy",
    )

    def __init__(
        self,
        task: str,
        status: str,
        result: Any,
        error: dict[str, Any] | None,
        output: dict[str, Any],
        scope: Mapping[str, Any],
        text: str | None = None,
        step: str | None = None,
    ) -> None:
        self.status = status  # ok | error
        self.result = result
        self.error = error
        #: NoETL's envelope of the call, which the policy judges (`output`).
        self.output = output
        #: The scope the task's fields rendered against.
        self.scope = scope
        #: `result`'s JSON text, when it was made (`_json_result`).
        self.text = text
        self._task = task
        self._step = step
        # As the call ended (`status` and `error` may change after its rules are judged).
        self._ended = (status, error)
        self._view: Any = _UNSET
        self._policy: Mapping[str, Any] | None = None

    @property
    def view(self) -> Any:
        """The result as templates read it (`result_view`)."""
        if self._view is _UNSET:
            self._view = result_view(self.result)
        return self._view

    @property
    def policy_scope(self) -> Mapping[str, Any]:
        """`scope` with the task's own result (`own_result`) as the call ended: what its
        rules and `then.set` see."""
        if self._policy is None:
            status, error = self._ended
            own = own_result(self._task, status, self.view, self.output, error, self._step)
            self._policy = layered(own, self.scope)
        return self._policy


_UNSET: Any = object()


def _line(part: str) -> str:
    """A piece of `ToolContext.stdout` as it was printed (a python step's are lines
    without their newline)."""
    return part if part.endswith("\n") else part + "\n"


class StepRunner:
    """Executes commands for one playbook. Thread-safe: one instance serves all workers."""

    def __init__(
        self,
        playbook: Playbook,
        *,
        credentials: Any = None,
        run_playbook: Callable[..., Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        data_dir: Path | None = None,
    ) -> None:
        self.playbook = playbook
        self.base_dir = playbook.base_dir  # resolved once: Path.resolve() stats the disk
        self.data_dir = data_dir
        self.credentials = credentials
        self.run_playbook = run_playbook
        self.sleep = sleep
        self._output_specs: dict[str, artifacts.OutputSpec] = {}

    def _tool_context(
        self,
        execution_id: int,
        step: Step,
        task: str,
        scope: Mapping[str, Any],
        secrets: set[str],
        cancelled: Callable[[], bool] | None,
        index: int | None = None,
        attempt: int = 1,
        credentials: Any = None,
    ) -> ToolContext:
        return ToolContext(
            execution_id=execution_id,
            step=step.name,
            task=task,
            base_dir=self.base_dir,
            credentials=credentials if credentials is not None else self.credentials,
            secrets=secrets,
            render_context=scope,
            run_playbook=self.run_playbook,
            cancelled=cancelled,
            executor=self.playbook.executor,
            data_dir=self.data_dir,
            loop_index=index,
            attempt=attempt,
            log=current_log.get(),
        )

    def run(
        self,
        step: Step,
        base: Mapping[str, Any],
        ctx: Mapping[str, Any],
        *,
        execution_id: int,
        iterator: str | None = None,
        element: Any = None,
        index: int | None = None,
        size: int | None = None,
        cancelled: Callable[[], bool] | None = None,
        credentials: Any = None,
    ) -> Outcome:
        """Run one command of `step`: each task rendered, called (again while its policy
        says retry), recorded, then what its policy decided (`next_action`) carried out.
        `size`: the loop's collection size, for `loop.length` and `iter._last`.
        `credentials`: this command's resolver, when the runner's own is not the one (a
        distributed worker asks per command)."""
        record = Record(time.time())
        ctx_local = dict(ctx)
        pipe: dict[str, Any] = {}
        views: dict[str, Any] = {}  # the results of the tasks run so far (`results`)
        iter_extra: dict[str, Any] = {}
        # The pipeline's most recent call: its `output` envelope and, of the calls that
        # succeeded, the last result (`_prev`); see `pipeline_locals`.
        last_output: dict[str, Any] | None = None
        prev_result: Any = None
        made: _Made | None = None
        action = _CONTINUE
        names = [t.name for t in step.tasks]
        i = 0
        jumps = 0
        while i < len(step.tasks):
            if cancelled is not None and cancelled():
                return record.failed({"kind": "cancelled", "message": "execution cancelled"})
            task = step.tasks[i]
            layers = task_layers(pipe, ctx_local, base, iterator, element, index, iter_extra, size)
            attempt = 0
            while True:
                attempt += 1
                local = pipeline_locals(last_output, prev_result)
                if step.pipeline:
                    local.append(sequence_names(task.name, attempt, dict(views)))
                scope = layered(*local, *layers)
                made = self._call(
                    step,
                    task,
                    scope,
                    record,
                    execution_id,
                    attempt,
                    iterator,
                    element,
                    index,
                    cancelled,
                    credentials,
                )
                last_output = made.output
                if made.status == "ok":
                    prev_result = made.view
                action = next_action(
                    task.policy,
                    made.output,
                    # The rules' scope, made only when there are rules to judge it.
                    made.policy_scope if task.policy is not None and task.policy.rules else {},
                    attempt,
                    step=step.name,
                    cancelled=cancelled,
                )
                if action.do != "retry":
                    break
                self.sleep(action.delay)
            if action.broken is not None and made.status == "ok":
                made.status, made.error = "error", error_dict(action.broken)
            # policy `then.set` sees the envelope; task-level `set` sees the raw result
            try:
                if action.set:
                    apply_set(
                        action.set, made.policy_scope, ctx_local, record.ctx, iter_extra, pipe, step
                    )
                    ctx_local = {**ctx_local, **record.ctx}
                if task.set:
                    set_scope = layered(
                        own_result(
                            task.name, made.status, made.view, made.result, made.error, step.name
                        ),
                        made.scope,
                    )
                    apply_set(task.set, set_scope, ctx_local, record.ctx, iter_extra, pipe, step)
                    ctx_local = {**ctx_local, **record.ctx}
            except TemplateError as exc:
                return record.failed(error_dict(exc))
            record.results[task.name] = made.result
            pipe[task.name] = views[task.name] = (
                made.view
            )  # one view of the result (never changed in place)
            if action.do == "fail":
                error = made.error or {
                    "kind": "policy",
                    "message": f"policy failed task '{task.name}'",
                }
                tasks = record.results if step.pipeline else None
                failed = record.outcome("error", plain(made.result), "fail", error, None, tasks)
                return self._by_reference(step, execution_id, failed)
            if action.do == "break":
                break
            if action.do == "jump":
                target = action.to or ""
                if target in names and jumps < 10_000:
                    jumps += 1  # to a task of this pipeline
                    i = names.index(target)
                    continue
                break  # out of the step, to the step `target`
            i += 1
        finished = self._finished(step, record, made, action)
        return self._by_reference(step, execution_id, finished, made)

    def _call(
        self,
        step: Step,
        task: Task,
        scope: Mapping[str, Any],
        record: Record,
        execution_id: int,
        attempt: int,
        iterator: str | None,
        element: Any,
        index: int | None,
        cancelled: Callable[[], bool] | None,
        credentials: Any,
    ) -> _Made:
        """One attempt of `task`: rendered, run by its kind's runner (or its
        `ToolSpec.call`), its `Call` and the secrets it touched recorded."""
        secrets: set[str] = set()
        tctx = self._tool_context(
            execution_id, step, task.name, scope, secrets, cancelled, index, attempt, credentials
        )
        t0, began = time.perf_counter(), time.time()
        error: dict[str, Any] | None = None
        result: Any = None
        text: str | None = None
        tool_input: Any = None
        try:
            call = prepare(task, scope, step, self.playbook, iterator, element, index)
            tool_input = call.input
            if call.render_context is not None:
                tctx.render_context = call.render_context
            tctx.timeout = timeout(call.config)
            if call.spec is not None and call.spec.call is not None:
                result = call.spec.invoke(call.config, tctx)
            else:
                result = get_tool(call.kind).run(call.config, tctx)
            result, text = _json_result(result)
            status = "ok"
        except ToolError as exc:
            status, error = "error", clean_value(error_dict(exc))
            if exc.kind == "python_error":
                error = with_traceback(error, exc.data, self.playbook, step, task)
            result = clean_value(exc.data)
        except TemplateError as exc:
            status, error = "error", clean_value(error_dict(exc))
        except Exception as exc:  # noqa: BLE001 - a tool bug must fail the step, not the worker
            status, error = "error", clean_value(error_dict(exc))
        duration_ms = round((time.perf_counter() - t0) * 1000, 3)
        if status == "error" and tool_input is not None:
            # What the failed call was given, for whoever debugs it (masked where shown,
            # sealed at rest like any value of the secret set).
            tctx.call_meta["input"] = shown_input(tool_input)
        # Nothing is scrubbed here: a later task, policy or step reads the result exactly
        # as the tool returned it (a password `demo` must not turn `demographics` into
        # `***graphics`). The values are reported instead.
        if secrets:
            record.secrets |= secrets
            remember(secrets)
        # What a step printed is a log: text that cannot be stored is replaced (U+FFFD).
        out_text = clean_text("".join(map(_line, tctx.stdout))) if tctx.stdout else ""
        record.calls.append(
            Call(
                task.name,
                attempt,
                status == "ok",
                duration_ms,
                began,
                error,
                out_text[:STDOUT_LIMIT] or None,
                dict(tctx.call_meta) if tctx.call_meta else {},
            )
        )
        output = envelope(status, result, error, attempt, duration_ms)
        return _Made(task.name, status, result, error, output, scope, text, step.name)

    @staticmethod
    def _finished(step: Step, record: Record, last: _Made | None, action: Action) -> Outcome:
        """The outcome of a command whose tasks ran to the end, a `break` or a `jump` out
        of the step: the last task's status, result and error."""
        status, result, error = "ok", None, None
        if last is not None:
            status, result, error = last.status, last.result, last.error
        if status == "error" and result is None:
            result = {"status": "error", "error": error}
        tasks = (
            {k: plain(v) for k, v in record.results.items()}
            if step.pipeline and len(step.tasks) > 1
            else None
        )
        if action.do == "break":
            return record.outcome(status, plain(result), "break", error, None, tasks)
        if action.do == "jump":  # out of the step
            return record.outcome(status, plain(result), "jump", error, action.to or "", tasks)
        return record.outcome(status, plain(result), "continue", error, None, tasks)

    def _by_reference(
        self, step: Step, execution_id: int, outcome: Outcome, made: _Made | None = None
    ) -> Outcome:
        """`outcome` with its results over the inline limit stored by reference
        (`_recorded`); a result that cannot be recorded fails the step. `made`: the last
        call, whose result's JSON text is known (not made again); an inline result's text
        is kept in `Outcome.text`."""
        try:
            spec = self._output_spec(step)

            def store(value: Any, text: str) -> dict[str, Any]:
                return artifacts.externalize(
                    value,
                    text,
                    spec,
                    execution_id=execution_id,
                    step=step.name,
                    data_dir=self.data_dir,
                )

            stored: dict[str, Any] = {}

            def record(value: Any) -> Any:
                if value is None or isinstance(value, bool | int | float):
                    return value
                if made is not None and made.text is not None and value is made.result:
                    text = made.text
                else:
                    text = dumps(value)
                if text not in stored:  # the last task's result is the step's too
                    stored[text] = _recorded(value, text, spec, outcome.secrets, store)
                return stored[text]

            result = record(outcome.result)
            tasks = (
                {name: record(value) for name, value in outcome.tasks.items()}
                if outcome.tasks
                else outcome.tasks
            )
        except ToolError as exc:
            outcome.status, outcome.action, outcome.error = "error", "fail", error_dict(exc)
            outcome.result = None
            outcome.tasks = None
            return outcome
        if result is outcome.result and made is not None and result is made.result:
            outcome.text = made.text
        outcome.result, outcome.tasks = result, tasks
        return outcome

    def _output_spec(self, step: Step) -> artifacts.OutputSpec:
        """`step`'s output settings (`artifacts.output_spec`), read once per step: they are
        the playbook's, as written.

        Raises:
            ToolError: config_error, a shape `output_spec` refuses (asked again next time).
        """
        spec = self._output_specs.get(step.name)
        if spec is None:
            last = step.tasks[-1].config if step.tasks else {}
            spec = artifacts.output_spec(step.output, last.get("output"), last.get("output_select"))
            self._output_specs[step.name] = spec
        return spec

    def claim(
        self,
        step: Step,
        base: Mapping[str, Any],
        ctx: Mapping[str, Any],
        *,
        execution_id: int,
        cancelled: Callable[[], bool] | None = None,
        credentials: Any = None,
    ) -> Outcome:
        """Run a cursor loop's claim query. The result is `{rows, row_count}`; templates
        in the cursor see `__frame_max_rows` (the loop's `spec.frame.max_rows`)."""
        assert step.loop is not None and step.loop.cursor is not None
        cursor = step.loop.cursor
        started = time.time()
        scope = layered(
            {"__frame_max_rows": step.loop.frame_max_rows},
            {"ctx": ctx, "vars": ctx},
            base,
        )
        secrets: set[str] = set()
        tctx = self._tool_context(
            execution_id, step, cursor.name, scope, secrets, cancelled, credentials=credentials
        )
        t0, began = time.perf_counter(), time.time()
        error: dict[str, Any] | None = None
        result: Any = None
        try:
            config = {
                k: render(v, scope, step=step.name, field=f"loop.cursor.{k}")
                for k, v in cursor.config.items()
            }
            config["command"] = config.pop("claim")
            tctx.timeout = timeout(config)
            raw = get_tool(cursor.kind).run(config, tctx)
            rows = list(raw.get("rows") or []) if isinstance(raw, Mapping) else []
            result = {"rows": rows, "row_count": len(rows)}
        except Exception as exc:  # noqa: BLE001 - a failed claim fails the loop, not the worker
            error = error_dict(exc)
        duration_ms = round((time.perf_counter() - t0) * 1000, 3)
        remember(secrets)
        call = Call(cursor.name, 1, error is None, duration_ms, began, error)
        if error is not None:
            return Outcome(
                "error",
                None,
                action="fail",
                error=error,
                calls=[call],
                started=started,
                secrets=secrets,
            )
        return Outcome("ok", result, calls=[call], started=started, secrets=secrets)
