"""An execution's document: what `flowtide run --json`, `flowtide status`, the API
(`GET /api/executions/{id}`) and `flowtide.run()` say of an execution.

Two views of one document, and masking in one place: `shown` (values of the execution's
secret set replaced by `***`) for everything a person or a program reads, `intact` for
the code that uses the data (a parent step reading its sub-playbook's result, the
embedded API's caller).
"""

from __future__ import annotations

from typing import Any, NotRequired

from typing_extensions import TypedDict

from flowtide.engine.state import ExecutionState
from flowtide.redaction import mask_value
from flowtide.store.base import INTERRUPTED

__all__ = [
    "ChildResult",
    "as_interrupted",
    "ExecutionDocument",
    "ExecutionError",
    "StepView",
    "child_result",
    "error_location",
    "intact",
    "shown",
    "step_view",
]


class StepView(TypedDict):
    """One step of an execution document."""

    #: pending, running, completed, failed, skipped, cancelled; interrupted (running
    #: when its execution's process went away).
    status: str
    runs: int
    #: Calls of its tasks (each try of each task), and how many were retries.
    attempts: int
    retries: int
    result: Any
    error: dict[str, Any] | None
    #: A spark loop's items: `{done, total, per_second}` while it runs (counted a Spark
    #: task at a time), with `failed` once it ended (`per_second` 0 when it stopped
    #: before: `shown_items`).
    items: NotRequired[dict[str, Any]]


class ExecutionError(TypedDict):
    """Why an execution failed or was cancelled."""

    step: str | None
    kind: str
    message: Any
    #: A failed python step's: the user's frames, at the playbook's lines.
    traceback: NotRequired[str]


class ExecutionDocument(TypedDict):
    execution_id: str
    #: running, completed, failed or cancelled; `interrupted` for an embedded run whose
    #: process went away before it ended (resumable: `flowtide resume`).
    status: str
    result: Any
    steps: dict[str, StepView]
    error: ExecutionError | None


class ShownExecution(ExecutionDocument, total=False):
    """`GET /api/executions/{id}`: the document, the playbook's path or file, and what
    started it when a trigger did."""

    playbook: str | None
    #: {"kind": "schedule"|"hook"|"subscription", "name", and "slot", "delivery" or
    #: "message"}; null for a run a person, a program or a parent started.
    trigger: dict[str, str] | None


class ChildResult(TypedDict):
    """What a worker running a `playbook` step reads of the sub-playbook it started."""

    execution_id: str
    status: str
    error: ExecutionError | None
    result: Any
    steps: dict[str, Any]


def step_view(state: ExecutionState) -> dict[str, StepView]:
    steps: dict[str, StepView] = {}
    for name, rec in state.steps.items():
        status = rec.status
        if rec.runs == 0:
            status = "skipped" if state.terminal else "pending"
        elif status == "running" and state.terminal:
            # Stopped with its execution (a cancel, or another branch failing it): no
            # step.exit will ever come.
            status = "cancelled"
        view: StepView = {
            "status": status,
            "runs": rec.runs,
            "attempts": rec.attempts,
            "retries": rec.retries,
            "result": rec.result,
            "error": rec.error,
        }
        if rec.items is not None:
            view["items"] = shown_items(rec.items, rec.status)
        steps[name] = view
    return steps


def error_location(state: ExecutionState) -> str | None:
    """`file:line` of the step an execution failed in, when known."""
    err = state.error or {}
    if err.get("line") is None:
        return None
    return f"{state.playbook.file or '<playbook>'}:{err['line']}"


def intact(state: ExecutionState) -> ExecutionDocument:
    """The execution's document with its data as it is (for code that uses the data,
    never for display)."""
    error: ExecutionError | None = None
    if state.status in ("failed", "cancelled"):
        err = state.error or {}
        error = {
            "step": err.get("step"),
            "kind": err.get("kind", state.status),
            "message": err.get("message", state.status),
        }
        if isinstance(err.get("traceback"), str):
            error["traceback"] = err["traceback"]
    return {
        "execution_id": str(state.execution_id),
        "status": state.status if state.terminal else "running",
        "result": state.result(),
        "steps": step_view(state),
        "error": error,
    }


def shown(state: ExecutionState) -> ExecutionDocument:
    """The execution's document as people and programs read it: values of its secret
    set masked (`***`)."""
    doc: ExecutionDocument = mask_value(intact(state), state.secrets)
    return doc


def child_result(state: ExecutionState) -> ChildResult:
    """A sub-playbook's outcome for the parent step waiting on it: intact (the step uses
    the data)."""
    doc = intact(state)
    return {
        "execution_id": doc["execution_id"],
        "status": doc["status"],
        "error": doc["error"],
        "result": doc["result"],
        "steps": {name: step["result"] for name, step in doc["steps"].items()},
    }


def as_interrupted(doc: ExecutionDocument) -> ExecutionDocument:
    """The document of a run that no process runs any more (`flowtide.runlock`): it and
    the steps it was running are `interrupted`, not running."""
    steps: dict[str, Any] = {}
    for name, step in doc["steps"].items():
        if step["status"] == "running":
            step = {**step, "status": INTERRUPTED}
            if "items" in step:
                step["items"] = shown_items(step["items"], INTERRUPTED)
        steps[name] = step
    return {**doc, "status": INTERRUPTED, "steps": steps}


def shown_items(items: dict[str, Any], status: str) -> dict[str, Any]:
    """A spark loop's `items` as shown for a step in `status`: the items per second
    while it runs and once the job's exact counts came (`failed` is there); a job that
    stopped before (interrupted, cancelled) has no rate: `per_second` is 0."""
    if status == "running" or "failed" in items:
        return dict(items)
    return {**items, "per_second": 0.0}
