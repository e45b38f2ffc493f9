"""An ended execution's root span (`flowtide.tracing`), recorded by the runtime that
wrote its end: the embedded runtime, or the server whose step ended it."""

from __future__ import annotations

from flowtide import tracing
from flowtide.engine.state import ExecutionState

__all__ = ["execution_ended"]


def execution_ended(state: ExecutionState, now: float) -> None:
    """Record `state`'s execution span, from its start to `now` (nothing when off)."""
    if not tracing.enabled:
        return
    error = state.error or {}
    tracing.record_execution(
        execution_id=state.execution_id,
        playbook_path=state.playbook.path,
        traceparent=state.traceparent,
        parent_execution_id=state.parent_execution_id,
        started=state.started_at if state.started_at is not None else now,
        ended=now,
        status=state.status,
        error_kind=str(error["kind"]) if error.get("kind") else None,
        steps=sum(1 for step in state.steps.values() if step.runs),
    )
