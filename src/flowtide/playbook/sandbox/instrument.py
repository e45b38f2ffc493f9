"""Instrumentation of compiled templates: a parsed template is rewritten so that loops,
macros and call blocks charge the budget for each pass of their body, `~` sizes what it
joins, and comparisons charge the length of what they compare (`_Instrument`), through
the internal filters it inserts (`_INTERNAL_FILTERS`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.visitor import NodeTransformer

from flowtide.playbook.sandbox.limits import WORK_PER_ITEM, WORK_PER_NODE, current_budget
from flowtide.playbook.sandbox.sizes import _check_chars, measure

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
    through the budget (see `flowtide.playbook.sandbox`)."""

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
