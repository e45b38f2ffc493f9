"""Events and commands: the values the engine folds and emits.

Event type names follow NoETL (see DESIGN.md "Events").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PLAYBOOK_INITIALIZED = "playbook.initialized"
WORKFLOW_INITIALIZED = "workflow.initialized"
STEP_ENTER = "step.enter"
STEP_EXIT = "step.exit"
STEP_SKIPPED = "step.skipped"
LOOP_STARTED = "loop.started"
LOOP_ITEM = "loop.item"
LOOP_CLAIMED = "loop.claimed"  # a cursor loop's claim returned rows (or none: exhausted)
LOOP_DONE = "loop.done"
COMMAND_ISSUED = "command.issued"
COMMAND_CLAIMED = "command.claimed"
COMMAND_STARTED = "command.started"
COMMAND_HEARTBEAT = "command.heartbeat"
COMMAND_COMPLETED = "command.completed"
COMMAND_FAILED = "command.failed"
CALL_DONE = "call.done"
CALL_ERROR = "call.error"
CTX_UPDATED = "ctx.updated"
WORKFLOW_COMPLETED = "workflow.completed"
WORKFLOW_FAILED = "workflow.failed"
PLAYBOOK_COMPLETED = "playbook.completed"
PLAYBOOK_FAILED = "playbook.failed"
PLAYBOOK_CANCELLED = "playbook.cancelled"
EXECUTION_CANCELLED = "execution.cancelled"
# Values a tool touched (passwords, tokens, DSNs): they join the execution's secret set,
# which seals what is stored and masks what is shown. Always stored sealed.
SECRETS_ADDED = "secrets.added"

TERMINAL_TYPES = frozenset({PLAYBOOK_COMPLETED, PLAYBOOK_FAILED, PLAYBOOK_CANCELLED})


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of an execution's append-only event log.

    `payload` and `error` are JSON-serialisable mappings; `time` is Unix seconds.
    """

    event_id: int
    execution_id: int
    type: str
    step: str | None = None
    status: str | None = None
    payload: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    parent_event_id: int | None = None
    command_id: int | None = None
    worker_id: str | None = None
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "execution_id": self.execution_id,
            "type": self.type,
            "step": self.step,
            "status": self.status,
            "payload": self.payload,
            "error": self.error,
            "parent_event_id": self.parent_event_id,
            "command_id": self.command_id,
            "worker_id": self.worker_id,
            "time": self.time,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        return cls(
            event_id=int(data["event_id"]),
            execution_id=int(data["execution_id"]),
            type=str(data["type"]),
            step=data.get("step"),
            status=data.get("status"),
            payload=data.get("payload"),
            error=data.get("error"),
            # The HTTP API writes snowflake ids as strings (JSON numbers lose them).
            parent_event_id=_opt_int(data.get("parent_event_id")),
            command_id=_opt_int(data.get("command_id")),
            worker_id=data.get("worker_id"),
            time=float(data.get("time") or 0.0),
        )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class Command:
    """Work for a worker: run `step` (one loop iteration when `loop_index` is set).

    A command names what to run, not how: the runtime builds the render context from
    the execution state when it dispatches, so a command stays small and replayable.
    """

    command_id: int
    execution_id: int
    step: str
    attempt: int = 1
    loop_instance: int | None = None
    loop_index: int | None = None
    issued_event_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "execution_id": self.execution_id,
            "step": self.step,
            "attempt": self.attempt,
            "loop_instance": self.loop_instance,
            "loop_index": self.loop_index,
            "issued_event_id": self.issued_event_id,
            "extra": self.extra,
        }
