"""One step of an execution (`GET /api/executions/{id}/steps/{step}`, the UI's step
panel): status, times, error with the playbook's line, its YAML source, its result, its
loop's counts, its newest calls and, for a Spark step, the Spark run and the dataset.

Everything shown is masked with the execution's secret set, and a result is sent only
when it is small enough to show (`MAX_RESULT_BYTES`): a loop's list of 100,000 results
is a size, not a download.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from typing_extensions import TypedDict

from flowtide.engine import events as ev
from flowtide.engine.events import Event, payload_of
from flowtide.engine.state import ExecutionState
from flowtide.playbook.model import Playbook
from flowtide.redaction import mask_value
from flowtide.store.base import INTERRUPTED

__all__ = [
    "CALL_TYPES",
    "CALLS_SHOWN",
    "MAX_RESULT_BYTES",
    "StepDocument",
    "step_document",
    "step_source",
]

#: The events that record one call of a step's tool (newest `CALLS_SHOWN` are shown).
CALL_TYPES: Final = (ev.CALL_DONE, ev.CALL_ERROR)
CALLS_SHOWN: Final = 10
#: A result larger than this (as JSON) is named by its size only.
MAX_RESULT_BYTES: Final = 256 * 1024
#: At most this many lines of a step's YAML source.
MAX_SOURCE_LINES: Final = 200
#: Spark meta keys the Spark panel shows (from `flowtide.tools.spark`'s call meta).
_SPARK_META: Final = (
    "master",
    "mode",
    "app_id",
    "version",
    "ui_url",
    "jobs",
    "rows_written",
    "uri",
    "duration_ms",
)


class CallDocument(TypedDict):
    """One call of the step's tool: a `call.done` or `call.error` event."""

    event_id: str
    type: str
    time: float
    task: Any
    attempt: Any
    duration_ms: Any
    error: dict[str, Any] | None
    #: The rest of the event's payload (its result, a failed call's input...).
    meta: dict[str, Any]


class SparkRun(TypedDict):
    """A Spark step's run (from its newest call) and the dataset it wrote."""

    master: Any
    mode: Any
    app_id: Any
    version: Any
    ui_url: Any
    jobs: Any
    rows_written: Any
    uri: Any
    duration_ms: Any
    format: Any
    row_count: Any
    schema: list[Any]
    preview: list[Any]


class StepLoop(TypedDict):
    total: int
    done: int
    succeeded: int
    failed: int
    in_flight: int
    finished: bool


class StepDocument(TypedDict):
    execution_id: str
    step: str
    kind: str | None
    #: Its status (`interrupted`: running when its execution's process went away).
    status: str
    runs: int
    #: Calls of its tasks (each try of each task), and how many were retries.
    attempts: int
    retries: int
    started: float | None
    ended: float | None
    duration: float | None
    error: dict[str, Any] | None
    file: str | None
    line: int | None
    #: The step's YAML (its `- step:` line and the lines under it).
    source: str
    #: Null when larger than `MAX_RESULT_BYTES` (`result_truncated`).
    result: Any
    result_truncated: bool
    result_size: int
    loop: StepLoop | None
    calls: list[CallDocument]
    spark: SparkRun | None


def step_source(playbook: Playbook, step: str) -> tuple[int | None, str]:
    """(first line, text) of `step`'s entry in the playbook's YAML: its `- step:` line
    and the lines indented under it (at most `MAX_SOURCE_LINES`)."""
    line = playbook.steps[step].line
    lines = playbook.text.splitlines()
    if line is None or not 1 <= line <= len(lines):
        return None, ""
    first = lines[line - 1]
    indent = len(first) - len(first.lstrip(" -"))
    dash = len(first) - len(first.lstrip(" "))
    out = [first]
    for text in lines[line : line - 1 + MAX_SOURCE_LINES]:
        stripped = text.lstrip(" ")
        if stripped and not stripped.startswith("#"):
            depth = len(text) - len(stripped)
            if depth < indent or (depth == dash and stripped.startswith("-")):
                break
        out.append(text)
    while out and not out[-1].strip():
        out.pop()
    return line, "\n".join(out)


def _sized(value: Any) -> tuple[Any, bool, int]:
    """(value or None, truncated, size in bytes of its JSON)."""
    text = json.dumps(value, default=str, separators=(",", ":"))
    size = len(text.encode())
    return (None, True, size) if size > MAX_RESULT_BYTES else (value, False, size)


def _call(event: Event) -> CallDocument:
    payload: dict[str, Any] = dict(payload_of(event, ev.CALL_DONE))  # or call.error
    return {
        "event_id": str(event.event_id),
        "type": event.type,
        "time": event.time,
        "task": payload.pop("task", None),
        "attempt": payload.pop("attempt", None),
        "duration_ms": payload.pop("duration_ms", None),
        "error": event.error,
        "meta": payload,
    }


def _spark(calls: Sequence[Event], result: Any) -> SparkRun | None:
    meta = None
    for event in reversed(calls):
        found = payload_of(event, ev.CALL_DONE).get("spark")
        if isinstance(found, dict):
            meta = found
            break
    if meta is None:
        return None
    doc: dict[str, Any] = {key: meta.get(key) for key in _SPARK_META}
    ref = result if isinstance(result, dict) else {}
    doc["format"] = ref.get("format")
    doc["row_count"] = ref.get("row_count")
    schema = ref.get("schema")
    doc["schema"] = schema if isinstance(schema, list) else []
    preview = ref.get("preview")
    doc["preview"] = preview if isinstance(preview, list) else []
    run: SparkRun = doc  # type: ignore[assignment]
    return run


def step_document(
    state: ExecutionState, step: str, calls: Sequence[Event], interrupted: bool = False
) -> StepDocument:
    """One step of an execution: status, times, error, its YAML source, its result (when
    small enough), its loop's counts, its newest calls (`calls`: its `CALL_TYPES`
    events, oldest first) and, for a Spark step, the Spark run and the written dataset.
    `interrupted`: no process runs the execution any more (`flowtide.runlock`): a step
    it was running is `interrupted`, nothing in flight.

    Raises:
        KeyError: the playbook has no such step.
    """
    rec = state.steps[step]
    definition = state.playbook.steps[step]
    line, source = step_source(state.playbook, step)
    loop = state.loop_of(step)
    result, truncated, size = _sized(rec.result)
    stopped = state.terminal or interrupted
    status = rec.status
    if interrupted and status == "running":
        status = INTERRUPTED
    doc: StepDocument = {
        "execution_id": str(state.execution_id),
        "step": step,
        "kind": definition.tasks[0].kind if definition.tasks else None,
        "status": status,
        "runs": rec.runs,
        "attempts": rec.attempts,
        "retries": rec.retries,
        "started": rec.started,
        "ended": rec.ended,
        "duration": (
            rec.ended - rec.started if rec.started is not None and rec.ended is not None else None
        ),
        "error": rec.error,
        "file": state.playbook.file,
        "line": line,
        "source": source,
        "result": result,
        "result_truncated": truncated,
        "result_size": size,
        "loop": (
            {
                "total": loop.size,
                "done": loop.completed,
                "succeeded": loop.success,
                "failed": loop.failed,
                "in_flight": 0 if stopped else len(loop.in_flight),
                "finished": loop.finished,
            }
            if loop is not None
            else None
        ),
        "calls": [_call(e) for e in reversed(calls[-CALLS_SHOWN:])],
        "spark": _spark(calls, rec.result),
    }
    masked: StepDocument = mask_value(doc, state.secrets)
    return masked
