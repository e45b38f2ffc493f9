"""The records an execution state keeps per step, loop and open command
(`flowtide.engine.state.ExecutionState` holds them; `flowtide.engine.state` re-exports
them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowtide.engine.events import Command

__all__ = ["CommandRecord", "LoopRecord", "StepRecord"]


@dataclass
class StepRecord:
    status: str = "pending"  # pending | running | completed | failed | skipped | cancelled
    runs: int = 0
    result: Any = None
    error: dict[str, Any] | None = None
    tasks: dict[str, Any] | None = None  # per-task results of a multi-task step
    outcome: str = "call.done"  # event name seen by arcs: call.done | call.error | loop.done
    # When its last run entered and exited (event times; None: not yet).
    started: float | None = None
    ended: float | None = None
    # Calls of its tasks over all its runs (`call.done`/`call.error`: each try of each
    # task), and how many of them were retries (attempt > 1).
    attempts: int = 0
    retries: int = 0
    #: A command of many items (a spark loop): its last `command.progress` (done, total,
    #: per_second, and failed once it ended); None for other steps.
    items: dict[str, Any] | None = None


@dataclass
class LoopRecord:
    step: str
    instance: int
    iterator: str
    collection: list[Any]
    max_in_flight: int
    next_index: int = 0
    in_flight: set[int] = field(default_factory=set)
    results: list[Any] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    success: int = 0
    failed: int = 0
    broken: bool = False
    fail_error: dict[str, Any] | None = None
    finished: bool = False
    # cursor loops: the collection grows with each `loop.claimed`
    cursor: bool = False
    process: str = "row"  # row: one iteration per row; frame: one per claimed batch
    claiming: bool = False  # a claim command is outstanding
    claims: int = 0  # claims reported so far
    exhausted: bool = False  # a claim returned no rows
    #: The loop's commands in flight (a chunk of iterations is one): what
    #: `max_in_flight` counts.
    commands: set[int] = field(default_factory=set)
    #: The iterations' tool calls so far: their summed duration (ms) and how many (the
    #: chunk size is chosen from them, `flowtide.engine.chunks`).
    busy_ms: float = 0.0
    calls: int = 0

    @property
    def size(self) -> int:
        return len(self.collection)

    @property
    def completed(self) -> int:
        return self.success + self.failed

    def aggregate(self) -> dict[str, Any]:
        return {
            "results": [r for r, d in zip(self.results, self.done, strict=True) if d],
            "stats": {"total": self.size, "success": self.success, "failed": self.failed},
        }


@dataclass
class CommandRecord:
    command_id: int
    step: str
    attempt: int
    loop_instance: int | None
    loop_index: int | None
    issued_event_id: int
    cursor: bool = False  # a cursor loop's claim, not an iteration
    #: A chunk of iterations (`loop_count` > 1 in its `command.issued`): how many, and
    #: the indexes not reported yet (None for any other command). The command stays open
    #: until every one is, or until one of them breaks or fails the loop.
    count: int = 1
    pending: set[int] | None = None

    def iteration(self, payload: Any) -> int | None:
        """The loop index a report of this command is about: the command's own, or for a
        chunk the report's `loop_index` when it is one not reported yet (else None)."""
        if self.pending is None:
            return self.loop_index
        index = payload.get("loop_index") if isinstance(payload, dict) else None
        if isinstance(index, bool) or not isinstance(index, int):
            return None
        return index if index in self.pending else None

    def to_command(self, execution_id: int, attempt: int | None = None) -> Command:
        """The command this record tracks (with another `attempt` when re-issuing)."""
        return Command(
            command_id=self.command_id,
            execution_id=execution_id,
            step=self.step,
            attempt=self.attempt if attempt is None else attempt,
            loop_instance=self.loop_instance,
            loop_index=self.loop_index,
            issued_event_id=self.issued_event_id,
            extra={"cursor": True} if self.cursor else {},
        )
