"""flowtide.playbook.sqlscan: where each template of a SQL text sits (string literal of any
form, quoted identifier, comment, bare with its role), against a table of snippets and,
as a property, against a reference tokenizer written here from the dialects' rules."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowtide.playbook.sqlscan import placements

T = "{{ x }}"


def placed(sql: str, dialect: str = "postgres") -> list[tuple[str, str, str | None]]:
    return [(p.position, p.form, p.role) for p in placements(sql, dialect)]


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        # string literals, every PostgreSQL form
        ("SELECT '{{ x }}'", [("string", "'...'", None)]),
        ("SELECT 'it''s {{ x }}'", [("string", "'...'", None)]),
        ("SELECT E'\\'{{ x }}'", [("string", "E'...'", None)]),
        ("SELECT e'a\\\\', {{ x }}", [("bare", "", "value")]),  # \\ is one backslash
        ("SELECT U&'d\\0061{{ x }}'", [("string", "U&'...'", None)]),
        ("DO $$ BEGIN PERFORM {{ x }}; END $$", [("string", "$$...$$", None)]),
        ("SELECT $fn$ a $$ {{ x }} $fn$", [("string", "$tag$...$tag$", None)]),
        ("SELECT $fn$ a $fn$, {{ x }}", [("bare", "", "value")]),
        ("SELECT $1, {{ x }}", [("bare", "", "value")]),  # a parameter, not a quote
        ("SELECT a$$b, {{ x }}", [("bare", "", "value")]),  # $ inside an identifier
        # quoted identifiers, doubled quotes inside
        ('SELECT "a""{{ x }}" FROM t', [("identifier", '"..."', None)]),
        ('SELECT "a""", {{ x }}', [("bare", "", "value")]),
        # comments, nested block comments
        ("SELECT 1 -- {{ x }}\n", [("comment", "--", None)]),
        ("SELECT 1 /* /* */ {{ x }} */", [("comment", "/* */", None)]),
        ("SELECT 1 /* a */ , {{ x }}", [("bare", "", "value")]),
        # bare: values
        ("WHERE length(v) = {{ id }}", [("bare", "", "value")]),
        ("WHERE id IN ({{ ids }})", [("bare", "", "value")]),
        ("WHERE id IN (1, {{ ids }})", [("bare", "", "value")]),
        ("INSERT INTO t VALUES ({{ a }}, {{ b }})", [("bare", "", "value")] * 2),
        ("SELECT f({{ a }}, 'x')", [("bare", "", "value")]),
        ("SELECT coalesce(a, {{ b }})", [("bare", "", "value")]),
        # bare: counts
        ("SELECT * FROM t LIMIT {{ n }} OFFSET {{ o }}", [("bare", "", "limit")] * 2),
        ("SELECT * FROM t FETCH FIRST {{ n }} ROWS ONLY", [("bare", "", "limit")]),
        # bare: names
        ("SELECT * FROM {{ t }}", [("bare", "", "name")]),
        ("SELECT * FROM {{ s }}.t", [("bare", "", "name")]),
        ("SELECT * FROM t_{{ s }}", [("bare", "", "name")]),
        ("SELECT * FROM t ORDER BY a, {{ c }}", [("bare", "", "name")]),
        ("SELECT * FROM t ORDER BY {{ c }} {{ dir }}", [("bare", "", "name")] * 2),
        ("SELECT * FROM t ORDER BY a {{ dir }}", [("bare", "", "name")]),
        ("DROP TABLE IF EXISTS {{ t }}", [("bare", "", "name")]),
        ("SELECT a::{{ type }}", [("bare", "", "name")]),
        ("SELECT CASE WHEN a THEN {{ b }} END", [("bare", "", "value")]),
        # Jinja markup: quotes inside a template open nothing, blocks are not values
        (
            "SELECT {{ x | default('a') }}, '{{ y }}'",
            [("bare", "", "value"), ("string", "'...'", None)],
        ),
        ("SELECT '{% if x %}y{% endif %}' {# '{{ y }}' #}", []),
    ],
)
def test_each_template_is_placed(sql: str, expected: list[tuple[str, str, str | None]]) -> None:
    assert placed(sql) == expected


def test_spark_strings_identifiers_and_raw_strings() -> None:
    sql = "SELECT \"{{ a }}\", `{{ b }}`, 'a\\', {{ c }}', r'\\', {{ d }}"
    assert placed(sql, "spark") == [
        ("string", '"..."', None),
        ("identifier", "`...`", None),
        ("string", "'...'", None),  # \' does not end a spark string
        ("bare", "", "value"),  # a raw string ends at its first quote
    ]
    # spark has no dollar quotes: $$ is text
    assert placed("SELECT $$, {{ x }}", "spark") == [("bare", "", "value")]


def test_templates_keep_their_text_and_offset() -> None:
    sql = "SELECT '{{\n  x\n}}', {{ y }}"
    [first, second] = placements(sql)
    assert (first.template, first.offset) == ("{{\n  x\n}}", 8)
    assert (second.template, sql[second.offset :]) == ("{{ y }}", "{{ y }}")


def test_unterminated_forms_end_at_the_end_of_the_text() -> None:
    assert placed("SELECT 'a {{ x }}") == [("string", "'...'", None)]
    assert placed("SELECT $$ {{ x }}") == [("string", "$$...$$", None)]
    assert placed("SELECT /* {{ x }}") == [("comment", "/* */", None)]
    assert placed("SELECT {{ x") == [("bare", "", "value")]


# -- property: a reference tokenizer -------------------------------------------------------

# Pieces of random PostgreSQL text, each a whole token with its position (a template placed
# in it lands at that position); `@` marks where a template may go inside the piece.
PIECES: list[tuple[str, str]] = [
    ("'a@b'", "string"),
    ("'it''s @'", "string"),
    ("E'\\'@'", "string"),
    ("U&'@'", "string"),
    ("$$ @ ' \" -- $$", "string"),
    ("$q$ @ $$ $q$", "string"),
    ('"col@"', "identifier"),
    ('"a""@"', "identifier"),
    ("-- @ ' $$\n", "comment"),
    ("/* @ /* ' */ */", "comment"),
    ("@", "bare"),
    ("= @", "bare"),
    ("LIMIT @", "bare"),
    ("IN (@)", "bare"),
]
FILLER = st.sampled_from(["SELECT", "a", "1", ",", "(", ")", "+", "$1", "x$y", "\n", "t.c"])


def reference(sql: str) -> list[str]:
    """Positions of the templates of `sql` built from PIECES, read by a tokenizer that
    knows only the forms the pieces use, written independently of sqlscan."""
    token = re.compile(
        r"(?P<template>\{\{.*?\}\})"
        r"|(?P<string>(?:[eE]'(?:\\.|''|[^'\\])*'|(?:U&)?'(?:''|[^'])*'"
        r"|(?P<dq>\$(?:[A-Za-z_]\w*)?\$).*?(?P=dq)))"
        r"|(?P<identifier>\"(?:\"\"|[^\"])*\")"
        r"|(?P<comment>--[^\n]*|/\*(?:[^*/]|\*(?!/)|/(?!\*)|/\*.*?\*/)*\*/)"
        r"|(?P<word>[A-Za-z_][\w$]*|\$\d+)"
        r"|(?P<other>.)",
        re.DOTALL,
    )
    found = []
    for match in token.finditer(sql):
        if match.group("template") is not None:
            found.append("bare")
            continue
        for kind in ("string", "identifier", "comment"):
            if match.group(kind) is not None:
                found.extend([kind] * match.group(0).count("{{"))
    return found


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(FILLER, max_size=3), st.sampled_from(PIECES), st.booleans()),
        min_size=1,
        max_size=6,
    )
)
def test_random_sql_places_templates_as_the_reference_does(
    parts: list[tuple[list[str], tuple[str, str], bool]],
) -> None:
    chunks, expected = [], []
    for filler, (piece, position), with_template in parts:
        chunks.append(" ".join(filler))
        chunks.append(piece.replace("@", T if with_template else "z"))
        if with_template:
            expected.append(position)
    sql = " ".join(chunks)
    got = [p.position for p in placements(sql)]
    assert got == expected
    assert reference(sql) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab'\"$-/*\\\n {}eEU&;", max_size=60), st.text(max_size=20))
def test_any_text_is_placed_without_crashing_and_dollar_bodies_are_never_bare(
    noise: str, body: str
) -> None:
    placements(noise + T + noise)
    placements(noise, "spark")
    inside = "$" not in body and "{" not in body
    if inside:
        [p] = [p for p in placements(f"SELECT $${body}{T}$$") if p.template == T]
        assert p.position == "string"
