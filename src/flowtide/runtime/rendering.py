"""What a task's call sees and is given: the scope its templates render against (the
execution's context, the loop's element, the calls made before it in the same command:
`task_layers`, `pipeline_locals`, `own_result`), its fields rendered for the runner
(`prepare`, following the kind's `ToolSpec`), and what a `set:` block writes
(`apply_set`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from flowtide.engine.context import iteration_scope, layered, plain
from flowtide.engine.decide import render_set
from flowtide.errors import TemplateError
from flowtide.playbook.model import Playbook, Step, Task
from flowtide.playbook.template import render
from flowtide.tools import kinds
from flowtide.tools.spec import ToolSpec


def task_layers(
    pipe: Mapping[str, Any],
    ctx: Mapping[str, Any],
    base: Mapping[str, Any],
    iterator: str | None,
    element: Any,
    index: int | None,
    iter_extra: Mapping[str, Any],
    size: int | None = None,
) -> list[Mapping[str, Any]]:
    """The scope of a task's fields, nearest first, but for the calls before it
    (`pipeline_locals`): the pipeline's own names (`pipe`: earlier tasks' results and
    `set`s), the loop's iteration (`size`: its collection's), `ctx` (also as `vars`), the
    execution's context."""
    layers: list[Mapping[str, Any]] = [pipe]
    if iterator is not None and index is not None:
        layers.append(iteration_scope(iterator, element, index, iter_extra, size))
    layers.append({"ctx": ctx, "vars": ctx})
    layers.append(base)
    return layers


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


def sequence_names(task: str, attempt: int, results: Mapping[str, Any]) -> dict[str, Any]:
    """What every task of a pipeline (`tool:` written as a list) sees of the pipeline
    itself: `_task`, its own name, `_attempt`, the attempt it renders for (1 the first),
    and `results`, the results of the tasks that ran before it, by name.

    NoETL: `TaskSequenceContext.to_dict` (`noetl/worker/task_sequence_executor.py`) puts
    `_task`, `_attempt` and `results` in each task's render context, over the execution's.
    """
    return {"_task": task, "_attempt": attempt, "results": results}


def own_result(
    name: str,
    status: str,
    view: Any,
    output: Any,
    error: Mapping[str, Any] | None = None,
    step: str | None = None,
) -> dict[str, Any]:
    """The names a task's policy rules and `set` see after its call: `output` (the
    envelope for rules, the raw result for a task `set`), `event` (`{name: call.done |
    call.error, step}`, as a step's `set` and arcs see it), `result`, `error` (the call's
    error, only when it failed: NoETL binds it as `output.error` when there is one,
    `ExecutionState.get_render_context`), and the task's own
    name bound to the result it just made, when it made one: for a single-tool step that
    name is the step's, so `then.set: {ctx.total: "{{ update_progress.total }}"}` in step
    `update_progress` reads the result the rule is judging.

    NoETL: `TaskSequenceContext.update_success` records `results[task_name]` before the
    rules are evaluated, and the rules render with the task results at the root of their
    context (`noetl/worker/task_sequence_executor.py`); the server likewise marks a step
    completed before its `set` renders, "set templates like {{ fetch_with_limit... }} need
    the step result" (`noetl/core/dsl/engine/executor/events.py`).
    """
    names: dict[str, Any] = {name: view} if status == "ok" else {"error": error}
    event = {"name": "call.done" if status == "ok" else "call.error", "step": step or name}
    # A task named `event` keeps its name (as before `event` was offered here).
    return {"event": event, **names, "output": output, "result": view}


class Prepared(NamedTuple):
    """A task's call, ready for its runner."""

    kind: str
    spec: ToolSpec | None
    #: The fields rendered (but the kind's `unrendered` ones), with `input` when it has one.
    config: dict[str, Any]
    #: The rendered input, as the runner is given it (None: the task has none).
    input: Any
    #: What the runner's own templates see, when it is not the task's scope (a delegated
    #: task's input over the scope).
    render_context: Mapping[str, Any] | None = None


def prepare(
    task: Task,
    scope: Mapping[str, Any],
    step: Step,
    playbook: Playbook,
    iterator: str | None = None,
    element: Any = None,
    index: int | None = None,
) -> Prepared:
    """`task`'s call rendered against `scope`: the task its kind's `ToolSpec.delegate`
    names in its place, if any (its input the defaults of `task`'s), the loop's element in
    the input of a kind with `loop_input`.

    Raises:
        TemplateError: a field or the input failed to render.
    """
    raw_input = task.input
    tool_input = (
        render(raw_input, scope, step=step.name, field="input") if raw_input is not None else None
    )
    spec = kinds.find(task.kind)
    render_context: Mapping[str, Any] | None = None
    if spec is not None and spec.delegate is not None:
        task = spec.delegate(task.config, playbook)
        tool_input = {**(task.input or {}), **(tool_input or {})}
        scope = render_context = layered(tool_input, scope)
        spec = kinds.find(task.kind)
    config = rendered_config(task, spec, scope, step)
    if iterator is not None and spec is not None and spec.loop_input:
        tool_input = {iterator: element, "loop_index": index, **(tool_input or {})}
    if tool_input is not None:
        config = {**config, "input": tool_input}
    return Prepared(task.kind, spec, config, tool_input, render_context)


def rendered_config(
    task: Task, spec: ToolSpec | None, scope: Mapping[str, Any], step: Step
) -> dict[str, Any]:
    """`task`'s config rendered against `scope`, but the fields its kind renders itself
    (`ToolSpec.unrendered`), which stay as written."""
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


def apply_set(
    spec: Mapping[str, Any],
    scope: Mapping[str, Any],
    ctx: Mapping[str, Any],
    ctx_updates: dict[str, Any],
    iter_extra: dict[str, Any],
    pipe: dict[str, Any],
    step: Step,
) -> None:
    """Render a `set:` block against `scope` into its three destinations: `ctx.`/`vars.`
    keys into `ctx_updates` (over `ctx`, the command's view of the context), `iter.` keys
    into the iteration's names, the rest into the pipeline's.

    Raises:
        TemplateError: a value failed to render (the keys before it are written).
    """
    for key, raw in spec.items():
        value = plain(render(raw, scope, step=step.name, field=f"set.{key}"))
        if key.startswith("ctx.") or key.startswith("vars."):
            ctx_updates.update(
                render_set(
                    {key: value},
                    scope,
                    {**ctx, **ctx_updates},
                    step=step.name,
                    field="set",
                )
            )
        elif key.startswith("iter."):
            iter_extra[key[5:]] = value
        else:
            pipe[key] = value


def timeout(config: Mapping[str, Any]) -> float | None:
    """The task's `timeout` field in seconds; None when unset or not a number."""
    value = config.get("timeout")
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


#: How much of a failed call's rendered input its event keeps (`shown_input`).
INPUT_SHOWN_BYTES = 4 * 1024


def shown_input(value: Any) -> Any:
    """A failed call's rendered input as its `call.error` event keeps it: the value when
    its JSON is at most `INPUT_SHOWN_BYTES`, else its size and top-level keys (never a
    cut text: a secret cut in two would no longer be masked)."""
    text = json.dumps(value, default=str, separators=(",", ":"))
    if len(text) <= INPUT_SHOWN_BYTES:
        return json.loads(text)
    keys = [str(k) for k in list(value)[:50]] if isinstance(value, dict) else None
    return {"truncated": True, "bytes": len(text.encode()), "keys": keys}
