"""What one command made: its calls (`Call`, one per attempt of a task, each a call.done
or call.error event) and its `Outcome` (status, result, the action the engine follows,
ctx updates, the secrets the tools touched), built as the tasks run (`Record`). Errors of
any kind become the error documents events carry (`error_dict`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from flowtide.errors import FlowtideError, TemplateError, ToolError


@dataclass
class Call:
    """One attempt of one task (becomes a call.done / call.error event)."""

    task: str
    attempt: int
    ok: bool
    duration_ms: float
    started: float
    error: dict[str, Any] | None = None
    stdout: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # the tool's call_meta


@dataclass
class Outcome:
    status: str  # ok | error
    result: Any
    action: str = "continue"  # continue | break | fail | jump
    error: dict[str, Any] | None = None
    jump_to: str | None = None
    ctx: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, Any] | None = None
    calls: list[Call] = field(default_factory=list)
    started: float = 0.0
    #: Values the tools touched (passwords, tokens, DSNs). The results, errors and
    #: output above hold them as the tools saw them: they join the execution's secret
    #: set (a `secrets.added` event), which seals them at rest and masks them on display.
    secrets: set[str] = field(default_factory=set)
    #: The JSON text of `result` when the runner made it on the way (a result kept
    #: inline); None when not known. Never sent: a spark loop writes it as the item's row.
    text: str | None = None
    #: A command of many items (a spark loop): its exact counts as it ended (`done`,
    #: `total`, `failed`, `per_second`), reported as its last `command.progress`.
    items: dict[str, Any] | None = None


@dataclass(slots=True)
class Record:
    """What a command has made so far: the outcome's parts, filled as its tasks run."""

    started: float
    #: ctx updates (top-level keys), of every `set` applied so far.
    ctx: dict[str, Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    #: Each task's result, by task name (the last attempt's).
    results: dict[str, Any] = field(default_factory=dict)
    secrets: set[str] = field(default_factory=set)

    def outcome(
        self,
        status: str,
        result: Any,
        action: str,
        error: dict[str, Any] | None,
        jump_to: str | None = None,
        tasks: dict[str, Any] | None = None,
    ) -> Outcome:
        """The command's outcome, with what it made so far. (Positional: made once per
        command, a loop's item included.)"""
        return Outcome(
            status,
            result,
            action,
            error,
            jump_to,
            self.ctx,
            tasks,
            self.calls,
            self.started,
            self.secrets,
        )

    def failed(self, error: dict[str, Any]) -> Outcome:
        """The command fails with `error` before its tasks made a result."""
        return self.outcome("error", None, "fail", error)


def error_dict(exc: BaseException) -> dict[str, Any]:
    """`exc` as the error document of a call.error event and a policy's `output.error`."""
    if isinstance(exc, ToolError):
        return exc.to_dict()
    if isinstance(exc, TemplateError):
        return {
            "kind": "template_error",
            "retryable": False,
            "code": None,
            "message": str(exc),
            "http_status": None,
            "status": None,
            "missing": exc.missing,
        }
    if isinstance(exc, FlowtideError):
        return {
            "kind": "error",
            "retryable": False,
            "code": type(exc).__name__,
            "message": str(exc),
            "http_status": None,
            "status": None,
        }
    return {
        "kind": "internal_error",
        "retryable": False,
        "code": type(exc).__name__,
        "message": f"{type(exc).__name__}: {exc}",
        "http_status": None,
        "status": None,
    }


def crashed(exc: BaseException) -> Outcome:
    """The outcome of a command whose run raised (a runtime bug): a failed command,
    never a lost one."""
    return Outcome(
        "error",
        None,
        action="fail",
        error={"kind": "internal_error", "message": f"{type(exc).__name__}: {exc}"},
        started=time.time(),
    )
