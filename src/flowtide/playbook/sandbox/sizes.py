"""Sizes: how big a value is, or would be once written out, and the checks against the
limits that raise `LimitExceeded` with a message naming the operation.

`measure` sizes any value (strings, numbers, nested containers, shared and cyclic ones)
without costing more than the limit; `made` checks a value an operation has just made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jinja2.runtime import Undefined
from jinja2.utils import Namespace

from flowtide.playbook.sandbox.limits import TEMPLATE_LIMITS, LimitExceeded, TemplateLimits

_LOG2_10 = 3.3219280948873626


def _int_digits(value: int) -> int:
    return int(value.bit_length() / _LOG2_10) + 1


class _Over(Exception):  # noqa: N818 - internal early exit of `measure`
    pass


def measure(value: Any, limit: int, limits: TemplateLimits = TEMPLATE_LIMITS) -> int:
    """About how many characters `str(value)` (or its JSON) has; stops counting past
    `limit` (returns limit + 1) so a huge value costs no more than the limit to size.

    A list that holds the same big string a million times is a million times its size:
    that is what writing it out makes. Containers are sized once (by identity), so a
    value built by repeated doubling is sized in linear time.

    Raises:
        LimitExceeded: the value nests deeper than `limits.max_depth`.
    """
    if isinstance(value, str | bytes | bytearray):
        return min(len(value) + 2, limit + 1)
    if value is None or isinstance(value, bool | float):
        return 8
    if isinstance(value, int):
        return _int_digits(value)
    memo: dict[int, int] = {}
    total = 0

    def walk(v: Any, depth: int) -> int:
        nonlocal total
        if isinstance(v, str | bytes | bytearray):
            return len(v) + 2
        if v is None or isinstance(v, bool | float):
            return 8
        if isinstance(v, int):
            return _int_digits(v)
        if isinstance(v, Undefined):
            return 0
        if isinstance(v, Namespace):
            # `<Namespace {...}>`: its attributes are written out.
            v = getattr(v, "_Namespace__attrs", {})
        if not isinstance(v, Mapping | list | tuple | set | frozenset):
            return 64
        key = id(v)
        known = memo.get(key)
        if known is not None:
            return known if known >= 0 else 8  # < 0: a cycle, written as `[...]`
        if depth > limits.max_depth:
            raise LimitExceeded(f"the value nests deeper than {limits.max_depth} levels")
        memo[key] = -1
        size = 2
        if isinstance(v, Mapping):
            for k in v:
                size += walk(k, depth + 1) + walk(v[k], depth + 1) + 4
                if size > limit:
                    raise _Over
        else:
            for item in v:
                size += walk(item, depth + 1) + 2
                if size > limit:
                    raise _Over
        memo[key] = size
        return size

    try:
        total = walk(value, 0)
    except _Over:
        return limit + 1
    except RecursionError:
        raise LimitExceeded("the value nests too deeply to be written out") from None
    return min(total, limit + 1)


def _shallow(value: Any) -> int:
    if isinstance(value, str | bytes | bytearray | list | tuple | Mapping | set | frozenset):
        return len(value)
    return 1


def made(value: Any, what: str, limits: TemplateLimits) -> int:
    """Check the size of a value an operation has made; its size, for the budget."""
    if isinstance(value, str | bytes | bytearray):
        size = len(value)
        if size > limits.max_chars:
            raise _too_long(what, size, limits)
        return size
    if isinstance(value, list | tuple | Mapping | set | frozenset):
        size = len(value)
        if size > limits.max_items:
            raise _too_many(what, size, limits)
        return size
    if isinstance(value, int) and not isinstance(value, bool):
        _check_digits(what, _int_digits(value), limits)
    return 1


def _too_long(what: str, size: int, limits: TemplateLimits) -> LimitExceeded:
    return LimitExceeded(
        f"{what} would make a string of {size:,} characters "
        f"(a template may make at most {limits.max_chars:,})"
    )


def _too_many(what: str, size: int, limits: TemplateLimits) -> LimitExceeded:
    return LimitExceeded(
        f"{what} would make {size:,} items (a template may make at most {limits.max_items:,})"
    )


def _check_chars(what: str, size: int, limits: TemplateLimits) -> None:
    if size > limits.max_chars:
        raise _too_long(what, size, limits)


def _check_digits(what: str, digits: int, limits: TemplateLimits) -> None:
    if digits > limits.max_int_digits:
        raise LimitExceeded(
            f"{what} would make an integer of about {digits:,} digits "
            f"(a template may make at most {limits.max_int_digits:,})"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
