"""An execution at a glance, from its folded state: per step its status, runs, times and
loop counts; the arcs taken; the progress. The size of this document grows with the
playbook's steps, never with a loop's iterations or results (a 100,000-iteration loop is
three numbers here).

An ended execution's summary is kept as it ends (`kept_part`, in the format
`SUMMARY_FORMAT`: the embedded runtime's `on_finished` hook, the server's step that ends
it), so its page never folds its log again (`kept_summary`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final, NotRequired, cast

from typing_extensions import TypedDict

from flowtide.documents.execution import shown_items
from flowtide.documents.graph import Graph, playbook_graph
from flowtide.documents.notifications import (
    ExecutionNotifications,
    NotificationDelivery,
    notifications_of,
)
from flowtide.engine.state import ExecutionState, LoopRecord, StepRecord
from flowtide.errors import StoreError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook
from flowtide.redaction import mask_value
from flowtide.store.base import ENDED_STATUSES, INTERRUPTED, ExecutionRow, Store

__all__ = [
    "SUMMARY_FORMAT",
    "Progress",
    "SummaryDocument",
    "SummaryPart",
    "as_interrupted",
    "execution_summary",
    "keep_summary",
    "kept_part",
    "kept_summary",
    "progress_of",
    "summary_document",
    "summary_of",
]

log = logging.getLogger(__name__)

#: The shape of the kept summary part; bump it when `execution_summary` changes shape
#: (kept ones of another shape are then ignored and the log folded instead).
SUMMARY_FORMAT: Final = 2

#: Step statuses that count as done in the progress.
FINISHED = ("completed", "failed", "skipped")


class Progress(TypedDict):
    """How far an execution is: steps finished of its steps (null where only the loops
    are known: a server's list), loop iterations done (and failed) of their total."""

    steps: int | None
    steps_finished: int | None
    iterations: int
    iterations_done: int
    iterations_failed: int


class LoopSummary(TypedDict):
    """A step's latest loop."""

    instance: int
    total: int
    done: int
    succeeded: int
    failed: int
    in_flight: int
    finished: bool
    cursor: Any
    #: Items per second (a spark loop's, from its `command.progress`).
    per_second: NotRequired[float]
    #: A spark loop's: whether its counts are its job's exact ones (it ended); until
    #: then they are progress, and a job that stopped before its end runs all its items
    #: again when resumed.
    exact: NotRequired[bool]


class StepSummary(TypedDict):
    status: str
    runs: int
    #: Calls of its tasks (each try of each task), and how many were retries.
    attempts: int
    retries: int
    started: float | None
    ended: float | None
    duration: float | None
    error: dict[str, Any] | None
    loop: LoopSummary | None


#: An arc a step's exit took, with how many times (`from` is a Python keyword).
Taken = TypedDict("Taken", {"from": str, "to": str, "count": int})


class SummaryPart(TypedDict):
    """What the state gives of the summary: the part kept when an execution ends."""

    execution_id: str
    status: str
    error: dict[str, Any] | None
    progress: Progress
    steps: dict[str, StepSummary]
    taken: list[Taken]


class PlaybookRef(TypedDict):
    path: str | None
    version: int | None
    file: str | None


class SummaryDocument(SummaryPart):
    """`GET /api/executions/{id}/summary`."""

    playbook: PlaybookRef
    parent_execution_id: str | None
    #: What started it when a trigger did ({kind, name, slot|delivery|message}).
    trigger: dict[str, str] | None
    created: float
    updated: float
    graph: Graph
    #: Its notification deliveries, oldest first (see `NotificationDelivery`): read apart
    #: from the kept part, which predates them.
    notifications: list[NotificationDelivery]
    #: Deliveries not settled yet (never tried, or to be tried again).
    notifications_owed: int
    #: `flowtide ui` only: it runs the execution in its own process (it may cancel it
    #: there, and resumes only one that no process runs).
    run_here: NotRequired[bool]


def progress_of(
    loops: Iterable[LoopRecord],
    steps: Mapping[str, StepRecord] | None = None,
    items: Iterable[Mapping[str, Any]] = (),
) -> Progress:
    """The progress of an execution's loops (and the `items` of its spark loops:
    `StepRecord.items`, read from `steps` when given) and, when given, its steps."""
    iterations = done = failed = 0
    for loop in loops:
        iterations += loop.size
        done += loop.completed
        failed += loop.failed
    if steps is not None:
        items = [rec.items for rec in steps.values() if rec.items is not None]
    for counts in items:
        iterations += int(counts.get("total") or 0)
        done += int(counts.get("done") or 0)
        failed += int(counts.get("failed") or 0)
    return {
        "steps": len(steps) if steps is not None else None,
        "steps_finished": (
            sum(1 for rec in steps.values() if rec.status in FINISHED)
            if steps is not None
            else None
        ),
        "iterations": iterations,
        "iterations_done": done,
        "iterations_failed": failed,
    }


def _loop(loop: LoopRecord, ended: bool) -> LoopSummary:
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


def _items_loop(rec: StepRecord, ended: bool) -> LoopSummary:
    """A spark loop's summary, from its `command.progress` (its items run in one
    command: none is in flight as far as the engine knows)."""
    items = rec.items or {}
    done = int(items.get("done") or 0)
    failed = int(items.get("failed") or 0)
    return {
        "instance": rec.runs,
        "total": int(items.get("total") or 0),
        "done": done,
        "succeeded": done - failed,
        "failed": failed,
        "in_flight": 0,
        "finished": ended or rec.status not in ("running", "pending"),
        "cursor": False,
        # No rate for a job that stopped before its end (`execution.shown_items`).
        "per_second": float(shown_items(items, rec.status).get("per_second") or 0.0),
        "exact": "failed" in items,
    }


def execution_summary(state: ExecutionState) -> SummaryPart:
    """`status`, `progress` (steps and loop iterations done of total), `steps` (per step:
    `status`, `runs`, `started`, `ended`, `duration`, `error`, `loop` for its latest
    loop) and `taken` (the arcs a step's exit took, with how many times)."""
    steps: dict[str, StepSummary] = {}
    latest: list[LoopRecord] = []
    for name, rec in state.steps.items():
        loop = state.loop_of(name)
        steps[name] = {
            "status": rec.status,
            "runs": rec.runs,
            "attempts": rec.attempts,
            "retries": rec.retries,
            "started": rec.started,
            "ended": rec.ended,
            "duration": (
                rec.ended - rec.started
                if rec.started is not None and rec.ended is not None
                else None
            ),
            "error": rec.error,
            "loop": (
                _loop(loop, state.terminal)
                if loop is not None
                else _items_loop(rec, state.terminal)
                if rec.items is not None
                else None
            ),
        }
        if loop is not None:
            latest.append(loop)
    return {
        "execution_id": str(state.execution_id),
        "status": state.status,
        "error": state.error,
        "progress": progress_of(latest, state.steps),
        "steps": steps,
        "taken": [{"from": a, "to": b, "count": n} for (a, b), n in sorted(state.taken.items())],
    }


def kept_part(state: ExecutionState) -> SummaryPart:
    """The part of the summary the state gives (`execution_summary`, masked with the
    execution's secret set): what is kept when an execution ends (`Store.put_summary`,
    shape `SUMMARY_FORMAT`)."""
    part: SummaryPart = mask_value(execution_summary(state), state.secrets)
    return part


def summary_of(
    part: SummaryPart,
    row: ExecutionRow,
    playbook: Playbook,
    notifications: ExecutionNotifications,
) -> SummaryDocument:
    """`GET /api/executions/{id}/summary` from its state's part, the execution's row
    (playbook, parent, times), its playbook (the graph) and its notification deliveries."""
    doc: SummaryDocument = {
        "execution_id": part["execution_id"],
        "status": part["status"],
        "error": part["error"],
        "progress": part["progress"],
        "steps": part["steps"],
        "taken": part["taken"],
        "playbook": {
            "path": row.playbook_path,
            "version": row.playbook_version,
            "file": row.playbook_file,
        },
        "parent_execution_id": (str(row.parent_execution_id) if row.parent_execution_id else None),
        "trigger": row.trigger,
        "created": row.created,
        "updated": row.updated,
        "graph": playbook_graph(playbook),
        "notifications": notifications["deliveries"],
        "notifications_owed": notifications["owed"],
    }
    return doc


def summary_document(
    state: ExecutionState, row: ExecutionRow, notifications: ExecutionNotifications
) -> SummaryDocument:
    """`GET /api/executions/{id}/summary` of a folded state (and its deliveries:
    `notifications_of`)."""
    return summary_of(kept_part(state), row, state.playbook, notifications)


def kept_summary(store: Store, row: ExecutionRow) -> SummaryDocument | None:
    """The summary of an ended execution from the part kept when it ended (and its
    notification deliveries), without folding its log; None when it is running or nothing (of this shape) was kept. Blocks
    on the store: run it in a thread."""
    if row.status not in ENDED_STATUSES:
        return None
    kept = store.get_summary(row.execution_id)
    if kept is None or kept[0] != SUMMARY_FORMAT:
        return None
    part = cast(SummaryPart, kept[1])  # stored by `keep_summary` in this shape
    playbook = parse_playbook(row.playbook_text, row.playbook_file)
    return summary_of(part, row, playbook, notifications_of(store, row.execution_id))


def keep_summary(store: Store, state: ExecutionState) -> None:
    """Keep an ended execution's summary part (an optimisation of reads: a failure is
    logged, never raised)."""
    try:
        store.put_summary(state.execution_id, dict(kept_part(state)), format=SUMMARY_FORMAT)
    except StoreError as exc:
        log.warning("execution %s: summary not kept: %s", state.execution_id, exc)


def _stopped_loop(loop: LoopSummary) -> LoopSummary:
    """A loop of a run that stopped: nothing in flight, and a spark loop's rate
    stopped with it (`execution.shown_items`)."""
    out: LoopSummary = {**loop, "in_flight": 0}
    if "per_second" in loop:
        out["per_second"] = 0.0
    return out


def as_interrupted(doc: SummaryDocument, stopped: float) -> SummaryDocument:
    """The summary of a run that no process runs any more (`flowtide.runlock`), stopped
    at `stopped`: it and the steps it was running are `interrupted` (ended then, nothing
    in flight), not running."""
    steps: dict[str, StepSummary] = {}
    for name, step in doc["steps"].items():
        if step["status"] == "running":
            loop = step["loop"]
            step = {
                **step,
                "status": INTERRUPTED,
                "loop": _stopped_loop(loop) if loop is not None else None,
            }
        steps[name] = step
    return {**doc, "status": INTERRUPTED, "steps": steps, "updated": stopped}
