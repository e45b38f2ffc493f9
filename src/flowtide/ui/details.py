"""Documents the UI reads beyond the summary, the same on a server and in `flowtide ui`:
one step's detail (`GET /api/executions/{id}/steps/{step}`), a playbook text checked
for the catalog editor and run form (`POST /api/catalog/validate`), and the facts of a
registered playbook.

Everything shown is masked with the execution's secret set, and a result is sent only
when it is small enough to show (`MAX_RESULT_BYTES`): a loop's list of 100,000 results
is a size, not a download.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

from flowtide.engine.events import Event
from flowtide.engine.state import ExecutionState
from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook
from flowtide.redaction import mask_value

__all__ = [
    "CALL_TYPES",
    "CALLS_SHOWN",
    "MAX_RESULT_BYTES",
    "check_playbook",
    "playbook_facts",
    "step_document",
    "step_source",
]

#: The events that record one call of a step's tool (newest `CALLS_SHOWN` are shown).
CALL_TYPES: Final = ("call.done", "call.error")
CALLS_SHOWN: Final = 10
#: A result larger than this (as JSON) is named by its size only.
MAX_RESULT_BYTES: Final = 256 * 1024
#: How many playbook texts' checks are kept (`check_playbook`).
CHECKS_KEPT: Final = 32
#: At most this many lines of a step's YAML source.
MAX_SOURCE_LINES: Final = 200
#: Payload keys of a call event that the calls table shows as columns.
_CALL_FIELDS: Final = ("task", "attempt", "duration_ms")
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


def _call(event: Event) -> dict[str, Any]:
    payload = dict(event.payload or {})
    doc = {name: payload.pop(name, None) for name in _CALL_FIELDS}
    return {
        "event_id": str(event.event_id),
        "type": event.type,
        "time": event.time,
        **doc,
        "error": event.error,
        "meta": payload,
    }


def _spark(calls: Sequence[Event], result: Any) -> dict[str, Any] | None:
    meta = None
    for event in reversed(calls):
        found = (event.payload or {}).get("spark")
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
    return doc


def step_document(state: ExecutionState, step: str, calls: Sequence[Event]) -> dict[str, Any]:
    """One step of an execution: status, times, error, its YAML source, its result (when
    small enough), its loop's counts, its newest calls (`calls`: its `CALL_TYPES`
    events, oldest first) and, for a Spark step, the Spark run and the written dataset.

    Raises:
        KeyError: the playbook has no such step.
    """
    rec = state.steps[step]
    definition = state.playbook.steps[step]
    line, source = step_source(state.playbook, step)
    loop = state.loop_of(step)
    result, truncated, size = _sized(rec.result)
    doc: dict[str, Any] = {
        "execution_id": str(state.execution_id),
        "step": step,
        "kind": definition.tasks[0].kind if definition.tasks else None,
        "status": rec.status,
        "runs": rec.runs,
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
                "in_flight": 0 if state.terminal else len(loop.in_flight),
                "finished": loop.finished,
            }
            if loop is not None
            else None
        ),
        "calls": [_call(e) for e in reversed(calls[-CALLS_SHOWN:])],
        "spark": _spark(calls, rec.result),
    }
    masked: dict[str, Any] = mask_value(doc, state.secrets)
    return masked


def _error_items(exc: PlaybookError) -> list[dict[str, Any]]:
    errors = exc.errors if isinstance(exc, PlaybookErrors) else [exc]
    return [
        {
            "message": e.message,
            "line": e.line,
            "column": e.column,
            "step": e.step,
            "field": e.field,
            "expected": e.expected,
        }
        for e in errors
    ]


def playbook_facts(playbook: Playbook) -> dict[str, Any]:
    """What the catalog page and the run form show of a valid playbook."""
    return {
        "name": playbook.name,
        "path": playbook.path,
        "workload": playbook.workload,
        "steps": len(playbook.steps),
    }


def check_playbook(content: str, source_file: str | None) -> dict[str, Any]:
    """`POST /api/catalog/validate`: `valid`, the playbook's facts when it is, and its
    `errors` (message, line, column, step, field, expected) when not. Parses YAML: run
    it in a thread. The checks of the last `CHECKS_KEPT` texts are kept (a catalog
    version never changes, and a 3 MB playbook takes seconds to parse)."""
    key = (hashlib.sha256(content.encode()).hexdigest(), source_file)
    with _checks_lock:
        found = _checks.get(key)
        if found is not None:
            _checks.move_to_end(key)
            return copy.deepcopy(found)
    checked = _check(content, source_file)
    with _checks_lock:
        _checks[key] = checked
        while len(_checks) > CHECKS_KEPT:
            _checks.popitem(last=False)
    return copy.deepcopy(checked)


#: (sha256 of a text, its file) -> its check (kept by digest: never the texts).
_checks: OrderedDict[tuple[str, str | None], dict[str, Any]] = OrderedDict()
_checks_lock = threading.Lock()


def _check(content: str, source_file: str | None) -> dict[str, Any]:
    try:
        playbook = parse_playbook(content, source_file)
    except PlaybookError as exc:
        return {
            "valid": False,
            "name": None,
            "path": None,
            "workload": None,
            "steps": 0,
            "errors": _error_items(exc),
        }
    except RecursionError:  # the YAML parser recurses per nesting level
        error = PlaybookError("the YAML nests too deeply", file=source_file, line=1)
        return {
            "valid": False,
            "name": None,
            "path": None,
            "workload": None,
            "steps": 0,
            "errors": _error_items(error),
        }
    return {"valid": True, **playbook_facts(playbook), "errors": []}
