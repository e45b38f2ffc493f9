"""A failed python step's error with its traceback: the user's frames (innermost last),
each placed in the playbook (`file:line`) when the code is the task's inline `code:`.

The python tool reports frames numbered from the code's first line
(`flowtide.tools.python_code`); the step runner knows where the task's `code:` sits in
the playbook's YAML, so it adds the offset here: `error["traceback"]` is the short
traceback and the message's `(line N: …)` names the playbook's line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from flowtide.playbook.model import Playbook, Step, Task

__all__ = ["with_traceback"]

#: Frames a traceback shows at most (the innermost).
MAX_FRAMES: Final = 8
_CODE_KEY = re.compile(r"^(\s*(?:-\s+)?)code:\s*(.*)$")
_BLOCK = re.compile(r"^[|>][-+0-9]*\s*(#.*)?$")


def code_start(playbook: Playbook, step: Step, task: Task) -> int | None:
    """The playbook line of the first line of `task`'s inline `code:` (None: unknown,
    e.g. the code comes from a `script:` file or a flow-style mapping)."""
    start = task.line or step.line
    if start is None:
        return None
    lines = playbook.text.splitlines()
    names = [t.name for t in step.tasks]
    for number in range(start, min(len(lines), start + 2000) + 1):
        text = lines[number - 1]
        if number > start and text.lstrip().startswith("- step:"):
            return None  # the next step: this task has no code key of its own
        if len(names) > 1 and number > start and re.match(r"^\s*-\s+name:", text):
            return None  # the next task of a pipeline
        found = _CODE_KEY.match(text)
        if found is None:
            continue
        value = found[2].strip()
        if _BLOCK.match(value):
            return number + 1
        return number if value and not value.startswith(("{", "[")) else None
    return None


def with_traceback(
    error: dict[str, Any], data: Any, playbook: Playbook, step: Step, task: Task
) -> dict[str, Any]:
    """`error` (a python_error's document) with `traceback`, and its message's line
    mapped to the playbook's, from the tool's `data` (its `frames`)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("frames"), list):
        return error
    frames = [f for f in data["frames"] if isinstance(f, Mapping)][-MAX_FRAMES:]
    if not frames:
        return error
    first = code_start(playbook, step, task) if data.get("filename") == "<code>" else None
    file = Path(playbook.file).name if playbook.file else "playbook"
    if first is None:
        file = str(data.get("filename") or "<code>")
    out = ["Traceback (most recent call last):"]
    for frame in frames:
        line = int(frame.get("line") or 0)
        where = line + first - 1 if first is not None else line
        out.append(f'  File "{file}", line {where}, in {frame.get("function")}')
        if frame.get("source"):
            out.append(f"    {frame['source']}")
    exception = str(data.get("exception") or error.get("code") or "Error")
    message = str(error.get("message") or "")
    out.append(message.rsplit(" (line ", 1)[0] if " (line " in message else exception)
    mapped = dict(error)
    mapped["traceback"] = "\n".join(out)
    innermost = int(frames[-1].get("line") or 0)
    if first is not None and f" (line {innermost}" in message:
        head, _, tail = message.rpartition(f" (line {innermost}")
        mapped["message"] = f"{head} ({file}:{innermost + first - 1}{tail}"
    return mapped
