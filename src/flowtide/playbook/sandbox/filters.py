"""Filters and tests under the limits: every Jinja2 filter is wrapped so that it is
charged to the budget and its result is checked, and the filters that can grow their
input (`center`, `indent`, `wordwrap`, `replace`, `batch`, `join`, `sum`, `format`, the
ones that turn a value into text, ...) are refused before they run when their output
would be over the limits. `tojson` is the sized JSON filter.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Collection
from typing import Any

from flowtide.playbook.sandbox.limits import WORK_PER_NODE, _Budget, current_budget
from flowtide.playbook.sandbox.operations import _join_size, _replace_size, printf_size
from flowtide.playbook.sandbox.sizes import (
    _check_chars,
    _is_int,
    _shallow,
    _too_many,
    made,
    measure,
)

# Filters that turn their input into text first: a list holding one big string many
# times becomes that many copies of it.
_STRINGIFYING = frozenset(
    {
        "capitalize", "center", "e", "escape", "forceescape", "format", "indent", "lower",
        "pprint", "replace", "safe", "string", "striptags", "title", "trim", "truncate",
        "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr",
    }
)  # fmt: skip


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else ""


# The parameters (after Jinja2's context/environment argument) of the filters whose output
# is checked before they run, by position.
_FILTER_PARAMS: dict[str, tuple[str, ...]] = {
    "center": ("value", "width"),
    "indent": ("value", "width", "first", "blank"),
    "wordwrap": ("value", "width", "break_long_words", "wrapstring", "break_on_hyphens"),
    "replace": ("value", "old", "new", "count"),
    "batch": ("value", "linecount", "fill_with"),
    "slice": ("value", "slices", "fill_with"),
    "join": ("value", "d", "attribute"),
    "sum": ("value", "attribute", "start"),
    "list": ("value",),
}


def _precheck_filter(name: str, args: list[Any], kwargs: dict[str, Any], budget: _Budget) -> None:
    """Refuse a filter call whose output would be over the limits. `args` are the
    filter's own arguments (the value first); a generator given to `join` or `sum` is
    replaced by a list, so it can be sized."""
    limits = budget.limits
    what = f"filter '{name}'"
    value = args[0] if args else None
    if name in _STRINGIFYING and not isinstance(value, str):
        _check_chars(what, measure(value, limits.max_chars, limits), limits)
    if name == "format":
        fmt_args: Any = kwargs or tuple(args[1:])
        _check_chars(what, printf_size(_text_of(value), fmt_args, limits), limits)
        return
    params = _FILTER_PARAMS.get(name)
    if params is None:
        return
    a = dict(zip(params, args, strict=False))
    a.update(kwargs)
    if name in ("join", "sum") and value is not None and not isinstance(value, Collection):
        items: list[Any] = []
        for item in value:
            items.append(item)
            if len(items) > limits.max_items:
                raise _too_many(what, len(items), limits)
        args[0] = value = items
    text = _text_of(value)
    if name == "center" and _is_int(a.get("width")):
        _check_chars(what, max(a["width"], len(text)), limits)
    elif name == "indent":
        width = a.get("width", 4)
        pad = width if _is_int(width) else len(width) if isinstance(width, str) else 0
        _check_chars(what, len(text) + (text.count("\n") + 1) * max(pad, 0), limits)
    elif name == "wordwrap":
        wrap = a.get("wrapstring") or "\n"
        _check_chars(what, len(text) + (len(text) + 1) * len(str(wrap)), limits)
    elif name == "replace":
        _check_chars(what, _replace_size(text, a.get("old"), a.get("new"), a.get("count")), limits)
    elif name == "batch" and a.get("fill_with") is not None and _is_int(a.get("linecount")):
        if a["linecount"] > limits.max_items:
            raise _too_many(what, a["linecount"], limits)
    elif name == "slice" and _is_int(a.get("slices")):
        if a["slices"] > limits.max_items:
            raise _too_many(what, a["slices"], limits)
    elif name == "list" and isinstance(value, Collection):
        if len(value) > limits.max_items:
            raise _too_many(what, len(value), limits)
    elif name == "join" and isinstance(value, Collection):
        _check_chars(what, _join_size(str(a.get("d") or ""), value, limits), limits)
    elif name == "sum" and isinstance(value, Collection):
        start = a.get("start")
        if isinstance(start, list | tuple | str):
            total = len(start) + sum(_shallow(item) for item in value)
            if total > limits.max_items:
                raise _too_many(what, total, limits)
            # Each addition copies what it has so far: quadratic.
            budget.charge(total * len(value) // 2)


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    # Jinja2 passes its context, eval context or environment first to some filters.
    offset = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    checked = name in _STRINGIFYING or name in _FILTER_PARAMS

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = current_budget()
        value = args[offset] if len(args) > offset else None
        budget.charge(WORK_PER_NODE + _shallow(value))
        if checked:
            own = list(args[offset:])
            _precheck_filter(name, own, kwargs, budget)
            args = (*args[:offset], *own)
        result = func(*args, **kwargs)
        budget.charge(made(result, f"filter '{name}'", budget.limits))
        return result

    return guarded


def _guard_test(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        current_budget().charge(WORK_PER_NODE + sum(_shallow(a) for a in args))
        return func(*args, **kwargs)

    return guarded


def tojson(value: Any, indent: int | str | None = None) -> str:
    """`tojson` / `to_json`, sized before it writes."""
    limits = current_budget().limits
    _check_chars("filter 'tojson'", measure(value, limits.max_chars, limits), limits)
    encoder = json.JSONEncoder(indent=indent, default=str, ensure_ascii=False)
    if indent is None:
        text = encoder.encode(value)
        _check_chars("filter 'tojson'", len(text), limits)
        return text
    # Indentation multiplies with depth: write it piece by piece and stop at the limit.
    parts: list[str] = []
    size = 0
    for chunk in encoder.iterencode(value):
        size += len(chunk)
        _check_chars("filter 'tojson'", size, limits)
        parts.append(chunk)
    return "".join(parts)
