"""Run one step: its task(s), with policies, retries and task-level `set`.

This is the worker side (`flowtide.runtime.command` runs a whole command with it). It renders each task against the execution's context
snapshot plus the pipeline's own variables, calls the tool, evaluates the policy on
NoETL's `output` envelope and returns an `Outcome` the engine turns into events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowtide import artifacts
from flowtide.engine.context import envelope, iteration_scope, layered, plain, result_view
from flowtide.engine.decide import render_set
from flowtide.engine.policy import retry_delay, select_rule
from flowtide.errors import FlowtideError, TemplateError, ToolError
from flowtide.jsonvalues import dumps, to_json
from flowtide.playbook.model import Playbook, Step, Task
from flowtide.playbook.template import render
from flowtide.redaction import remember
from flowtide.settings import LimitsSection, current
from flowtide.tools import kinds
from flowtide.tools.base import ToolContext
from flowtide.tools.registry import get_tool

STDOUT_LIMIT = 16 * 1024
#: How much of a failed call's rendered input its event keeps (`shown_input`).
INPUT_SHOWN_BYTES = 4 * 1024
# The result limits are the settings tree's (flowtide.settings.LimitsSection), read
# once per process when its first result is recorded:
# max_result_bytes (FLOWTIDE_MAX_RESULT_BYTES): largest result recorded in events, as
# JSON: results travel in events (to the server in a worker's report, into the event
# log). A bigger one is stored by reference (`flowtide.artifacts`); one that cannot be is
# a `result_too_large` error, never a report the server refuses.
# max_stored_result_bytes (FLOWTIDE_MAX_STORED_RESULT_BYTES, JSON bytes): the artifact
# store has a limit too; past it the step fails with `result_too_large`.


def shown_input(value: Any) -> Any:
    """A failed call's rendered input as its `call.error` event keeps it: the value when
    its JSON is at most `INPUT_SHOWN_BYTES`, else its size and top-level keys (never a
    cut text: a secret cut in two would no longer be masked)."""
    text = json.dumps(value, default=str, separators=(",", ":"))
    if len(text) <= INPUT_SHOWN_BYTES:
        return json.loads(text)
    keys = [str(k) for k in list(value)[:50]] if isinstance(value, dict) else None
    return {"truncated": True, "bytes": len(text.encode()), "keys": keys}


def _json_result(result: Any) -> Any:
    """`result` as plain JSON by the one rule set (`flowtide.jsonvalues`).

    The tools that make non-JSON values convert them themselves, so almost every result
    passes the strict encoding as is; this catches the rest (a tool added later, a
    sub-playbook's result), so that no step's result depends on the tool that made it.

    Raises:
        ToolError: code ResultNotSerializable (`to_json`).
    """
    if result is None or type(result) is bool:
        return result
    try:
        dumps(result)
    except (TypeError, ValueError):  # a NaN, a Decimal, a cycle, a non-text key...
        result = to_json(result)
    return result


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


@dataclass
class Call:
    """One attempt of one task (becomes a call.done / call.error event)."""

    task: str
    attempt: int
    ok: bool
    duration_ms: float
    started: float
    error: dict[str, Any] | None = None
    stdout: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # the tool's call_meta


@dataclass
class Outcome:
    status: str  # ok | error
    result: Any
    action: str = "continue"  # continue | break | fail | jump
    error: dict[str, Any] | None = None
    jump_to: str | None = None
    ctx: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, Any] | None = None
    calls: list[Call] = field(default_factory=list)
    started: float = 0.0
    #: Values the tools touched (passwords, tokens, DSNs). The results, errors and
    #: output above hold them as the tools saw them: they join the execution's secret
    #: set (a `secrets.added` event), which seals them at rest and masks them on display.
    secrets: set[str] = field(default_factory=set)


def _error_dict(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, ToolError):
        return exc.to_dict()
    if isinstance(exc, TemplateError):
        return {
            "kind": "template_error",
            "retryable": False,
            "code": None,
            "message": str(exc),
            "http_status": None,
            "status": None,
            "missing": exc.missing,
        }
    if isinstance(exc, FlowtideError):
        return {
            "kind": "error",
            "retryable": False,
            "code": type(exc).__name__,
            "message": str(exc),
            "http_status": None,
            "status": None,
        }
    return {
        "kind": "internal_error",
        "retryable": False,
        "code": type(exc).__name__,
        "message": f"{type(exc).__name__}: {exc}",
        "http_status": None,
        "status": None,
    }


def crashed(exc: BaseException) -> Outcome:
    """The outcome of a command whose run raised (a runtime bug): a failed command,
    never a lost one."""
    return Outcome(
        "error",
        None,
        action="fail",
        error={"kind": "internal_error", "message": f"{type(exc).__name__}: {exc}"},
        started=time.time(),
    )


def child_result(
    path: str,
    child_id: int | str,
    status: str,
    error: Mapping[str, Any] | None,
    results: Mapping[str, Any],
    final: Any,
    return_step: str | None,
) -> Any:
    """What a `playbook` step returns once its child execution ended: the child's result,
    or `return_step`'s (`results` maps step names to results).

    Raises:
        ToolError: the child did not complete, or has no `return_step`.
    """
    if status != "completed":
        err = dict(error or {})
        raise ToolError(
            f"sub-playbook '{path}' (execution {child_id}) {status}: {err.get('message', '')}",
            kind="playbook_error",
            data={"execution_id": child_id, "error": err},
        )
    if return_step:
        if return_step not in results:
            raise ToolError(
                f"sub-playbook '{path}' has no step '{return_step}'", kind="config_error"
            )
        return results[return_step]
    return final


def pipeline_locals(
    last_output: Mapping[str, Any] | None, prev_result: Any
) -> list[dict[str, Any]]:
    """What a task's own fields see of the calls made before it in the same command:
    `output`, the envelope of the most recent call (the previous task's, or this task's
    previous attempt on a retry), and `_prev`, the last successful result. Nothing before
    the first call, so a first task's `output` is whatever the context has.

    NoETL: `noetl/worker/task_sequence_executor.py` keeps the last call's outcome and
    result in its `TaskSequenceContext` (`update_success`/`update_error`) and renders each
    task's config with them (`render_ctx = {**base_context, **ctx.results,
    **task_seq_dict}`); the cursor loop runs its tasks through the same executor
    (`noetl/worker/cursor_worker.py`). `batch_execution/frame_heartbeat_regression`'s
    `mark_done` writes `{{ output.data | tojson }}`, the HTTP task's result before it.
    """
    if last_output is None:
        return []
    return [{"output": last_output, "_prev": prev_result}]


def own_result(name: str, status: str, view: Any, output: Any) -> dict[str, Any]:
    """The names a task's policy rules and `set` see after its call: `output` (the
    envelope for rules, the raw result for a task `set`), `result`, and the task's own
    name bound to the result it just made, when it made one: for a single-tool step that
    name is the step's, so `then.set: {ctx.total: "{{ update_progress.total }}"}` in step
    `update_progress` reads the result the rule is judging.

    NoETL: `TaskSequenceContext.update_success` records `results[task_name]` before the
    rules are evaluated, and the rules render with the task results at the root of their
    context (`noetl/worker/task_sequence_executor.py`); the server likewise marks a step
    completed before its `set` renders, "set templates like {{ fetch_with_limit... }} need
    the step result" (`noetl/core/dsl/engine/executor/events.py`).
    """
    names = {name: view} if status == "ok" else {}
    return {**names, "output": output, "result": view}


def _rendered_config(task: Task, scope: Mapping[str, Any], step: Step) -> dict[str, Any]:
    """`task`'s config rendered against `scope`, but the fields its kind renders itself
    (`ToolSpec.unrendered`), which stay as written."""
    spec = kinds.find(task.kind)
    unrendered = spec.unrendered if spec is not None else ()
    return {
        k: (
            v
            if k in unrendered
            else _render_code(v, scope)
            if k == "code"
            else render(v, scope, step=step.name, field=k)
        )
        for k, v in task.config.items()
    }


def _render_code(code: Any, scope: Mapping[str, Any]) -> Any:
    """Jinja inside python `code` is rendered when it can be; code that merely contains
    `{{` (f-string escapes, dict literals) runs as written."""
    if not isinstance(code, str) or ("{{" not in code and "{%" not in code):
        return code
    try:
        rendered = render(code, scope)
    except TemplateError:
        return code
    return rendered if isinstance(rendered, str) else code


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
        )

    def _resolve(
        self, task: Task, scope: Mapping[str, Any], step: Step
    ) -> tuple[Task, dict[str, Any], dict[str, Any] | None]:
        """Rendered (config, input) of `task`, following `kind: workbook` to its action."""
        raw_input = task.input
        rendered_input = (
            render(raw_input, scope, step=step.name, field="input")
            if raw_input is not None
            else None
        )
        if task.kind == "workbook":
            action = self.playbook.workbook[str(task.config.get("name"))]
            defaults = action.input or {}
            merged = {**defaults, **(rendered_input or {})}
            inner_scope = layered(merged, scope)
            return action, _rendered_config(action, inner_scope, step), merged
        return task, _rendered_config(task, scope, step), rendered_input

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
        cancelled: Callable[[], bool] | None = None,
        credentials: Any = None,
    ) -> Outcome:
        """Run one command of `step`. `credentials`: this command's resolver, when the
        runner's own is not the one (a distributed worker asks per command)."""
        started = time.time()
        ctx_local = dict(ctx)
        ctx_updates: dict[str, Any] = {}
        pipe: dict[str, Any] = {}
        iter_extra: dict[str, Any] = {}
        results: dict[str, Any] = {}
        calls: list[Call] = []
        last_result: Any = None
        # The pipeline's most recent call: its `output` envelope and, of the calls that
        # succeeded, the last result (`_prev`); see `pipeline_locals`.
        last_output: dict[str, Any] | None = None
        prev_result: Any = None
        last_status = "ok"
        last_error: dict[str, Any] | None = None
        action = "continue"
        jump_to: str | None = None
        names = [t.name for t in step.tasks]
        touched: set[str] = set()
        i = 0
        jumps = 0
        while i < len(step.tasks):
            if cancelled is not None and cancelled():
                return Outcome(
                    "error",
                    None,
                    action="fail",
                    error={"kind": "cancelled", "message": "execution cancelled"},
                    ctx=ctx_updates,
                    calls=calls,
                    started=started,
                    secrets=touched,
                )
            task = step.tasks[i]
            layers: list[Mapping[str, Any]] = [pipe]
            if iterator is not None and index is not None:
                layers.append(iteration_scope(iterator, element, index, iter_extra))
            layers.append({"ctx": ctx_local, "vars": ctx_local})
            layers.append(base)
            secrets: set[str] = set()
            attempt = 0
            while True:
                attempt += 1
                scope = layered(*(pipeline_locals(last_output, prev_result)), *layers)
                t0 = time.perf_counter()
                tctx = self._tool_context(
                    execution_id,
                    step,
                    task.name,
                    scope,
                    secrets,
                    cancelled,
                    index,
                    attempt,
                    credentials,
                )
                error: dict[str, Any] | None = None
                result: Any = None
                tool_input: Any = None
                try:
                    effective, config, tool_input = self._resolve(task, scope, step)
                    if effective is not task:
                        # A workbook action's templates see its inputs over the scope.
                        tctx.render_context = layered(tool_input or {}, scope)
                    if effective.kind == "python" and iterator is not None:
                        # Python code inside a loop sees the element by its iterator name
                        # and `loop_index`, as templates do; explicit inputs win.
                        tool_input = {iterator: element, "loop_index": index, **(tool_input or {})}
                    if tool_input is not None:
                        config = {**config, "input": tool_input}
                    tctx.timeout = _timeout(config)
                    if effective.kind == "playbook":
                        result = self._run_playbook(config, tctx)
                    else:
                        result = get_tool(effective.kind).run(config, tctx)
                    result = _json_result(result)
                    status = "ok"
                except ToolError as exc:
                    status, error = "error", _error_dict(exc)
                    result = exc.data
                except TemplateError as exc:
                    status, error = "error", _error_dict(exc)
                except Exception as exc:  # noqa: BLE001 - a tool bug must fail the step, not the worker
                    status, error = "error", _error_dict(exc)
                duration_ms = round((time.perf_counter() - t0) * 1000, 3)
                if status == "error" and tool_input is not None:
                    # What the failed call was given, for whoever debugs it (masked
                    # where shown, sealed at rest like any value of the secret set).
                    tctx.call_meta["input"] = shown_input(tool_input)
                # Nothing is scrubbed here: a later task, policy or step reads the result
                # exactly as the tool returned it (a password `demo` must not turn
                # `demographics` into `***graphics`). The values are reported instead.
                if secrets:
                    touched |= secrets
                    remember(secrets)
                out_text = "".join(tctx.stdout)
                calls.append(
                    Call(
                        task.name,
                        attempt,
                        status == "ok",
                        duration_ms,
                        time.time(),
                        error,
                        out_text[:STDOUT_LIMIT] or None,
                        dict(tctx.call_meta),
                    )
                )
                output = envelope(
                    status, result if status == "ok" else result, error, attempt, duration_ms
                )
                last_output = output
                view = result_view(result)
                if status == "ok":
                    prev_result = view
                policy_scope = layered(own_result(task.name, status, view, output), scope)
                try:
                    rule = select_rule(task.policy, output, policy_scope, step=step.name)
                except TemplateError as exc:
                    if status == "ok":
                        status, error = "error", _error_dict(exc)
                    rule = select_rule(None, {"status": status}, policy_scope, step=step.name)
                if rule.do == "retry" and status == "error":
                    if attempt < rule.attempts and not (cancelled is not None and cancelled()):
                        self.sleep(retry_delay(rule, attempt))
                        continue
                    # retries exhausted: the error stands and fails the step
                    rule_do = "fail"
                elif rule.do == "retry":
                    rule_do = "continue"  # a retry rule matching a success: nothing to retry
                else:
                    rule_do = rule.do
                break
            # policy `then.set` sees the envelope; task-level `set` sees the raw result
            try:
                if rule.set:
                    self._apply_set(
                        rule.set, policy_scope, ctx_local, ctx_updates, iter_extra, pipe, step
                    )
                    ctx_local = {**ctx_local, **ctx_updates}
                if task.set:
                    set_scope = layered(own_result(task.name, status, view, result), scope)
                    self._apply_set(
                        task.set, set_scope, ctx_local, ctx_updates, iter_extra, pipe, step
                    )
                    ctx_local = {**ctx_local, **ctx_updates}
            except TemplateError as exc:
                return Outcome(
                    "error",
                    None,
                    action="fail",
                    error=_error_dict(exc),
                    ctx=ctx_updates,
                    calls=calls,
                    started=started,
                    secrets=touched,
                )
            results[task.name] = result
            pipe[task.name] = result_view(result)
            last_result, last_status, last_error = result, status, error
            if rule_do == "fail":
                return self._by_reference(
                    step,
                    execution_id,
                    Outcome(
                        "error",
                        plain(result),
                        action="fail",
                        error=error
                        or {"kind": "policy", "message": f"policy failed task '{task.name}'"},
                        ctx=ctx_updates,
                        tasks=results if step.pipeline else None,
                        calls=calls,
                        started=started,
                        secrets=touched,
                    ),
                )
            if rule_do == "break":
                action = "break"
                break
            if rule_do == "jump":
                target = rule.to or ""
                if target in names and jumps < 10_000:
                    jumps += 1
                    i = names.index(target)
                    continue
                action, jump_to = "jump", target
                break
            i += 1
        if last_status == "error" and last_result is None:
            last_result = {"status": "error", "error": last_error}
        return self._by_reference(
            step,
            execution_id,
            Outcome(
                last_status,
                plain(last_result),
                action=action,
                error=last_error,
                jump_to=jump_to,
                ctx=ctx_updates,
                tasks={k: plain(v) for k, v in results.items()}
                if step.pipeline and len(step.tasks) > 1
                else None,
                calls=calls,
                started=started,
                secrets=touched,
            ),
        )

    def _by_reference(self, step: Step, execution_id: int, outcome: Outcome) -> Outcome:
        """`outcome` with its results over the inline limit stored by reference
        (`_recorded`); a result that cannot be recorded fails the step."""
        last = step.tasks[-1].config if step.tasks else {}
        try:
            spec = artifacts.output_spec(step.output, last.get("output"), last.get("output_select"))

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
            outcome.status, outcome.action, outcome.error = "error", "fail", _error_dict(exc)
            outcome.result = None
            outcome.tasks = None
            return outcome
        outcome.result, outcome.tasks = result, tasks
        return outcome

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
        t0 = time.perf_counter()
        error: dict[str, Any] | None = None
        result: Any = None
        try:
            config = {
                k: render(v, scope, step=step.name, field=f"loop.cursor.{k}")
                for k, v in cursor.config.items()
            }
            config["command"] = config.pop("claim")
            tctx.timeout = _timeout(config)
            raw = get_tool(cursor.kind).run(config, tctx)
            rows = list(raw.get("rows") or []) if isinstance(raw, Mapping) else []
            result = {"rows": rows, "row_count": len(rows)}
        except Exception as exc:  # noqa: BLE001 - a failed claim fails the loop, not the worker
            error = _error_dict(exc)
        duration_ms = round((time.perf_counter() - t0) * 1000, 3)
        remember(secrets)
        call = Call(cursor.name, 1, error is None, duration_ms, time.time(), error)
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

    def _apply_set(
        self,
        spec: Mapping[str, Any],
        scope: Mapping[str, Any],
        ctx_local: dict[str, Any],
        ctx_updates: dict[str, Any],
        iter_extra: dict[str, Any],
        pipe: dict[str, Any],
        step: Step,
    ) -> None:
        for key, raw in spec.items():
            value = plain(render(raw, scope, step=step.name, field=f"set.{key}"))
            if key.startswith("ctx.") or key.startswith("vars."):
                ctx_updates.update(
                    render_set(
                        {key: value},
                        scope,
                        {**ctx_local, **ctx_updates},
                        step=step.name,
                        field="set",
                    )
                )
            elif key.startswith("iter."):
                iter_extra[key[5:]] = value
            else:
                pipe[key] = value

    def _run_playbook(self, config: dict[str, Any], tctx: ToolContext) -> Any:
        if self.run_playbook is None:
            raise ToolError("sub-playbooks are not available in this runtime", kind="config_error")
        path = config.get("path")
        if not path:
            raise ToolError("playbook tool needs 'path'", kind="config_error")
        child_input = config.get("input") or config.get("payload") or {}
        return self.run_playbook(
            path=str(path),
            workload=dict(child_input),
            return_step=config.get("return_step"),
            parent_execution_id=tctx.execution_id,
            base_dir=tctx.base_dir,
        )


def _timeout(config: Mapping[str, Any]) -> float | None:
    value = config.get("timeout")
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
