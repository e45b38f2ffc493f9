"""A playbook text checked as `flowtide catalog register` would, without recording it
(`POST /api/catalog/validate`: the catalog editor and run form), and the facts of a valid
playbook. Checks are kept by the text's digest: a catalog version never changes, and a
3 MB playbook takes seconds to parse."""

from __future__ import annotations

import copy
import hashlib
import threading
from collections import OrderedDict
from typing import Any, Final

from typing_extensions import TypedDict

from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook

__all__ = ["CHECKS_KEPT", "PlaybookCheck", "PlaybookFacts", "check_playbook", "playbook_facts"]

#: How many playbook texts' checks are kept (`check_playbook`).
CHECKS_KEPT: Final = 32


class CheckProblem(TypedDict):
    """One thing wrong with a playbook text, and where (1-based; null when unknown)."""

    message: str
    line: int | None
    column: int | None
    step: str | None
    field: str | None
    expected: str | None


class PlaybookFacts(TypedDict):
    """What the catalog page and the run form show of a playbook."""

    name: str | None
    #: metadata.path as written (null when the text is invalid).
    path: Any
    workload: dict[str, Any] | None
    steps: int


class PlaybookCheck(PlaybookFacts):
    valid: bool
    errors: list[CheckProblem]


def _error_items(exc: PlaybookError) -> list[CheckProblem]:
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


def playbook_facts(playbook: Playbook) -> PlaybookFacts:
    """What the catalog page and the run form show of a valid playbook."""
    return {
        "name": playbook.name,
        "path": playbook.path,
        "workload": playbook.workload,
        "steps": len(playbook.steps),
    }


def check_playbook(content: str, source_file: str | None) -> PlaybookCheck:
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
_checks: OrderedDict[tuple[str, str | None], PlaybookCheck] = OrderedDict()
_checks_lock = threading.Lock()


def _check(content: str, source_file: str | None) -> PlaybookCheck:
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
