"""Render contexts: what templates can see at each point of an execution.

The execution's base context (workload, finished steps, ctx, execution_id) is rebuilt
only when a step finishes or ctx changes, and never mutated afterwards, so worker
threads can render against a snapshot while the engine moves on.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from typing import Any

from flowtide.playbook.sandbox import Explains
from flowtide.playbook.template import NotRun, TemplateEnv

#: What `env` holds when a runtime passes nothing: no environment variable at all. The
#: engine never reads the process environment; each runtime decides what its templates
#: may see (`flowtide.playbook.template.visible_env`).
NO_ENV = TemplateEnv(why="this runtime shows templates no environment variables")


class ResultDict(dict[str, Any]):
    """A step's dict result as templates see it.

    `.data` is the result itself unless the result has its own `data` key (NoETL), and
    `.results.<task>` reaches the result of each task of a multi-task step.
    """

    __slots__ = ("_tasks",)

    def __init__(self, value: Mapping[str, Any], tasks: Mapping[str, Any] | None = None) -> None:
        super().__init__(value)
        self._tasks = tasks

    def __getitem__(self, key: str) -> Any:
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            if key == "data":
                return self
            if key == "results" and self._tasks is not None:
                return self._tasks
            raise

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


class SparkLoopView(Explains, ResultDict):
    """A spark loop's result as templates see it: when it holds no `results` (more items
    than `results_max`, or too large), `.results` says why and how to read the rows."""

    __slots__ = ("_step", "_results_max")

    def __init__(self, value: Mapping[str, Any], step: str, results_max: int) -> None:
        super().__init__(value)
        self._step = step
        self._results_max = results_max

    def explain(self, name: str) -> str | None:
        if name != "results":
            return None
        step, rows = self._step, self.get("row_count")
        if isinstance(rows, int) and rows > self._results_max:
            why = (
                f"its {rows:,} items are more than its loop.spec.results_max "
                f"({self._results_max:,}; raise it to keep them here)"
            )
        else:
            why = "its results are larger than half of FLOWTIDE_MAX_RESULT_BYTES"
        return (
            f"step '{step}' is a spark loop whose result holds no 'results': {why}. Read the "
            f"rows (index, status, result, error, action) by reference: a spark step's "
            f'`inputs: {{r: "{{{{ {step} }}}}"}}`, or `flowtide data EXECUTION_ID {step}`; '
            f"'{step}.stats' and '{step}.row_count' are here"
        )


class ResultList(list[Any]):
    """A step's list result as templates see it: `.data` is the list itself."""

    @property
    def data(self) -> ResultList:
        return self


def result_view(value: Any, tasks: Mapping[str, Any] | None = None) -> Any:
    if isinstance(value, dict):
        return ResultDict(value, tasks)
    if isinstance(value, list):
        return ResultList(value)
    return value


def plain(value: Any) -> Any:
    """Strip result views (for values leaving the template layer)."""
    if isinstance(value, ResultDict | ResultList):
        return value.copy() if isinstance(value, ResultList) else dict(value)
    return value


def envelope(
    status: str, data: Any, error: Mapping[str, Any] | None, attempt: int, duration_ms: float
) -> dict[str, Any]:
    """NoETL's `output` envelope seen by policy rules and step `set`/arcs."""
    return {
        "status": status,
        "data": data,
        "error": dict(error)
        if error
        else {
            "kind": None,
            "retryable": False,
            "code": None,
            "message": None,
            "http_status": None,
            "status": None,
        },
        "meta": {"attempt": attempt, "duration_ms": duration_ms},
        # The tool's result under NoETL's other name for it: its case/policy context binds
        # the tool response as `response` (and `result`, `this`):
        # `noetl/worker/case_evaluator.py` `build_eval_context`; vars_test/test_vars_block
        # reads `output.response.users[0]`.
        "response": data,
        "http": {"status": (data or {}).get("status_code") if isinstance(data, dict) else None},
    }


def execution_ids(execution_id: int) -> dict[str, Any]:
    """`execution_id` and `job` as templates see them: digit strings, as in NoETL, whose
    render context sets `execution_id`, `job.uuid`, `job.execution_id` and `job.id` to
    `str(self.execution_id)` ("convert IDs to strings to prevent JavaScript precision loss
    with Snowflake IDs": noetl/noetl `noetl/core/dsl/engine/executor/state.py`,
    `ExecutionState.get_render_context`). So `execution_id[:8]` works, and so do the
    numeric uses: pasted into SQL as `{{ execution_id }}` it is the same digits, and
    `{{ execution_id | int }}` is the number."""
    text = str(execution_id)
    return {"execution_id": text, "job": {"uuid": text, "execution_id": text, "id": text}}


def base_context(
    execution_id: int,
    workload: Mapping[str, Any],
    step_names: list[str],
    results: Mapping[str, Any],
    ctx: Mapping[str, Any],
    env: Mapping[str, str] = NO_ENV,
) -> dict[str, Any]:
    """Everything a template sees outside a loop iteration (`env`: the environment
    variables the runtime chose to show)."""
    out: dict[str, Any] = {}
    for name in step_names:
        out[name] = NotRun(name=name, hint=f"step '{name}' has not run")
    out.update(execution_ids(execution_id))
    out["env"] = env
    out.update(workload)
    out["workload"] = workload
    out.update(results)
    out["ctx"] = ctx
    out["vars"] = ctx
    return out


def loop_view(index: int, size: int | None, done: bool = False) -> dict[str, Any]:
    """NoETL's `loop` name: `{index, first, length, done}` of the step's loop (its render
    context adds it whenever the step has loop state: noetl/noetl
    `noetl/core/dsl/engine/executor/state.py`, `ExecutionState.get_render_context`).
    `index` counts from 0; `length` is the collection's size (None when not known);
    `done` is true once the loop has finished (on the step's arcs and `set`)."""
    return {"index": index, "first": index == 0, "length": size, "done": done}


def iteration_scope(
    iterator: str,
    element: Any,
    index: int,
    extra: Mapping[str, Any] | None = None,
    size: int | None = None,
) -> dict[str, Any]:
    """What an iteration's templates see besides the execution's context: the element
    (as `iter.<iterator>` and `<iterator>`), its index (`iter.index`, `iter._index`,
    `loop_index`, `_index`), NoETL's `iter._first`/`iter._last` (the first and the last
    element: `_last` only when the collection's `size` is known) and `loop`
    (`loop_view`). `extra`: the iteration's own `iter.<name>` values (`set: iter.x`)."""
    marks: dict[str, Any] = {"_index": index, "_first": index == 0}
    if size is not None:
        marks["_last"] = index == size - 1
    # `loop` first: an iterator of that name is the element, as it was before.
    scope: dict[str, Any] = {"loop": loop_view(index, size)}
    scope["iter"] = {iterator: element, "index": index, **marks, **(extra or {})}
    scope[iterator] = element
    scope["loop_index"] = index
    scope["_index"] = index
    return scope


def layered(*maps: Mapping[str, Any]) -> ChainMap[str, Any]:
    return ChainMap(*maps)  # type: ignore[arg-type]
