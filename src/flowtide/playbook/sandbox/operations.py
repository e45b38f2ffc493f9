"""Operations that can make a value larger than their inputs, sized before they run:
the operators `*`, `+`, `%` and `**`, printf-style formatting, `str.format` (a formatter
that refuses a field's width or a total over the limit) and the string methods that
grow a string (`ljust`, `center`, `replace`, `join`, `expandtabs`, `translate`, ...).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from jinja2.sandbox import SandboxedFormatter

from flowtide.playbook.sandbox.limits import TemplateLimits
from flowtide.playbook.sandbox.sizes import (
    _LOG2_10,
    _check_chars,
    _check_digits,
    _int_digits,
    _is_int,
    _too_many,
    measure,
)

# -- operators --------------------------------------------------------------------------


def _check_binop(operator: str, left: Any, right: Any, limits: TemplateLimits) -> None:
    what = f"'{operator}'"
    if operator == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, str | bytes | list | tuple) and isinstance(count, int):
                size = len(seq) * max(int(count), 0)
                if isinstance(seq, str | bytes):
                    _check_chars(what, size, limits)
                elif size > limits.max_items:
                    raise _too_many(what, size, limits)
                return
        if _is_int(left) and _is_int(right):
            _check_digits(what, _int_digits(left) + _int_digits(right), limits)
    elif operator == "+":
        if isinstance(left, str | bytes) and isinstance(right, str | bytes):
            _check_chars(what, len(left) + len(right), limits)
        elif isinstance(left, list | tuple) and isinstance(right, list | tuple):
            if len(left) + len(right) > limits.max_items:
                raise _too_many(what, len(left) + len(right), limits)
        elif _is_int(left) and _is_int(right):
            _check_digits(what, max(_int_digits(left), _int_digits(right)) + 1, limits)
    elif operator == "%":
        if isinstance(left, str):
            _check_chars(what, printf_size(left, right, limits), limits)
    elif operator == "**":
        if _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            # Bound the digits from the operands' bit lengths, without computing the power.
            bits = (abs(left).bit_length() - 1) * right
            _check_digits(what, int(bits / _LOG2_10) + 1, limits)


_PRINTF = re.compile(
    r"%(?:\((?P<key>[^)]*)\))?[-#0 +]*(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?[hlL]?"
    r"(?P<conv>[diouxXeEfFgGcrsa%])"
)


def printf_size(fmt: str, args: Any, limits: TemplateLimits) -> int:
    """An upper bound of the length of `fmt % args` (printf-style), without formatting."""
    values = list(args) if isinstance(args, tuple) else [args]
    mapping = args if isinstance(args, Mapping) else None
    size = len(fmt)
    position = 0

    def take() -> Any:
        nonlocal position
        value = values[position] if position < len(values) else None
        position += 1
        return value

    for match in _PRINTF.finditer(fmt):
        if match["conv"] == "%":
            continue
        pad = 0
        for part in (match["width"], match["prec"]):
            if part == "*":
                star = take()
                pad += abs(star) if _is_int(star) else 0
            elif part:
                pad += int(part)
        value = mapping.get(match["key"]) if mapping is not None and match["key"] else take()
        size += pad + measure(value, limits.max_chars, limits)
        if size > limits.max_chars:
            return size
    return size


# -- str.format -------------------------------------------------------------------------

_SPEC_NUMBERS = re.compile(r"\d+")


class _SizedFormatter(SandboxedFormatter):
    """str.format in the sandbox, refusing before a field's width or the total is over
    the limit (`'{:>999999999}'.format(1)`, `'{0}{0}{0}...'.format(big)`)."""

    def __init__(self, env: Any, limits: TemplateLimits) -> None:
        super().__init__(env)
        self._limits = limits
        self._size = 0

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        self._size = len(format_string)
        return super().vformat(format_string, args, kwargs)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion is not None:
            _check_chars(
                "str.format", measure(value, self._limits.max_chars, self._limits), self._limits
            )
        return super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> Any:
        widths = sum(int(n) for n in _SPEC_NUMBERS.findall(format_spec) if len(n) < 12)
        if any(len(n) >= 12 for n in _SPEC_NUMBERS.findall(format_spec)):
            widths = self._limits.max_chars + 1
        self._size += widths + measure(value, self._limits.max_chars, self._limits)
        _check_chars("str.format", self._size, self._limits)
        return super().format_field(value, format_spec)


# -- string methods ---------------------------------------------------------------------


def _replace_size(s: str | bytes, old: Any, new: Any, count: Any) -> int:
    if not isinstance(old, str | bytes) or not isinstance(new, str | bytes):
        return len(s)
    hits = len(s) + 1 if not old else s.count(old)  # type: ignore[arg-type]
    if _is_int(count) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(len(new) - len(old), 0)


def _join_size(sep: str | bytes, items: Collection[Any], limits: TemplateLimits) -> int:
    size = len(sep) * max(len(items) - 1, 0)
    for item in items:
        size += measure(item, limits.max_chars, limits)
        if size > limits.max_chars:
            break
    return size


def _check_str_method(
    owner: str | bytes,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    limits: TemplateLimits,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    what = f"str.{name}()"
    if name in ("ljust", "rjust", "center", "zfill"):
        width = args[0] if args else kwargs.get("width")
        if isinstance(width, int):
            _check_chars(what, width, limits)
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tabsize, int):
            tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
            _check_chars(what, len(owner) + tabs * tabsize, limits)
    elif name == "replace" and len(args) >= 2:
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        _check_chars(what, _replace_size(owner, args[0], args[1], count), limits)
    elif name == "join" and args:
        items = args[0]
        if not isinstance(items, Collection):
            # A generator (e.g. from `map`): made into a list once, then sized.
            items = list(items)
            args = (items, *args[1:])
        _check_chars(what, _join_size(owner, items, limits), limits)
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str | bytes)), default=1)
        _check_chars(what, len(owner) * max(longest, 1), limits)
    return args, kwargs
