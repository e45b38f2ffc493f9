"""The sandbox templates run in: Jinja2's immutable sandbox plus size and work limits.

Jinja2's sandbox keeps templates away from Python internals, but not from building huge
values (`'a' * 10**9`, `[1] * 10**9`, a string doubled in a loop, `'x' | center(10**9)`)
or looping for hours, and the server renders arcs, `set` and policies of any playbook it
is given. So here:

- every operation that can make a value larger than its inputs (`*`, `+`, `%`, `**`, `~`,
  string methods, filters such as `join`, `replace`, `center`, `indent`, `format`,
  `batch`, str.format) works out the size of what it would make and refuses *before*
  making it when that is over `TEMPLATE_LIMITS`;
- every other call and filter has its result checked afterwards (those make at most a
  small multiple of their input, which is itself within the limits);
- each render has a work budget, charged per loop iteration and macro call (by the size
  of the body that runs) and per character or item an operation touches, so nested
  loops, recursion and repeated big operations stop with an error instead of a hang.
  The budget counts operations, not seconds: the same template over the same values
  always passes or always fails, which the engine needs (its decisions are replayed).

A limit that trips raises `LimitExceeded`; `flowtide.playbook.template` turns it into a
`TemplateError` naming the step, the field and the template.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.filters import FILTERS
from jinja2.runtime import Macro, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.tests import TESTS
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer


@dataclass(frozen=True)
class TemplateLimits:
    """What one render may make and do.

    Attributes:
        max_chars: longest string an operation may make, and longest rendered text.
        max_items: most items in a list, tuple, dict or set an operation may make.
        max_int_digits: most decimal digits of an integer (Python's own limit for
            turning an int into text: a larger one could not be written to an event).
        max_depth: deepest nesting of a value that is turned into text or returned.
        max_written: characters one render may output in all, text captured by
            `{% set %}` blocks and macros included.
        max_work: work budget of one render (see `WORK_PER_NODE`).
    """

    max_chars: int = 10_000_000
    max_items: int = 1_000_000
    max_int_digits: int = 4_300
    max_depth: int = 200
    max_written: int = 50_000_000
    max_work: int = 1_000_000_000


TEMPLATE_LIMITS = TemplateLimits()

#: Work charged for one template node that runs again (per loop iteration, per macro
#: call) and per call or filter: about what evaluating a node costs next to copying one
#: character or one list item, which cost 1 (roughly a nanosecond each).
WORK_PER_NODE = 500
#: Work charged per loop item on top of its body: what an iteration costs by itself.
WORK_PER_ITEM = 2_000
#: Work charged per macro call on top of its body.
WORK_PER_MACRO = 10_000

_LOG2_10 = 3.3219280948873626


class LimitExceeded(Exception):  # noqa: N818 - a signal, turned into TemplateError
    """A template went over one of `TEMPLATE_LIMITS`.

    Not a TypeError/ValueError/LookupError on purpose: Jinja2 and its filters catch
    those in places (`int`, `getitem`) and would swallow the limit.
    """

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class _Budget:
    """Work and output left to one render (see the module docstring). Hot paths update
    the counters in place and call `check()` once one goes below zero."""

    __slots__ = ("limits", "work_left", "write_left")

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        self.work_left = limits.max_work
        self.write_left = limits.max_written

    def charge(self, units: int) -> None:
        self.work_left -= units
        if self.work_left < 0:
            self.check()

    def write(self, chars: int) -> None:
        self.write_left -= chars
        if self.write_left < 0:
            self.check()

    def check(self) -> None:
        if self.work_left < 0:
            raise LimitExceeded(
                f"the template does more work than a render may "
                f"(budget {self.limits.max_work:,} units: a loop over too many items, "
                "nested loops or a recursion that does not end?)"
            )
        if self.write_left < 0:
            raise LimitExceeded(
                f"the template writes more than {self.limits.max_written:,} characters "
                "in all (text captured by set blocks and macros included)"
            )


_budget: ContextVar[_Budget | None] = ContextVar("flowtide_template_budget", default=None)


def current_budget() -> _Budget:
    """The budget of the render in progress; a fresh one outside any (a filter or
    template called directly, not through `flowtide.playbook.template.render`)."""
    return _budget.get() or _Budget(TEMPLATE_LIMITS)


class render_budget:  # noqa: N801 - used as a function: `with render_budget():`
    """Share one budget between every render inside the block (a nested block joins the
    enclosing one): a step's `set` and arcs are many renders over the same values.

    A class rather than a generator context manager: it wraps every render, and this
    costs a fraction of what contextlib's machinery does.
    """

    __slots__ = ("_limits", "_token")

    def __init__(self, limits: TemplateLimits = TEMPLATE_LIMITS) -> None:
        self._limits = limits
        self._token: Any = None

    def __enter__(self) -> _Budget:
        active = _budget.get()
        if active is not None:
            return active
        budget = _Budget(self._limits)
        self._token = _budget.set(budget)
        return budget

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _budget.reset(self._token)
            self._token = None


# -- sizes ------------------------------------------------------------------------------


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


# -- filters ----------------------------------------------------------------------------

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


# -- instrumentation of compiled templates -----------------------------------------------

_LOOP = "flowtide:loop"
_ENTER = "flowtide:enter"
_CONCAT = "flowtide:concat"
_WEIGH = "flowtide:weigh"


class _Metered:
    """A loop's iterable, charging each item the work (and literal text) of one pass of
    the loop body. Its length passes through, for `loop.length`."""

    __slots__ = ("_items", "_work", "_written")

    def __init__(self, items: Any, work: int, written: int) -> None:
        self._items = items
        self._work = work
        self._written = written

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        budget = current_budget()
        work, written = self._work, self._written
        for item in self._items:
            budget.work_left -= work
            budget.write_left -= written
            if budget.work_left < 0 or budget.write_left < 0:
                budget.check()
            yield item


@pass_context
def _loop(context: Any, items: Any, work: int, written: int) -> _Metered:
    return _Metered(items, max(int(work), 1), max(int(written), 0))


@pass_context
def _enter(context: Any, work: int, written: int) -> str:
    budget = current_budget()
    budget.charge(max(int(work), 0))
    budget.write(max(int(written), 0))
    return ""


@pass_context
def _concat(context: Any, parts: list[Any]) -> str:
    budget = current_budget()
    limits = budget.limits
    size = 0
    for part in parts:
        size += measure(part, limits.max_chars, limits)
        _check_chars("'~'", size, limits)
    text = "".join([str(part) for part in parts])
    budget.charge(len(text))
    return text


@pass_context
def _weigh(context: Any, value: Any) -> Any:
    # Comparing or searching a string or list costs its length (`'x' in big`); a dict or
    # set lookup does not.
    if isinstance(value, str | bytes | list | tuple):
        current_budget().charge(len(value))
    return value


_INTERNAL_FILTERS: dict[str, Callable[..., Any]] = {
    _LOOP: _loop,
    _ENTER: _enter,
    _CONCAT: _concat,
    _WEIGH: _weigh,
}


def _body_cost(body: list[nodes.Node]) -> tuple[int, int]:
    """(work, literal characters) of running `body` once."""
    count = 0
    written = 0
    for top in body:
        count += 1
        for node in top.find_all(nodes.Node):
            count += 1
            if isinstance(node, nodes.TemplateData):
                written += len(node.data)
    return count * WORK_PER_NODE, written


def _filter(node: nodes.Expr, name: str, *args: nodes.Expr, lineno: int) -> nodes.Filter:
    return nodes.Filter(node, name, list(args), [], None, None, lineno=lineno)


class _Instrument(NodeTransformer):
    """Rewrite a parsed template so that repeated work and string concatenation go
    through the budget (see the module docstring)."""

    def _charged(self, body: list[nodes.Node], lineno: int) -> list[nodes.Node]:
        work, written = _body_cost(body)
        charge = nodes.ExprStmt(
            _filter(nodes.Const(work), _ENTER, nodes.Const(written), lineno=lineno),
            lineno=lineno,
        )
        return [charge, *body]

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        parts: list[nodes.Node] = [node.test] if node.test is not None else []
        if not node.recursive:
            # Charged per item, the body's cost included (also for an item the loop's
            # `if` skips: a bound, not a count).
            parts += node.body
        work, written = _body_cost(parts)
        iterable = node.iter
        assert isinstance(iterable, nodes.Expr)
        node.iter = _filter(
            iterable,
            _LOOP,
            nodes.Const(WORK_PER_ITEM + work),
            nodes.Const(written),
            lineno=node.lineno,
        )
        if node.recursive:
            # `loop(children)` runs the body again on items this iterable never sees.
            node.body = self._charged(node.body, node.lineno)
        return node

    def visit_Macro(self, node: nodes.Macro) -> nodes.Node:
        self.generic_visit(node)
        node.body = self._charged(node.body, node.lineno)
        return node

    def visit_CallBlock(self, node: nodes.CallBlock) -> nodes.Node:
        self.generic_visit(node)
        node.body = self._charged(node.body, node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _filter(nodes.List(node.nodes, lineno=node.lineno), _CONCAT, lineno=node.lineno)

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        self.generic_visit(node)
        # A literal operand is as long as the template that holds it: nothing to weigh.
        if not isinstance(node.expr, nodes.Const):
            node.expr = _filter(node.expr, _WEIGH, lineno=node.lineno)
        for operand in node.ops:
            if not isinstance(operand.expr, nodes.Const):
                operand.expr = _filter(operand.expr, _WEIGH, lineno=operand.lineno)
        return node


# -- the environment --------------------------------------------------------------------


class TemplateEnv(dict[str, str]):
    """The `env` mapping templates see: the environment variables a runtime chose to show
    (see `flowtide.playbook.template.visible_env`). A name it does not hold renders as
    undefined with `explain(name)` as the message, so `env.X | default(...)` still works.
    """

    __slots__ = ("_why",)

    def __init__(self, values: Mapping[str, str] | None = None, why: str = "") -> None:
        super().__init__(values or {})
        self._why = why

    def explain(self, name: str) -> str:
        reason = self._why or "no environment variables are visible to templates here"
        return f"'env' has no attribute '{name}': {reason}"


class SizedSandbox(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox with the limits of this module.

    `a.b` on a mapping prefers the key `b` over an attribute of the same name, so
    `{{ start.items }}` is the step's `items` field, not `dict.items`.
    """

    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self, **options: Any) -> None:
        # No constant folding: Jinja2's optimizer evaluates constant parts of a template
        # while compiling it, outside any render's budget (`'x' | center(9999999)` a
        # hundred times over is a gigabyte before the first render), and some of its
        # folds raise errors of their own. Everything is evaluated when rendering.
        options.setdefault("optimized", False)
        super().__init__(finalize=self._finalize, **options)
        # lipsum(n) writes n paragraphs: nothing a playbook needs, everything a denial of
        # service does.
        self.globals.pop("lipsum", None)
        self.filters = {name: _guard_filter(name, f) for name, f in FILTERS.items()}
        self.tests = {name: _guard_test(name, f) for name, f in TESTS.items()}  # type: ignore[arg-type]
        self.filters.update(_INTERNAL_FILTERS)

    def add_filter(self, name: str, func: Callable[..., Any], *, guarded: bool = True) -> None:
        """Register a filter; `guarded=False` for one that does its own size checks."""
        self.filters[name] = _guard_filter(name, func) if guarded else func

    def instrument(self, tree: nodes.Template) -> nodes.Template:
        """The parsed template rewritten to run under the limits."""
        out = _Instrument().visit(tree)
        assert isinstance(out, nodes.Template)
        out.set_environment(self)
        return out

    @staticmethod
    def _finalize(value: Any) -> Any:
        # Every `{{ ... }}` of a text template passes here before str(): size it first.
        budget = _budget.get() or _Budget(TEMPLATE_LIMITS)
        if isinstance(value, str):
            size = len(value)
        elif value is None or isinstance(value, int | float):
            size = 8  # ints past the digit limit cannot be written: str() refuses them
        else:
            size = measure(value, budget.limits.max_chars, budget.limits)
        if size > budget.limits.max_chars:
            raise _too_long("the output", size, budget.limits)
        budget.write_left -= size
        if budget.write_left < 0:
            budget.check()
        return value

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = current_budget()
        _check_binop(operator, left, right, budget.limits)
        result = super().call_binop(context, operator, left, right)
        budget.charge(made(result, f"'{operator}'", budget.limits))
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        value = super().getattr(obj, attribute)
        if isinstance(obj, TemplateEnv) and isinstance(value, Undefined):
            return self.undefined(hint=obj.explain(attribute), obj=obj, name=attribute)
        return value

    def getitem(self, obj: Any, argument: Any) -> Any:
        result = super().getitem(obj, argument)
        if isinstance(argument, slice):
            budget = current_budget()
            budget.charge(made(result, "a slice", budget.limits))
        elif isinstance(obj, TemplateEnv) and isinstance(result, Undefined):
            return self.undefined(hint=obj.explain(str(argument)), obj=obj, name=str(argument))
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        owner: str = value.__self__
        is_map = value.__name__ == "format_map"

        def sized_format(*args: Any, **kwargs: Any) -> str:
            budget = current_budget()
            formatter = _SizedFormatter(self, budget.limits)
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                kwargs, args = args[0], ()
            text = type(owner)(formatter.vformat(owner, args, kwargs))
            budget.charge(len(text))
            return text

        return functools.update_wrapper(sized_format, value)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = current_budget()
        limits = budget.limits
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str | bytes):
            args, kwargs = _check_str_method(owner, name, args, kwargs, limits)
        elif _is_int(owner) and name == "to_bytes":
            length = args[0] if args else kwargs.get("length", 1)
            if _is_int(length):
                _check_chars("int.to_bytes()", length, limits)
        # A macro call costs its frame and context on top of its body (charged as it runs).
        work = WORK_PER_MACRO if isinstance(__obj, Macro) else WORK_PER_NODE
        budget.charge(work + (_shallow(owner) if owner is not None else 0))
        result = super().call(__context, __obj, *args, **kwargs)
        what = f"{type(owner).__name__}.{name}()" if owner is not None else f"{name or 'a call'}()"
        budget.charge(made(result, what, limits))
        return result


__all__ = [
    "TEMPLATE_LIMITS",
    "TemplateEnv",
    "WORK_PER_ITEM",
    "WORK_PER_NODE",
    "LimitExceeded",
    "SizedSandbox",
    "TemplateLimits",
    "current_budget",
    "measure",
    "render_budget",
    "tojson",
]
