"""What a step answers and what follows its commit: `SubmitResult` (per report),
`After` (per committed step), and the worker that takes a next command in the slot its
report frees (`Taker`, `Handed`). Apart from `flowtide.server.steps` so that the steps'
parts (`creations`, `group_commit`) can name them without an import cycle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from flowtide.engine.state import ExecutionState
from flowtide.runtime.advance import Advance
from flowtide.server import metrics
from flowtide.server.claims import Taken
from flowtide.store.pg.outbox import OutboxRow
from flowtide.wire import ClaimItem

__all__ = ["After", "Handed", "SubmitResult", "Taker", "count_step"]


class Taker(NamedTuple):
    """A reporting worker that runs a next command in the slot its report frees."""

    worker_id: str
    #: The worker's pool: it is handed only a command of that pool.
    pool: str


class Handed(NamedTuple):
    """A command claimed for a reporting worker in the step's transaction."""

    item: ClaimItem
    taken: Taken


@dataclass
class SubmitResult:
    accepted: int = 0
    duplicates: int = 0
    #: Reports rejected because the command is no longer held by the reporting worker
    #: (its lease expired and it was issued again) or is already closed.
    stale: int = 0
    #: Commands issued again because their worker's lease expired (`nudge`).
    reissued: int = 0
    status: str = ""
    #: A command the step issued and claimed for the reporting worker (its `Taker`).
    handed: Handed | None = None

    def reply(self) -> dict[str, Any]:
        """What a worker report's reply says of it (single or in a batch)."""
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "stale": self.stale,
            "status": self.status,
        }

    @property
    def all_stale(self) -> bool:
        """Every reported command was stale: the report is answered 409."""
        return bool(self.stale and not self.accepted)


class After(NamedTuple):
    """What `Stepper.after` needs of a committed step."""

    execution_id: int
    pool: str
    #: One per part of the step.
    results: list[SubmitResult]
    out: Advance
    #: The outbox rows to publish now (when the server publishes them itself).
    notices: list[OutboxRow]
    #: The state of an execution the step ended, with traces on (its span is recorded).
    ended: ExecutionState | None = None


def count_step(pool: str, results: list[SubmitResult], out: Advance) -> None:
    """Count what a committed step wrote (counting before the commit would count steps
    that roll back)."""
    if out.commands:
        metrics.COMMANDS_ISSUED.labels(pool).inc(len(out.commands))
    reissued = sum(r.reissued for r in results)
    if reissued:
        metrics.COMMANDS_REISSUED.labels(pool).inc(reissued)
    stale = sum(r.stale for r in results)
    if stale:
        metrics.REPORTS_STALE.labels(pool).inc(stale)
    for row in out.command_rows:
        if row.status == "completed":
            metrics.COMMANDS_COMPLETED.labels(pool).inc()
        elif row.status == "failed":
            metrics.COMMANDS_FAILED.labels(pool).inc()
