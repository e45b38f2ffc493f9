"""Text that cannot be stored or sent: NUL characters and lone surrogates.

A Python `str` can hold both; PostgreSQL's text refuses NUL, UTF-8 (every HTTP answer,
every log line) has no encoding for a surrogate code point, and a value holding one that
got into an event made every read of its execution fail. So data (a step's result, a
workload, a playbook's names) holding one is **refused where it enters**, naming where
(`bad_text`); free text that only reports (a step's stdout, an error message) has them
**replaced** by U+FFFD (`clean_text`, `clean_value`).

In a Python `str` every surrogate code point is "lone": a character outside the Basic
Multilingual Plane is one code point, never a pair.
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = ["REPLACEMENT", "bad_char", "bad_text", "clean_text", "clean_value", "maybe_bad_json"]

_BAD: Final = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT: Final = "\ufffd"


def bad_char(text: str) -> str | None:
    """What in `text` cannot be stored ("a NUL character", "a lone surrogate (U+D800)"),
    or None."""
    found = _BAD.search(text)
    if found is None:
        return None
    char = found.group()
    if char == "\x00":
        return "a NUL character"
    return f"a lone surrogate (U+{ord(char):04X})"


def bad_text(value: Any, root: str = "value") -> tuple[str, str] | None:
    """Where `value` (JSON-like data: dicts, lists, scalars) first holds text that cannot
    be stored, and what: (`root['a'][2]`, "a NUL character"), or None. Object keys count
    too. Walked without recursion."""
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            what = bad_char(item)
            if what is not None:
                return path, what
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                shown = f"{path}[{_key(key)}]"
                if isinstance(key, str) and (what := bad_char(key)) is not None:
                    return shown + " (its key)", what
                stack.append((child, shown))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}[{i}]") for i, child in reversed(list(enumerate(item))))
    return None


def _key(key: Any) -> str:
    text = ascii(key)
    return text if len(text) <= 60 else text[:57] + "..."


def maybe_bad_json(text: str) -> bool:
    """Whether JSON text written with `ensure_ascii` (Python's default) may hold such
    text: a cheap test before `bad_text` walks the value (characters outside the BMP are
    written as surrogate pairs too, so a hit is only a maybe)."""
    return "\\u0000" in text or "\\ud" in text


def clean_text(text: str) -> str:
    """`text` with every NUL and lone surrogate replaced by U+FFFD."""
    return _BAD.sub(REPLACEMENT, text) if _BAD.search(text) else text


def clean_value(value: Any) -> Any:
    """`value` (JSON-like data) with its text cleaned (`clean_text`), keys included; the
    value itself when there is nothing to clean."""
    if bad_text(value) is None:
        return value
    return _cleaned(value)


def _cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: _cleaned(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cleaned(v) for v in value]
    return value
