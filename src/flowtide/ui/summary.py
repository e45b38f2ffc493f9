"""What the UI shows of an execution at a glance, from its folded state: per step its
status, runs, times and loop counts; the arcs taken; the progress. The size of this
document grows with the playbook's steps, never with a loop's iterations or results
(a 100,000-iteration loop is three numbers here)."""

from __future__ import annotations

from typing import Any

from flowtide.engine.state import ExecutionState, LoopRecord

__all__ = ["execution_summary"]

#: Step statuses that count as done in the progress.
FINISHED = ("completed", "failed", "skipped")


def _loop(loop: LoopRecord) -> dict[str, Any]:
    return {
        "instance": loop.instance,
        "total": loop.size,
        "done": loop.completed,
        "succeeded": loop.success,
        "failed": loop.failed,
        "in_flight": len(loop.in_flight),
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
            "loop": _loop(loop) if loop is not None else None,
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
