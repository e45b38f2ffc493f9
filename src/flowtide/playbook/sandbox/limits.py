"""The limits of one render and the budget that enforces them.

`TemplateLimits` says what a render may make and do (`TEMPLATE_LIMITS` is the default)
and what repeated work costs (`WORK_PER_*`); `LimitExceeded` is raised when one trips.
A `_Budget` holds the work and output a render has left, shared by every render inside
a `render_budget()` block and found by the sandbox's checks through `current_budget()`.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


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


class LimitExceeded(Exception):  # noqa: N818 - a signal, turned into TemplateError
    """A template went over one of `TEMPLATE_LIMITS`.

    Not a TypeError/ValueError/LookupError on purpose: Jinja2 and its filters catch
    those in places (`int`, `getitem`) and would swallow the limit.
    """

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class _Budget:
    """Work and output left to one render (see `flowtide.playbook.sandbox`). Hot paths update
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
