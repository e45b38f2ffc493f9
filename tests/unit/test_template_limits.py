"""Templates cannot exhaust the process that renders them: sizes are checked before values
are made, and each render has a work budget (flowtide.playbook.sandbox)."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest

from flowtide.errors import TemplateError
from flowtide.playbook.sandbox import TEMPLATE_LIMITS
from flowtide.playbook.template import render, render_budget

BIG = "x" * 4_000_000
CONTEXT: dict[str, Any] = {
    "big": BIG,
    "rows": [{"id": i, "name": f"n{i}"} for i in range(50_000)],
    "start": {"x": 1},
}


def refused(source: str, context: dict[str, Any] | None = None) -> TemplateError:
    """Render `source`; it must fail fast, naming step, field and the template."""
    started = time.monotonic()
    with pytest.raises(TemplateError) as info:
        render(source, context or CONTEXT, step="load", field="set.ctx.x")
    assert time.monotonic() - started < 5.0
    err = info.value
    assert (err.step, err.field, err.expression) == ("load", "set.ctx.x", source)
    assert "step 'load': field 'set.ctx.x': cannot render" in str(err)
    return err


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ ('a' * 200000000) | length }}", "'*' would make a string of 200,000,000 characters"),
        ("{{ [1] * 10**9 }}", "'*' would make 1,000,000,000 items"),
        ("{{ 10**9 * [1] }}", "'*' would make 1,000,000,000 items"),
        ("{{ 'x' ~ big ~ big ~ big }}", "'~' would make a string of 12,000,0"),
        ("{{ big + big + big }}", "'+' would make a string of 12,000,000 characters"),
        ("{{ (rows * 10) + (rows * 10) + rows }}", "'+' would make 1,050,000 items"),
        ("{{ ([big] * 3) | join }}", "filter 'join' would make a string"),
        ("{{ ([big] * 3) | join(',') }}", "filter 'join' would make a string"),
        ("{{ big | replace('x', 'yyy') }}", "filter 'replace' would make a string of 12,000,000"),
        ("{{ big.replace('x', 'yyy') }}", "str.replace() would make a string of 12,000,000"),
        ("{{ 'a' | center(1000000000) }}", "filter 'center' would make a string of 1,000,000,000"),
        ("{{ 'a'.ljust(10**9) }}", "str.ljust() would make a string of 1,000,000,000"),
        ("{{ 'a'.zfill(10**9) }}", "str.zfill() would make a string of 1,000,000,000"),
        ("{{ ('\\n' * 100000) | indent(1000) }}", "filter 'indent' would make a string"),
        ("{{ '%0999999999d' % 1 }}", "'%' would make a string of 1,000,000,012"),
        ("{{ '%*d' % (999999999, 1) }}", "'%' would make a string"),
        ("{{ '%s%s%s' | format(big, big, big) }}", "filter 'format' would make a string"),
        ("{{ '{:>999999999}'.format(1) }}", "str.format would make a string"),
        ("{{ '{0}{0}{0}'.format(big) }}", "str.format would make a string"),
        ("{{ '{a}{a}{a}'.format_map({'a': big}) }}", "str.format would make a string"),
        ("{{ 'abc'.translate({97: big, 98: big, 99: big}) }}", "str.translate() would make"),
        ("{{ 2 ** 100000 }}", "'**' would make an integer of about 30,103 digits"),
        ("{{ (1).to_bytes(10**9, 'big') }}", "int.to_bytes() would make a string"),
        ("{{ [1] | batch(1000000000, 'x') | list }}", "filter 'batch' would make 1,000,000,000"),
        ("{{ big | list }}", "filter 'list' would make 4,000,000 items"),
        ("{{ big | wordwrap(1, wrapstring='----') }}", "filter 'wordwrap' would make a string"),
        ("{{ ([big] * 3) | tojson }}", "filter 'tojson' would make a string"),
        ("{{ {'a': [big] * 3} | string }}", "filter 'string' would make a string"),
        ("{{ ([[big] * 2] * 2) | map('string') | join }}", "filter 'join' would make a string"),
        ("{{ [[big] * 2, [big]] | sum(start=[]) | join }}", "filter 'join' would make a string"),
    ],
)
def test_amplifying_operations_are_refused_before_they_allocate(source: str, message: str) -> None:
    tracemalloc.start()
    try:
        err = refused(source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message in err.message
    assert "a template may make at most" in err.message
    # Refused before making the value: the peak is far below what it would have taken.
    assert peak < 3 * TEMPLATE_LIMITS.max_chars


@pytest.mark.parametrize(
    "source",
    [
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
        "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
        "{% set ns = namespace(n=2) %}{% for i in range(40) %}"
        "{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n > 0 }}",
    ],
)
def test_doubling_in_a_loop_stops_at_the_limit(source: str) -> None:
    err = refused(source)
    assert "would make" in err.message


def test_values_that_write_out_bigger_than_they_are_are_refused() -> None:
    # A list that holds the same string many times is small in memory, huge as text/JSON.
    err = refused("{{ [[big] * 10] * 10 }}")
    assert "more than 10,000,000 characters to write out" in err.message
    err = refused("x{{ [[big] * 10] * 10 }}")
    assert "the output would make a string" in err.message
    # Nested literal lists: a billion laughs in Jinja.
    source = (
        "{% set a = [big, big] %}{% set b = [a, a, a, a] %}{% set c = [b, b, b, b] %}"
        "{{ c | tojson }}"
    )
    assert "filter 'tojson'" in refused(source).message
    # A value read as-is from the context was not made by the template: no limit on data
    # that already exists.
    assert render("{{ rows }}", CONTEXT) is CONTEXT["rows"]
    assert render("{{ big }}", CONTEXT) is BIG


def test_the_rendered_text_is_capped() -> None:
    err = refused("{% for i in range(3) %}{{ big }}{% endfor %}")
    assert "the rendered text is 12,000,000 characters" in err.message


def test_text_captured_by_set_blocks_counts_against_the_budget() -> None:
    source = "{% set x %}{% for i in range(100) %}{{ big }}{% endfor %}{% endset %}{{ x | length }}"
    assert "writes more than 50,000,000 characters" in refused(source).message
    source = "{% set x %}{% for i in range(100000) %}" + "y" * 1000 + "{% endfor %}{% endset %}"
    assert "writes more than" in refused(source).message


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% for a in rows %}{% for b in rows if false %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(40) }}",
        "{% for i in range(100000) %}{% if 'zz' in big %}{% endif %}{% endfor %}",
        "{% for i in range(100000) %}{{ big | length }}{% endfor %}",
    ],
)
def test_work_is_budgeted(source: str) -> None:
    assert "more work than a render may" in refused(source).message


def test_recursion_is_a_template_error() -> None:
    err = refused("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}")
    assert "RecursionError" in err.message


def test_lipsum_is_not_available() -> None:
    assert refused("{{ lipsum(1000000) }}").missing == "lipsum"


def test_renders_in_one_budget_share_it() -> None:
    # Each render alone is fine; together they go over the budget of one step.
    source = "{% for i in range(60000) %}{{ i }}{% endfor %}"
    assert len(render(source, {})) > 0
    with render_budget():
        for _ in range(5):
            render(source, {})
        with pytest.raises(TemplateError, match="more work than a render may"):
            for _ in range(100):
                render(source, {})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ 'ab' * 3 }}", "ababab"),
        ("{{ [1, 2] * 2 }}", [1, 2, 1, 2]),
        ("{{ 'a' ~ 1 ~ [2] }}", "a1[2]"),
        ("{{ '%s-%05d' % ('a', 42) }}", "a-00042"),
        ("{{ '%(k)s!' % {'k': 'v'} }}", "v!"),
        ("{{ '{}:{:>4}'.format('a', 7) }}", "a:   7"),
        ("{{ 'x' | center(5) }}", "  x  "),
        ("{{ ['a', 'b'] | join(', ') }}", "a, b"),
        ("{{ rows | map(attribute='id') | select('>', 49997) | list }}", [49998, 49999]),
        ("{{ rows | length }}", 50_000),
        ("{{ 2 ** 64 }}", 2**64),
        ("{{ rows[:2] | tojson }}", '[{"id": 0, "name": "n0"}, {"id": 1, "name": "n1"}]'),
        ("{{ {'a': [1]} | tojson(indent=2) }}", '{\n  "a": [\n    1\n  ]\n}'),
        (
            "{% for r in rows %}{{ r.id }},{% endfor %}",
            ",".join(str(i) for i in range(50_000)) + ",",
        ),
        ("{{ 'ab'.translate({97: 'xy'}) }}", "xyb"),
        ("{{ ('a' * 3 + '\n') | indent(2, first=true) }}", "  aaa\n"),
    ],
)
def test_ordinary_templates_are_unaffected(source: str, expected: Any) -> None:
    assert render(source, CONTEXT) == expected
