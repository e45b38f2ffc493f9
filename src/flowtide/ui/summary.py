"""What the UI shows of an execution at a glance, from its folded state: per step its
status, runs, times and loop counts; the arcs taken; the progress. The size of this
document grows with the playbook's steps, never with a loop's iterations or results
(a 100,000-iteration loop is three numbers here)."""

from __future__ import annotations

import logging
from typing import Any, Final

from flowtide.engine.state import ExecutionState, LoopRecord
from flowtide.errors import StoreError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook
from flowtide.redaction import mask_value
from flowtide.store.base import ENDED_STATUSES, ExecutionRow, Store
from flowtide.ui.graph import playbook_graph

__all__ = [
    "SUMMARY_FORMAT",
    "execution_summary",
    "keep_summary",
    "kept_part",
    "kept_summary",
    "summary_document",
    "summary_of",
]

log = logging.getLogger(__name__)

#: The shape of the kept summary part; bump it when `execution_summary` changes shape
#: (kept ones of another shape are then ignored and the log folded instead).
SUMMARY_FORMAT: Final = 1

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


def kept_part(state: ExecutionState) -> dict[str, Any]:
    """The part of the summary the state gives (`execution_summary`, masked with the
    execution's secret set): what is kept when an execution ends (`Store.put_summary`,
    shape `SUMMARY_FORMAT`)."""
    part: dict[str, Any] = mask_value(execution_summary(state), state.secrets)
    return part


def summary_of(part: dict[str, Any], row: ExecutionRow, playbook: Playbook) -> dict[str, Any]:
    """`GET /api/executions/{id}/summary` from its state's part, the execution's row
    (playbook, parent, times) and its playbook (the graph)."""
    doc = dict(part)
    doc["playbook"] = {
        "path": row.playbook_path,
        "version": row.playbook_version,
        "file": row.playbook_file,
    }
    doc["parent_execution_id"] = str(row.parent_execution_id) if row.parent_execution_id else None
    doc["created"], doc["updated"] = row.created, row.updated
    doc["graph"] = playbook_graph(playbook)
    return doc


def summary_document(state: ExecutionState, row: ExecutionRow) -> dict[str, Any]:
    """`GET /api/executions/{id}/summary` of a folded state."""
    return summary_of(kept_part(state), row, state.playbook)


def kept_summary(store: Store, row: ExecutionRow) -> dict[str, Any] | None:
    """The summary of an ended execution from the part kept when it ended, without
    folding its log; None when it is running or nothing (of this shape) was kept. Blocks
    on the store: run it in a thread."""
    if row.status not in ENDED_STATUSES:
        return None
    kept = store.get_summary(row.execution_id)
    if kept is None or kept[0] != SUMMARY_FORMAT:
        return None
    return summary_of(kept[1], row, parse_playbook(row.playbook_text, row.playbook_file))


def keep_summary(store: Store, state: ExecutionState) -> None:
    """Keep an ended execution's summary part (an optimisation of reads: a failure is
    logged, never raised)."""
    try:
        store.put_summary(state.execution_id, kept_part(state), format=SUMMARY_FORMAT)
    except StoreError as exc:
        log.warning("execution %s: summary not kept: %s", state.execution_id, exc)
