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

The parts: `limits` (the limits and a render's budget), `sizes` (how big a value is),
`operations` (operators, formatting and string methods), `filters`, and `instrument`
(the rewrite of compiled templates); the environment that puts them together is here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from jinja2 import nodes
from jinja2.filters import FILTERS
from jinja2.runtime import Macro, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.tests import TESTS

from flowtide.playbook.sandbox.filters import _guard_filter, _guard_test, tojson
from flowtide.playbook.sandbox.instrument import _INTERNAL_FILTERS, _Instrument
from flowtide.playbook.sandbox.limits import (
    TEMPLATE_LIMITS,
    WORK_PER_ITEM,
    WORK_PER_MACRO,
    WORK_PER_NODE,
    LimitExceeded,
    TemplateLimits,
    _Budget,
    _budget,
    current_budget,
    render_budget,
)
from flowtide.playbook.sandbox.operations import (
    _check_binop,
    _check_str_method,
    _SizedFormatter,
)
from flowtide.playbook.sandbox.sizes import (
    _check_chars,
    _is_int,
    _shallow,
    _too_long,
    made,
    measure,
)


class Explains:
    """A mapping whose missing keys render as undefined with `explain(name)` as the
    message (None: Jinja's own), so `x.name | default(...)` still works."""

    __slots__ = ()

    def explain(self, name: str) -> str | None:
        return None


class TemplateEnv(Explains, dict[str, str]):
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
    """Jinja2's immutable sandbox with the limits of this package.

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
        if isinstance(obj, Explains) and isinstance(value, Undefined):
            return self.undefined(hint=obj.explain(attribute), obj=obj, name=attribute)
        return value

    def getitem(self, obj: Any, argument: Any) -> Any:
        result = super().getitem(obj, argument)
        if isinstance(argument, slice):
            budget = current_budget()
            budget.charge(made(result, "a slice", budget.limits))
        elif isinstance(obj, Explains) and isinstance(result, Undefined):
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
