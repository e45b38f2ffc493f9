"""A plain reference (`{{ iter.x }}`, `{{ a['b'][0].c }}`) is read without Jinja
(`flowtide.playbook.template._read_path`): it must render exactly what Jinja renders, and
fail where Jinja fails, with Jinja's error."""

from __future__ import annotations

from collections import ChainMap
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowtide.engine.context import ResultDict, ResultList
from flowtide.errors import TemplateError
from flowtide.playbook import template
from flowtide.playbook.sandbox import render_budget
from flowtide.playbook.template import NotRun, render_string, visible_env

#: Stands for a step that has not run (a `NotRun`, which hypothesis cannot print).
_NOT_RUN = "<not run>"
KEYS = ["a", "b", "items", "keys", "data", "results", "0", "x y", "__class__", "upper"]

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.just(_NOT_RUN),
)


def _views(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    dicts = st.dictionaries(st.sampled_from(KEYS), children, max_size=4)
    lists = st.lists(children, max_size=3)
    return st.one_of(
        dicts,
        lists,
        dicts.map(ResultDict),
        lists.map(ResultList),
        st.tuples(dicts, dicts).map(lambda ab: ResultDict(ab[0], ab[1])),
    )


values = st.recursive(leaves, _views, max_leaves=12)
contexts = st.dictionaries(st.sampled_from(["iter", "a", "now", "env", "x"]), values, max_size=4)
segment = st.one_of(
    st.sampled_from(KEYS).filter(str.isidentifier).map(lambda k: f".{k}"),
    st.sampled_from(KEYS).map(lambda k: f"[{k!r}]"),
    st.integers(0, 3).map(lambda i: f"[{i}]"),
)
paths = st.tuples(
    st.sampled_from(["iter", "a", "now", "env", "x", "missing"]),
    st.lists(segment, max_size=4),
).map(lambda t: t[0] + "".join(t[1]))


def _not_run(value: Any) -> Any:
    """`value` with every `_NOT_RUN` a `NotRun` (views kept)."""
    if value == _NOT_RUN:
        return NotRun(name="later")
    if isinstance(value, ResultDict):
        return ResultDict({k: _not_run(v) for k, v in value.items()}, value._tasks)
    if isinstance(value, dict):
        return {k: _not_run(v) for k, v in value.items()}
    if isinstance(value, ResultList):
        return ResultList(_not_run(v) for v in value)
    if isinstance(value, list):
        return [_not_run(v) for v in value]
    return value


def _by_jinja(source: str, context: Any) -> Any:
    """What the render gives without the fast path (or the error it raises)."""
    compiled = template._compile(source)
    try:
        with render_budget():
            return ("value", template._run(compiled, context))
    except Exception as exc:  # noqa: BLE001 - compared below
        return ("error", type(exc).__name__, str(exc))


def _rendered(source: str, context: Any) -> Any:
    compiled = template._compile(source)
    if compiled.path is None:  # `[-1]` is an expression: Jinja renders it
        return None
    got = template._read_path(compiled.path, context)
    if got is template._MISSING:
        return None
    return ("value", got)


@settings(max_examples=600, deadline=None)
@given(contexts, paths, st.booleans())
def test_a_plain_reference_reads_what_jinja_renders(
    context: dict[str, Any], path: str, chained: bool
) -> None:
    context = _not_run(context)
    scope: Any = ChainMap({"env": visible_env({"HOME": "/h"}, embedded=True)}, context)
    scope = scope if chained else context
    source = "{{ " + path + " }}"
    fast = _rendered(source, scope)
    if fast is None:
        return  # Jinja renders it (or fails): nothing to compare
    slow = _by_jinja(source, scope)
    assert slow[0] == "value", (source, slow)
    assert fast[1] is slow[1] or fast[1] == slow[1], (source, fast, slow)
    assert type(fast[1]) is type(slow[1])


def test_what_the_fast_path_cannot_tell_jinja_says() -> None:
    context = {"iter": {"x": 1}, "later": NotRun(name="later"), "s": "abc"}
    assert render_string("{{ iter.x }}", context) == 1
    assert render_string("{{ iter['x'] }}", context) == 1
    assert render_string("{{ s.upper() }}", context) == "ABC"
    assert render_string("{{ s[1] }}", context) == "b"
    assert callable(render_string("{{ now }}", context))
    with pytest.raises(TemplateError, match="has no attribute 'y'"):
        render_string("{{ iter.y }}", context)
    with pytest.raises(TemplateError, match="'nope' is undefined"):
        render_string("{{ nope.x }}", context)
    with pytest.raises(TemplateError, match="later"):
        render_string("{{ later }}", context)
    # ResultDict's `data` (NoETL) and a list's `.data`: views Jinja reads.
    assert render_string("{{ r.data.k }}", {"r": ResultDict({"k": 2})}) == 2
    assert render_string("{{ l.data }}", {"l": ResultList([1])}) == [1]


def test_a_string_over_the_limit_still_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = template.TEMPLATE_LIMITS
    big = "x" * (limits.max_chars + 1)
    with pytest.raises(TemplateError, match="characters"):
        render_string("{{ big }}", {"big": big})
