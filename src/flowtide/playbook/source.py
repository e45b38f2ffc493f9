"""YAML loading that remembers where every node came from.

`load_yaml` returns plain Python data (dict/list/str/int/float/bool/None) and a
`Positions` index from node path (a tuple of keys and list indexes) to the 1-based
line and column of that node, so validation errors can point into the file.

Untrusted text is bounded before and while it is parsed: its size (`MAX_PLAYBOOK_BYTES`),
its nesting (`MAX_NESTING`) and what its aliases expand to (`MAX_ALIAS_NODES`,
`MAX_ALIAS_CHARS`: a "billion laughs" file is a few lines of anchors that expand to
billions of nodes).
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.composer import Composer
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import MappingNode, SequenceNode
from ruamel.yaml.reader import ReaderError
from ruamel.yaml.scalarstring import FoldedScalarString, LiteralScalarString

from flowtide.errors import PlaybookError

Path = tuple[str | int, ...]

#: Largest playbook text (UTF-8 bytes). Real playbooks are a few kilobytes; the parser
#: is pure Python and slow on megabytes.
MAX_PLAYBOOK_BYTES = 10 * 1024 * 1024

#: What aliases (`*name`, merge keys `<<: *name`) may add to a document, summed over
#: every alias: each use of one copies everything its anchor holds.
MAX_ALIAS_NODES = 100_000
MAX_ALIAS_CHARS = MAX_PLAYBOOK_BYTES


class Positions:
    """Line/column of each node, by path. Lookups fall back to the nearest ancestor."""

    def __init__(self) -> None:
        self._at: dict[Path, tuple[int, int]] = {}
        # String values: (line of their first character, its column, block literal?).
        self._text: dict[Path, tuple[int, int, bool]] = {}

    def set(self, path: Path, line: int, column: int) -> None:
        self._at[path] = (line + 1, column + 1)

    def set_text(self, path: Path, line: int, column: int, block: bool) -> None:
        self._text[path] = (line, column, block)

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

    def inside(
        self, path: Path, line: int, column: int | None = None
    ) -> tuple[int | None, int | None]:
        """File line and column of `line`/`column` (1-based) of the string at `path`.

        Exact inside a `|` block, whose lines are the file's lines; elsewhere YAML may
        have folded lines together, so any line maps to where the string starts.
        """
        at = self._text.get(tuple(path))
        if at is None:
            return self.get(path)
        first, indent, block = at
        if block:
            return first + line - 1, (indent + column) if column is not None else indent + 1
        if line == 1 and column is not None:
            return first, indent + column
        return first, indent + 1


def _text_position(
    value: Any, line: int, column: int, lines: list[str]
) -> tuple[int, int, bool] | None:
    """Where a string value's text starts (1-based line, 0-based indentation)."""
    if isinstance(value, LiteralScalarString):
        # `line` is the `|` indicator's; the text starts on the next line, indented.
        for offset, text in enumerate(lines[line + 1 :]):
            if text.strip():
                return line + 2, len(text) - len(text.lstrip(" ")), True
            if offset > 1000:
                break
        return line + 2, column, True
    if isinstance(value, FoldedScalarString):
        return line + 2, column, False
    if isinstance(value, str):
        return line + 1, column, False
    return None


def _plain(node: Any, path: Path, positions: Positions, lines: list[str]) -> Any:
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key in node:
            child = (*path, key)
            try:
                line, col = node.lc.key(key)
            except (KeyError, TypeError):
                line, col = node.lc.line, node.lc.col
            positions.set(child, line, col)
            value = node[key]
            try:
                vline, vcol = node.lc.value(key)
            except (KeyError, TypeError):
                vline, vcol = line, col
            text = _text_position(value, vline, vcol, lines)
            if text is not None:
                positions.set_text(child, *text)
            out[str(key) if not isinstance(key, str) else key] = _plain(
                value, child, positions, lines
            )
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
            text = _text_position(value, line, col, lines)
            if text is not None:
                positions.set_text(child, *text)
            items.append(_plain(value, child, positions, lines))
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


class _PositionedError(Exception):
    """A problem found inside ruamel (an alias over a limit, a value that cannot be
    built), with the position of the node."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark


class _MeasuringComposer(Composer):
    """Ruamel's composer, keeping count of what the aliases it resolves stand for.

    Every node gets its expanded size (nodes, characters of scalars, height) when it is
    composed; an alias adds its anchor's size to the document's total. So the count is
    linear in the text however the aliases nest, and the limit trips at the alias that
    crosses it, before anything is constructed.
    """

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        # YAML lets an anchor be defined again (later aliases use the latest); ruamel
        # warns, and a warning is not an error to report.
        self.warn_double_anchors = False
        self._sizes: dict[int, tuple[int, int, int]] = {}
        self._alias_nodes = 0
        self._alias_chars = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.parser.check_event(AliasEvent):
            event = self.parser.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                self._count_alias(event, target)
            return super().compose_node(parent, index)
        node = super().compose_node(parent, index)
        self._sizes[id(node)] = self._size(node)
        return node

    def _count_alias(self, event: Any, target: Any) -> None:
        size = self._sizes.get(id(target))
        if size is None:
            raise _PositionedError(
                f"alias '*{event.anchor}' is used inside the node it names (a cycle)",
                event.start_mark,
            )
        nodes, chars, height = size
        self._alias_nodes += nodes
        self._alias_chars += chars
        if self._alias_nodes > MAX_ALIAS_NODES:
            raise _PositionedError(
                f"too many aliases: they expand to more than {MAX_ALIAS_NODES:,} nodes",
                event.start_mark,
            )
        if self._alias_chars > MAX_ALIAS_CHARS:
            raise _PositionedError(
                f"too many aliases: they expand to more than {MAX_ALIAS_CHARS:,} characters",
                event.start_mark,
            )
        if self.depth + height >= MAX_NESTING:
            raise _PositionedError(
                f"alias '*{event.anchor}' nests the YAML deeper than {MAX_NESTING} levels",
                event.start_mark,
            )

    def _size(self, node: Any) -> tuple[int, int, int]:
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            return 1, len(node.value) if isinstance(node.value, str) else 1, 0
        nodes, chars, height = 1, 0, 0
        for child in children:
            n, c, h = self._sizes.get(id(child), (1, 0, 0))
            nodes += n
            chars += c
            height = max(height, h + 1)
        return nodes, chars, height


class _LocatingConstructor(RoundTripConstructor):
    """Ruamel's round-trip constructor; a tagged value it cannot build (`!!int abc`,
    `!!timestamp 2024-13-45`) fails with its node's position instead of a bare
    ValueError from deep inside ruamel."""

    def construct_non_recursive_object(self, node: Any, tag: str | None = None) -> Any:
        try:
            return super().construct_non_recursive_object(node, tag)
        except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
            raise _PositionedError(
                f"cannot read the value tagged {node.tag}: {type(exc).__name__}: {exc}",
                node.start_mark,
            ) from exc


def _check_size(text: str, file: str | None) -> None:
    # Characters are at most four bytes: encode only when the count alone cannot tell.
    size = len(text)
    if size * 4 > MAX_PLAYBOOK_BYTES:
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_PLAYBOOK_BYTES:
        raise PlaybookError(
            f"the playbook is {size:,} bytes, more than the limit of "
            f"{MAX_PLAYBOOK_BYTES:,} bytes ({MAX_PLAYBOOK_BYTES // (1024 * 1024)} MiB)",
            file=file,
        )


def load_yaml(text: str, file: str | None = None) -> tuple[Any, Positions]:
    """Parse `text`; raise PlaybookError with the file position on a syntax error.

    Raises:
        PlaybookError: a YAML error, a text over `MAX_PLAYBOOK_BYTES`, nesting deeper than
            `MAX_NESTING` or aliases that expand past `MAX_ALIAS_NODES`/`MAX_ALIAS_CHARS`.
    """
    _check_size(text, file)
    _check_nesting(text, file)
    yaml = YAML(typ="rt")
    yaml.Composer = _MeasuringComposer
    yaml.Constructor = _LocatingConstructor
    try:
        raw = yaml.load(text)
    except RecursionError:
        raise PlaybookError("the YAML nests too deeply", file=file, line=1) from None
    except _PositionedError as exc:
        raise PlaybookError(
            exc.message,
            file=file,
            line=exc.mark.line + 1 if exc.mark else None,
            column=exc.mark.column + 1 if exc.mark else None,
        ) from None
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
    except ReaderError as exc:
        # A character YAML does not allow (control characters): ruamel gives its offset.
        at = min(max(int(exc.position or 0), 0), len(text))
        line_start = text.rfind("\n", 0, at) + 1
        char = exc.character
        shown = f"#x{char:04x}" if isinstance(char, int) else repr(char)
        raise PlaybookError(
            f"YAML syntax error: character {shown} is not allowed in YAML ({exc.reason})",
            file=file,
            line=text.count("\n", 0, at) + 1,
            column=at - line_start + 1,
        ) from exc
    except YAMLError as exc:
        raise PlaybookError(f"YAML syntax error: {exc}", file=file) from exc
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        # The constructor's own failures on odd input (a merge key naming something that
        # is not a mapping, an invalid !!timestamp...) carry no position.
        raise PlaybookError(
            f"the YAML cannot be read: {type(exc).__name__}: {exc}", file=file
        ) from exc
    positions = Positions()
    positions.set((), 0, 0)
    return _plain(raw, (), positions, text.splitlines()), positions
