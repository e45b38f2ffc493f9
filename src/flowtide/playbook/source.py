"""YAML loading that remembers where every node came from.

`load_yaml` returns plain Python data (dict/list/str/int/float/bool/None) and a
`Positions` index from node path (a tuple of keys and list indexes) to the 1-based
line and column of that node, so validation errors can point into the file.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from flowtide.errors import PlaybookError

Path = tuple[str | int, ...]


class Positions:
    """Line/column of each node, by path. Lookups fall back to the nearest ancestor."""

    def __init__(self) -> None:
        self._at: dict[Path, tuple[int, int]] = {}

    def set(self, path: Path, line: int, column: int) -> None:
        self._at[path] = (line + 1, column + 1)

    def has(self, path: Path) -> bool:
        return tuple(path) in self._at

    def get(self, path: Path) -> tuple[int | None, int | None]:
        probe = tuple(path)
        while True:
            if probe in self._at:
                return self._at[probe]
            if not probe:
                return None, None
            probe = probe[:-1]


def _plain(node: Any, path: Path, positions: Positions) -> Any:
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key in node:
            child = (*path, key)
            try:
                line, col = node.lc.key(key)
            except (KeyError, TypeError):
                line, col = node.lc.line, node.lc.col
            positions.set(child, line, col)
            out[str(key) if not isinstance(key, str) else key] = _plain(node[key], child, positions)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for index, value in enumerate(node):
            child = (*path, index)
            try:
                line, col = node.lc.item(index)
            except (KeyError, TypeError, IndexError):
                line, col = node.lc.line, node.lc.col
            positions.set(child, line, col)
            items.append(_plain(value, child, positions))
        return items
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, datetime.datetime | datetime.date):
        return node.isoformat()
    return node


#: Nesting a playbook may use. The YAML parser recurses per level (and slows down
#: sharply past a few hundred); real playbooks stay far below.
MAX_NESTING = 100
_NESTING_CHARS = re.compile(r"[\[\]{}\n]")
_INDENT = re.compile(r"^( *)\S", re.MULTILINE)


def _check_nesting(text: str, file: str | None) -> None:
    """Refuse flow collections nested deeper than MAX_NESTING, or block indentation deep
    enough to hold that many levels, before the parser recurses into them."""
    depth, line = 0, 1
    for match in _NESTING_CHARS.finditer(text):
        char = match.group()
        if char == "\n":
            line += 1
        elif char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise PlaybookError(
                    f"the YAML nests deeper than {MAX_NESTING} levels",
                    file=file,
                    line=line,
                )
        else:
            depth = max(0, depth - 1)
    for match in _INDENT.finditer(text):
        if len(match.group(1)) > 2 * MAX_NESTING:
            raise PlaybookError(
                f"the YAML is indented deeper than {2 * MAX_NESTING} columns",
                file=file,
                line=text.count("\n", 0, match.start()) + 1,
            )


def load_yaml(text: str, file: str | None = None) -> tuple[Any, Positions]:
    """Parse `text`; raise PlaybookError with the file position on a syntax error."""
    _check_nesting(text, file)
    yaml = YAML(typ="rt")
    try:
        raw = yaml.load(text)
    except RecursionError:
        raise PlaybookError("the YAML nests too deeply", file=file, line=1) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = f"YAML syntax error: {exc.problem or exc.context}"
        if (
            exc.context
            and exc.context_mark
            and exc.problem_mark
            and exc.context_mark.line != mark.line
        ):
            message += f" ({exc.context} that starts at line {exc.context_mark.line + 1})"
        raise PlaybookError(
            message,
            file=file,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from exc
    except YAMLError as exc:
        raise PlaybookError(f"YAML syntax error: {exc}", file=file) from exc
    positions = Positions()
    positions.set((), 0, 0)
    return _plain(raw, (), positions), positions
