"""What the UI shows of an execution at a glance, from its folded state: per step its
status, runs, times and loop counts; the arcs taken; the progress. The size of this
document grows with the playbook's steps, never with a loop's iterations or results
(a 100,000-iteration loop is three numbers here)."""

from __future__ import annotations

from typing import Any

from flowtide.engine.state import ExecutionState, LoopRecord
from flowtide.redaction import mask_value
from flowtide.store.base import ExecutionRow
from flowtide.ui.graph import playbook_graph

__all__ = ["execution_summary", "summary_document"]

#: Step statuses that count as done in the progress.
FINISHED = ("completed", "failed", "skipped")


def _loop(loop: LoopRecord, ended: bool) -> dict[str, Any]:
    # An execution that ended closed its open commands: nothing is in flight any more.
    return {
        "instance": loop.instance,
        "total": loop.size,
        "done": loop.completed,
        "succeeded": loop.success,
        "failed": loop.failed,
        "in_flight": 0 if ended else len(loop.in_flight),
        "finished": loop.finished,
        "cursor": loop.cursor,
    }


def execution_summary(state: ExecutionState) -> dict[str, Any]:
    """`status`, `progress` (steps and loop iterations done of total), `steps` (per step:
    `status`, `runs`, `started`, `ended`, `duration`, `error`, `loop` for its latest
    loop) and `taken` (the arcs a step's exit took, with how many times)."""
    steps: dict[str, Any] = {}
    iterations = done = failed = 0
    for name, rec in state.steps.items():
        loop = state.loop_of(name)
        doc: dict[str, Any] = {
            "status": rec.status,
            "runs": rec.runs,
            "started": rec.started,
            "ended": rec.ended,
            "duration": (
                rec.ended - rec.started
                if rec.started is not None and rec.ended is not None
                else None
            ),
            "error": rec.error,
            "loop": _loop(loop, state.terminal) if loop is not None else None,
        }
        steps[name] = doc
        if loop is not None:
            iterations += loop.size
            done += loop.completed
            failed += loop.failed
    finished = sum(1 for rec in state.steps.values() if rec.status in FINISHED)
    return {
        "execution_id": str(state.execution_id),
        "status": state.status,
        "error": state.error,
        "progress": {
            "steps": len(state.steps),
            "steps_finished": finished,
            "iterations": iterations,
            "iterations_done": done,
            "iterations_failed": failed,
        },
        "steps": steps,
        "taken": [{"from": a, "to": b, "count": n} for (a, b), n in sorted(state.taken.items())],
    }


def summary_document(state: ExecutionState, row: ExecutionRow) -> dict[str, Any]:
    """`GET /api/executions/{id}/summary`: `execution_summary` masked with the execution's
    secret set, with the row's playbook, parent and times, and the playbook's graph."""
    doc: dict[str, Any] = mask_value(execution_summary(state), state.secrets)
    doc["playbook"] = {
        "path": row.playbook_path,
        "version": row.playbook_version,
        "file": row.playbook_file,
    }
    doc["parent_execution_id"] = str(row.parent_execution_id) if row.parent_execution_id else None
    doc["created"], doc["updated"] = row.created, row.updated
    doc["graph"] = playbook_graph(state.playbook)
    return doc
