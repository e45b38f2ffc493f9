"""What `flowtide run --json`, `status` and the API say about an execution."""

from __future__ import annotations

from typing import Any

from flowtide.engine.state import ExecutionState


def step_view(state: ExecutionState) -> dict[str, dict[str, Any]]:
    steps: dict[str, dict[str, Any]] = {}
    for name, rec in state.steps.items():
        status = rec.status
        if rec.runs == 0:
            status = "skipped" if state.terminal else "pending"
        elif status == "running" and state.terminal:
            # Stopped with its execution (a cancel, or another branch failing it): no
            # step.exit will ever come.
            status = "cancelled"
        steps[name] = {"status": status, "runs": rec.runs, "result": rec.result, "error": rec.error}
    return steps


def error_location(state: ExecutionState) -> str | None:
    """`file:line` of the step an execution failed in, when known."""
    err = state.error or {}
    if err.get("line") is None:
        return None
    return f"{state.playbook.file or '<playbook>'}:{err['line']}"


def execution_document(state: ExecutionState) -> dict[str, Any]:
    """The one JSON document `flowtide run --json` prints."""
    error = None
    if state.status in ("failed", "cancelled"):
        err = state.error or {}
        error = {
            "step": err.get("step"),
            "kind": err.get("kind", state.status),
            "message": err.get("message", state.status),
        }

    return {
        "execution_id": str(state.execution_id),
        "status": state.status if state.terminal else "running",
        "result": state.result(),
        "steps": step_view(state),
        "error": error,
    }
