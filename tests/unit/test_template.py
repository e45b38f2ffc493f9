"""Templating (flowtide.playbook.template): native values, strict undefined, sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from flowtide.engine.state import ExecutionState
from flowtide.errors import TemplateError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.template import (
    NotRun,
    check_syntax,
    is_template,
    render,
    render_string,
    truthy,
)

CONTEXT: dict[str, Any] = {
    "n": 3,
    "price": 2.5,
    "text_number": "42",
    "name": "Bob",
    "items": [1, 2, 3],
    "rows": [{"id": 1, "tag": "a"}, {"id": 2, "tag": "b"}],
    "config": {"mode": "fast", "depth": 2},
    "flag": True,
    "nothing": None,
    "pending": NotRun(name="pending"),
}


# -- native values -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ n }}", 3),
        ("{{ n + 1 }}", 4),
        ("{{ price * 2 }}", 5.0),
        ("{{ items }}", [1, 2, 3]),
        ("  {{ items }}  ", [1, 2, 3]),
        ("{{ config }}", {"mode": "fast", "depth": 2}),
        ("{{ flag }}", True),
        ("{{ not flag }}", False),
        ("{{ nothing }}", None),
        ("{{ rows[1].tag }}", "b"),
        ("{{ [n, n * 2] }}", [3, 6]),
        ("{{ {'a': n} }}", {"a": 3}),
        ("{{ (items or []) + [4] }}", [1, 2, 3, 4]),
        ("{{ config.depth if flag else 0 }}", 2),
        ("{{ 'x' in ['x', 'y'] }}", True),
        ("{{ name not in ['Ann'] }}", True),
    ],
)
def test_single_expression_renders_native_value(source: str, expected: Any) -> None:
    value = render(source, CONTEXT)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("n={{ n }}", "n=3"),
        ("{{ n }}{{ n }}", "33"),
        ("{{ name }}, {{ config.mode }}", "Bob, fast"),
        ("{{ n }} items", "3 items"),
        ("id-{{ rows[0].id }}", "id-1"),
        ("plain text", "plain text"),
    ],
)
def test_mixed_strings_stay_strings(source: str, expected: str) -> None:
    assert render(source, CONTEXT) == expected


def test_render_walks_dicts_and_lists() -> None:
    value = {
        "a": "{{ n }}",
        "b": ["{{ items }}", "x{{ n }}", 7],
        "c": {"d": "{{ flag }}"},
        "e": None,
    }
    assert render(value, CONTEXT) == {
        "a": 3,
        "b": [[1, 2, 3], "x3", 7],
        "c": {"d": True},
        "e": None,
    }


def test_non_templates_pass_through_unchanged() -> None:
    marker = object()
    assert render(marker, CONTEXT) is marker
    assert render_string("no markup", {}) == "no markup"
    assert not is_template("plain") and not is_template(3)
    assert is_template("{{ x }}") and is_template("{% if x %}{% endif %}")


# -- strict undefined --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "missing"),
    [
        ("{{ absent }}", "absent"),
        ("{{ absent + 1 }}", "absent"),
        ("value={{ absent }}", "absent"),
        ("{{ config.colour }}", "colour"),
        ("{{ config.colour.name }}", "colour"),
        ("{{ rows[0].missing_field }}", "missing_field"),
    ],
)
def test_strict_undefined_raises_with_the_missing_name(source: str, missing: str) -> None:
    with pytest.raises(TemplateError) as info:
        render(source, CONTEXT, step="load", field="input.x")
    err = info.value
    assert err.missing == missing
    assert err.expression == source
    assert (err.step, err.field) == ("load", "input.x")
    assert "load" in str(err) and missing in str(err)


def test_a_missing_key_of_a_step_result_names_no_class_of_ours() -> None:
    # Step results reach templates wrapped (flowtide.engine.context); the message says
    # what the reader wrote, a dict or a list, not the wrapper's module path.
    from flowtide.engine.context import ResultDict, ResultList

    context = {"start": ResultDict({"total": 3}), "rows": ResultList([1])}
    with pytest.raises(TemplateError) as info:
        render("{{ start.totl > 1 }}", context, step="start", field="next.arcs.when")
    assert "'dict object' has no attribute 'totl'" in str(info.value), str(info.value)
    assert "flowtide." not in str(info.value) and info.value.missing == "totl"
    with pytest.raises(TemplateError) as info:
        render("{{ rows.size + 1 }}", context)
    assert "'list object' has no attribute 'size'" in str(info.value), str(info.value)


def test_defined_tests_do_not_raise() -> None:
    assert render("{{ absent is defined }}", CONTEXT) is False
    assert render("{{ absent is not defined }}", CONTEXT) is True
    assert render("{{ nothing is none }}", CONTEXT) is True
    assert render("{{ config.colour is defined }}", CONTEXT) is False


def test_render_in_a_nested_value_names_the_field() -> None:
    with pytest.raises(TemplateError) as info:
        render({"outer": {"inner": "{{ absent }}"}}, CONTEXT, step="s", field="input")
    assert info.value.field == "input.outer.inner"


# -- NotRun ------------------------------------------------------------------------------


def test_not_run_is_falsy() -> None:
    assert not NotRun(name="x")
    assert render("{{ 'a' if pending else 'b' }}", CONTEXT) == "b"
    assert render("{{ pending or 'fallback' }}", CONTEXT) == "fallback"
    assert render("{{ not pending }}", CONTEXT) is True


def test_not_run_is_default_able() -> None:
    assert render("{{ pending | default({}) }}", CONTEXT) == {}
    assert render("{{ pending | default({'a': 1}) }}", CONTEXT) == {"a": 1}
    assert render("{{ pending is defined }}", CONTEXT) is False


def test_not_run_attribute_access_is_an_error() -> None:
    with pytest.raises(TemplateError):
        render("{{ pending.x }}", CONTEXT)


def _context_of(playbook_text: str) -> dict[str, Any]:
    state = ExecutionState(parse_playbook(playbook_text), 1)
    return state.context()


def test_steps_that_have_not_run_are_falsy_in_the_execution_context() -> None:
    # comprehensive_test.yaml: `{{ process_high.category if process_high else process_low.category }}`
    context = _context_of("workflow:\n  - step: start\n  - step: later\n")
    assert render("{{ 'ran' if later else 'not yet' }}", context) == "not yet"
    assert render("{{ later | default({}) }}", context) == {}


def test_not_run_step_error_names_the_step_in_missing() -> None:
    context = _context_of("workflow:\n  - step: start\n  - step: later\n")
    with pytest.raises(TemplateError) as info:
        render("{{ later.category }}", context, step="start")
    assert info.value.missing == "later"


# -- filters and blocks used by the fixtures ---------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ config | tojson }}", '{"mode": "fast", "depth": 2}'),
        ("{{ rows | tojson }}", '[{"id": 1, "tag": "a"}, {"id": 2, "tag": "b"}]'),
        ("{{ {'name': 'Zoë'} | tojson }}", '{"name": "Zoë"}'),
        ("{{ text_number | int }}", 42),
        ("{{ (text_number | int) + 1 }}", 43),
        ("{{ 'x' | int }}", 0),
        ("{{ n | string }}", "3"),
        ("{{ flag | string | lower }}", "true"),
        ("{{ flag | string | lower == 'true' }}", True),
        ("{{ name | lower }}", "bob"),
        ("{{ items | length }}", 3),
        ("{{ config | length }}", 2),
        ("{{ absent | default(5) }}", 5),
        ("{{ absent | default('x') }}", "x"),
        (
            "{{ absent | default({'name': 'TestUser', 'age': 30}) }}",
            {"name": "TestUser", "age": 30},
        ),
        ("{{ config | default({'mode': 'slow'}) }}", {"mode": "fast", "depth": 2}),
        ("{{ (absent | default(1) | int) or 1 }}", 1),
        ("{{ name | replace('o', '0') }}", "B0b"),
        ("{{ 'a-b-c' | replace('-', '_') }}", "a_b_c"),
    ],
)
def test_filters_used_by_fixtures(source: str, expected: Any) -> None:
    assert render(source, CONTEXT) == expected


def test_tojson_in_sql_keeps_a_string() -> None:
    sql = "INSERT INTO t VALUES ($json${{ config | tojson }}$json$)"
    assert render(sql, CONTEXT) == 'INSERT INTO t VALUES ($json${"mode": "fast", "depth": 2}$json$)'


def test_for_block() -> None:
    source = (
        "{% for row in rows %}INSERT INTO t VALUES ({{ row.id }}, '{{ row.tag }}');\n{% endfor %}"
    )
    assert (
        render(source, CONTEXT)
        == "INSERT INTO t VALUES (1, 'a');\nINSERT INTO t VALUES (2, 'b');\n"
    )


@pytest.mark.parametrize(("mode", "expected"), [("fast", "SELECT 1"), ("slow", "SELECT 2")])
def test_if_block_selects_the_whole_text(mode: str, expected: str) -> None:
    source = "{% if config.mode == 'fast' %}SELECT 1{% else %}SELECT 2{% endif %}"
    assert render(source, {**CONTEXT, "config": {"mode": mode}}) == expected


def test_if_block_inside_a_url() -> None:
    source = "http://api/history?symbol=X{% if start_time %}&start={{ start_time }}{% endif %}"
    assert render(source, {"start_time": None}) == "http://api/history?symbol=X"
    assert render(source, {"start_time": "t0"}) == "http://api/history?symbol=X&start=t0"


def test_block_templates_are_strings_even_when_the_output_looks_native() -> None:
    assert render("{% if true %}42{% endif %}", {}) == "42"


# -- syntax and errors inside expressions ------------------------------------------------


@pytest.mark.parametrize("source", ["{{ n + }}", "{{ n ", "{% if n %}no end", "{{ n ) }}"])
def test_syntax_errors(source: str) -> None:
    assert check_syntax(source) is not None
    with pytest.raises(TemplateError) as info:
        render(source, CONTEXT)
    assert info.value.expression == source


@pytest.mark.parametrize(
    "source", ["{{ n + 1 }}", "{% for x in items %}{{ x }}{% endfor %}", "a {{ b }} c"]
)
def test_check_syntax_accepts_valid_templates(source: str) -> None:
    assert check_syntax(source) is None


def test_a_syntax_error_names_the_template_as_written() -> None:
    with pytest.raises(TemplateError) as info:
        render("{{ start.x > }}", CONTEXT, step="start", field="next.arcs.when")
    err = info.value
    assert err.message == "syntax error: unexpected '}}'"
    assert str(err) == (
        "step 'start': field 'next.arcs.when': cannot render '{{ start.x > }}': "
        "syntax error: unexpected '}}'"
    )
    problem = check_syntax("SELECT 1\nFROM t\nWHERE a = {{ x | }}")
    assert problem is not None and problem.line == 3
    assert str(problem) == "expected token 'name', got '}}' in 'WHERE a = {{ x | }}'"


def test_errors_raised_inside_an_expression_become_template_errors() -> None:
    with pytest.raises(TemplateError, match="ZeroDivisionError"):
        render("{{ n / 0 }}", CONTEXT)


# -- sandbox -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ ().__class__.__base__.__subclasses__() }}",
        "{{ items.__class__ }}",
        "{{ config.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ now.__globals__ }}",
        "{{ render.__globals__ }}",
        "x{{ ''.__class__.__mro__ }}",
        "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{{ c }}{% endfor %}",
    ],
)
def test_sandbox_blocks_escapes(source: str) -> None:
    with pytest.raises(TemplateError):
        render(source, {**CONTEXT, "render": render})


# -- truthy (`when` semantics) -----------------------------------------------------------


@pytest.mark.parametrize("value", [True, 1, [0], {"a": 1}, "true", "True", "yes", "x", " 1 "])
def test_truthy(value: Any) -> None:
    assert truthy(value)


@pytest.mark.parametrize(
    "value",
    [False, 0, None, [], {}, "", "false", "False", " FALSE ", "0", "none", "null", "no", "off"],
)
def test_falsy(value: Any) -> None:
    assert not truthy(value)
