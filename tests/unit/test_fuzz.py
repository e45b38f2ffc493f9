"""Fuzzing of untrusted input: generated YAML texts go through the loader and validator,
generated templates through the renderer. Only flowtide's own errors may come out
(PlaybookError with file:line, TemplateError with step and field), never another
exception, and never slowly: each example has a deadline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowtide.errors import PlaybookError, PlaybookErrors, TemplateError
from flowtide.playbook import parse_playbook
from flowtide.playbook.template import check_syntax, render

# Bounded on purpose: the whole module stays well under 20 s on a loaded 2-core machine;
# `derandomize` makes a failure reproducible in CI, and no example database is written.
FUZZ = settings(
    max_examples=120,
    deadline=timedelta(seconds=3),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

pytestmark = pytest.mark.timeout(120)

# -- YAML ---------------------------------------------------------------------------------

ODD_SCALARS = [
    "~", "null", "yes", "no", "on", ".nan", "-.inf", "0x1F", "0o17", "1e400", "-0",
    "2024-13-45", "2024-01-02T03:04:05Z", "12:30:00", '"\\u0000"', "'it''s'", '"\\x"',
    "!!int abc", "!!float x", "!!bool maybe", "!!binary '!!'", "!!timestamp nope",
    "!!set {a, b}", "!!omap [1]", "!custom tag", "|", ">", "? x", "- y", "@x", "`x",
    "'{{ a }}'", "'{{ a > }}'", "'{% for %}'", "x: y", "[", "]", "{", "}", "&", "*",
    "'" + "x" * 300 + "'", "\t", "%YAML 1.1", "---", "...", "<<: 1", "<<: [1]",
]  # fmt: skip

KEYS = ["workflow", "step", "tool", "kind", "next", "arcs", "when", "set", "loop", "in",
        "iterator", "spec", "policy", "rules", "then", "do", "code", "workload", "input",
        "<<", "ctx.x", "url", "command", "admit", "mode", "name", "a", "b"]  # fmt: skip

ANCHORS = ["a", "b", "c"]


def _scalar() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(ODD_SCALARS),
        st.sampled_from(["python", "http", "noop", "start", "end", "retry", "parallel"]),
        st.integers(-(10**30), 10**30).map(str),
        st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12).map(
            lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
        ),
    )


def _with_anchor_or_alias(node: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        node,
        st.tuples(st.sampled_from(ANCHORS), node).map(lambda t: f"&{t[0]} {t[1]}"),
        st.sampled_from(ANCHORS).map(lambda a: f"*{a}"),
    )


def _flow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(children, max_size=5).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(st.sampled_from(KEYS), children), max_size=5).map(
            lambda kvs: "{" + ", ".join(f"{k}: {v}" for k, v in kvs) + "}"
        ),
    )


FLOW = st.recursive(_with_anchor_or_alias(_scalar()), lambda c: _with_anchor_or_alias(_flow(c)))


@st.composite
def _block(draw: st.DrawFn, depth: int = 0) -> list[str]:
    """Block-style lines: mappings and sequences, flow values, anchors and aliases."""
    lines: list[str] = []
    indent = "  " * depth
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(KEYS))
        bullet = draw(st.sampled_from(["", "- "]))
        if depth < 6 and draw(st.booleans()):
            anchor = draw(st.sampled_from(["", "&a ", "&b "]))
            lines.append(f"{indent}{bullet}{key}: {anchor}".rstrip())
            lines.extend(draw(_block(depth + 1)))
        else:
            lines.append(f"{indent}{bullet}{key}: {draw(FLOW)}")
    return lines


def _bomb(levels: int, width: int) -> str:
    lines = ["l0: &l0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines)


VALID = """\
workload:
  items: [1, 2, 3]
workflow:
  - step: start
    tool: {kind: python, code: "result = {'n': 1}"}
    next:
      spec: {mode: exclusive}
      arcs:
        - {step: load, when: "{{ start.n > 0 }}"}
        - {step: end}
  - step: load
    loop: {in: "{{ items }}", iterator: item, spec: {mode: parallel}}
    tool:
      kind: http
      url: "http://x/{{ iter.item }}"
      spec: {policy: {rules: [{when: "{{ output.status == 'error' }}", then: {do: retry}}]}}
    next: [end]
  - step: end
"""


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    """A valid playbook with a few lines replaced, inserted or cut."""
    lines = VALID.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines)))
        what = draw(st.sampled_from(["replace", "insert", "cut", "truncate"]))
        if what == "truncate":
            lines = lines[:at]
            continue
        text = draw(st.one_of(FLOW, st.sampled_from(ODD_SCALARS)))
        key = draw(st.sampled_from(KEYS))
        indent = " " * draw(st.integers(0, 8))
        new = f"{indent}{key}: {text}"
        if what == "replace" and at < len(lines):
            lines[at] = new
        elif what == "insert":
            lines.insert(at, new)
        elif lines:
            del lines[min(at, len(lines) - 1)]
    return "\n".join(lines) + "\n"


YAML_TEXTS = st.one_of(
    _block().map(lambda ls: "\n".join(ls) + "\n"),
    FLOW,
    _mutated(),
    st.tuples(st.integers(1, 12), st.integers(1, 12)).map(lambda t: _bomb(*t)),
    st.integers(1, 400).map(lambda n: "x: " + "[" * n + "]" * n),
    st.integers(1, 400).map(lambda n: "x: " + "{a: " * n + "1" + "}" * n),
    st.text(st.sampled_from(list("[]{}:,-?&*!|>'\"#%@` \n\tab1")), max_size=80),
)


def _check_playbook_error(err: PlaybookError, text: str) -> None:
    errors = err.errors if isinstance(err, PlaybookErrors) else [err]
    lines = text.count("\n") + 2
    for one in errors:
        assert one.file == "fuzz.yaml", one.render()
        assert one.line is not None, one.render()
        assert 1 <= one.line <= lines, one.render()
        assert one.render().startswith(f"fuzz.yaml:{one.line}"), one.render()


@FUZZ
@given(YAML_TEXTS)
def test_yaml_texts_give_a_playbook_or_a_playbook_error(text: str) -> None:
    try:
        parse_playbook(text, "fuzz.yaml")
    except PlaybookError as err:
        _check_playbook_error(err, text)


# -- templates ------------------------------------------------------------------------------

CONTEXT: dict[str, Any] = {
    "n": 7,
    "s": "hello",
    "big": "x" * 100_000,
    "items": [1, 2, 3],
    "rows": [{"id": i, "tag": "t"} for i in range(1000)],
    "cfg": {"a": 1, "b": [1, 2]},
    "none": None,
}

NAMES = ["n", "s", "big", "items", "rows", "cfg", "none", "missing", "loop", "range",
         "namespace", "dict", "cycler", "joiner", "now", "env"]  # fmt: skip
FILTERS = ["length", "join", "upper", "replace('l', 'LL')", "center(50)", "indent(4)",
           "format(1)", "batch(3)", "slice(2)", "list", "string", "tojson", "sum",
           "map('string')", "select", "sort", "unique", "first", "last", "int", "float",
           "default('d')", "wordwrap(5)", "truncate(3)", "dictsort", "items",
           "center(100000000)", "indent(99999)", "batch(99999999, 0)", "from_json",
           "tojson(indent=4)", "replace('', 'abc')", "attr('x')", "e", "trim"]  # fmt: skip
METHODS = [".upper()", ".ljust(20)", ".ljust(999999999)", ".split(',')", ".replace('x', 'yy')",
           ".format(1, 2)", ".zfill(99999999)", ".items()", ".get('a')", ".count('x')",
           ".join(items | map('string'))", ".__class__", ".expandtabs(99999999)"]  # fmt: skip
OPS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "in", "not in", "and", "or"]
LITERALS = ["0", "1", "-1", "3", "99999999", "10**9", "2**64", "1.5", "'ab'", "''", "'%s%s'",
            "'{0}{0}'", "[1, 2]", "[]", "{'a': 1}", "(1, 2)", "true", "none", "'\\n'"]  # fmt: skip


def _expr_leaf() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NAMES), st.sampled_from(LITERALS))


def _expr_node(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(OPS), children).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        st.tuples(children, st.sampled_from(FILTERS)).map(lambda t: f"({t[0]} | {t[1]})"),
        st.tuples(children, st.sampled_from(METHODS)).map(lambda t: f"{t[0]}{t[1]}"),
        st.tuples(children, children).map(lambda t: f"{t[0]}[{t[1]}]"),
        st.tuples(children, st.sampled_from(["a", "id", "x"])).map(lambda t: f"{t[0]}.{t[1]}"),
        st.tuples(children, children, children).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        children.map(lambda c: f"range({c})"),
        children.map(lambda c: f"not {c}"),
    )


EXPR = st.recursive(_expr_leaf(), _expr_node, max_leaves=8)


@st.composite
def _statements(draw: st.DrawFn, depth: int = 0) -> str:
    parts: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["out", "text", "set", "if", "for", "macro", "setblock"]))
        if kind == "out" or depth > 2:
            parts.append("{{ " + draw(EXPR) + " }}")
        elif kind == "text":
            parts.append(draw(st.text(max_size=10)))
        elif kind == "set":
            parts.append("{% set v = " + draw(EXPR) + " %}")
        elif kind == "if":
            body = draw(_statements(depth + 1))
            parts.append("{% if " + draw(EXPR) + " %}" + body + "{% endif %}")
        elif kind == "for":
            body = draw(_statements(depth + 1))
            parts.append("{% for x in " + draw(EXPR) + " %}" + body + "{% endfor %}")
        elif kind == "macro":
            body = draw(_statements(depth + 1))
            calls = "{{ m(1) }}" * draw(st.integers(0, 3))
            parts.append("{% macro m(a) %}" + body + "{{ m(a) }}{% endmacro %}" + calls)
        else:
            body = draw(_statements(depth + 1))
            parts.append("{% set blk %}" + body + "{% endset %}{{ blk | length }}")
    return "".join(parts)


TEMPLATES = st.one_of(
    EXPR.map(lambda e: "{{ " + e + " }}"),
    _statements(),
    st.text(st.sampled_from(list("{}%#|()[]'\"~+*.,: abn1-")), max_size=40),
    st.tuples(EXPR, st.text(max_size=5)).map(lambda t: "{{ " + t[0] + t[1] + " }}"),
)


@FUZZ
@given(TEMPLATES)
def test_templates_render_or_raise_a_template_error(source: str) -> None:
    problem = check_syntax(source)
    assert problem is None or problem.message
    try:
        render(source, CONTEXT, step="fuzz", field="set.ctx.x")
    except TemplateError as err:
        assert (err.step, err.field, err.expression) == ("fuzz", "set.ctx.x", source)
        # A limit must refuse before memory runs out, not after.
        assert not err.message.startswith("MemoryError"), err.message


@FUZZ
@given(TEMPLATES, st.sampled_from(["when", "url", "command"]))
def test_templates_inside_playbooks_give_errors_with_positions(source: str, field: str) -> None:
    quoted = "'" + source.replace("'", "''").replace("\n", " ") + "'"
    tool = "{kind: noop}" if field == "when" else f"{{kind: http, {field}: {quoted}}}"
    arc = f"{{step: end, when: {quoted}}}" if field == "when" else "{step: end}"
    text = f"workflow:\n  - step: start\n    tool: {tool}\n    next: [{arc}]\n  - step: end\n"
    try:
        parse_playbook(text, "fuzz.yaml")
    except PlaybookError as err:
        _check_playbook_error(err, text)
