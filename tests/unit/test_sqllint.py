"""flowtide.playbook.sqllint: templates pasted inside SQL string literals (warnings) and
the shape of `params` (validation errors). Pure logic, no database."""

from __future__ import annotations

import json
from textwrap import dedent

import pytest

from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook import parse_playbook
from flowtide.playbook.sqllint import (
    MAX_WARNINGS,
    SqlWarning,
    lint_playbook,
    pasted_templates,
    safe_template,
)

FILE = "pb.yaml"
HEADER = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: lint}\n"


# -- pasted_templates ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "found"),
    [
        ("SELECT '{{ name }}'", ["{{ name }}"]),
        ("SELECT 'a-{{ x }}-{{ y }}'::text, '{{z}}'", ["{{ x }}", "{{ y }}", "{{z}}"]),
        ("SELECT 'it''s {{ x }}'", ["{{ x }}"]),
        ("SELECT E'\\'{{ x }}'", ["{{ x }}"]),
        # quotes inside the template do not open a literal
        (
            "SELECT {{ x | default('a') }}, '{{ y | replace(\"'\", \"''\") }}'",
            ['{{ y | replace("\'", "\'\'") }}'],
        ),
        ("SELECT '{{\n  x\n}}'", ["{{\n  x\n}}"]),
        # function bodies: the literals inside a dollar-quoted body are followed
        ("DO $$ BEGIN PERFORM '{{ x }}'; END $$", ["{{ x }}"]),
    ],
)
def test_templates_inside_literals_are_found(sql: str, found: list[str]) -> None:
    assert pasted_templates(sql) == found


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM {{ schema }}.t LIMIT {{ n }}",
        'SELECT "{{ column }}" FROM t',  # an identifier, which no placeholder can replace
        "SELECT 'a', {{ x }}, 'b'",
        "SELECT %(name)s -- '{{ old }}'\n",
        "SELECT 1 /* '{{ old }}' */",
        "SELECT '{% if x %}y{% endif %}'",
        "SELECT 'x' {# '{{ y }}' #}",
        "SELECT 'unterminated {% raw",
    ],
)
def test_templates_outside_literals_are_not_flagged(sql: str) -> None:
    assert pasted_templates(sql) == []


def test_spark_reads_double_quotes_and_backslashes_as_string_syntax() -> None:
    # Spark: "..." is a string and \' escapes a quote; PostgreSQL: "..." is an identifier
    # and a backslash is a plain character, so the first literal ends at \'.
    quoted, escaped = 'SELECT "{{ a }}"', "SELECT 'a\\', {{ b }}"
    assert pasted_templates(quoted, dialect="spark") == ["{{ a }}"]
    assert pasted_templates(escaped, dialect="spark") == ["{{ b }}"]
    assert pasted_templates(quoted) == pasted_templates(escaped) == []


# -- lint_playbook -------------------------------------------------------------------------

PLAYBOOK = """\
workload: {name: bob, n: 3}
workbook:
  - name: lookup
    tool: {kind: duckdb, query: "SELECT * FROM t WHERE name = '{{ name }}'"}
workflow:
  - step: start
    tool:
      kind: postgres
      auth: pg
      command: |
        CREATE TABLE IF NOT EXISTS t (name text);
        SELECT * FROM t
        WHERE name = '{{ name }}' LIMIT {{ n }};
    next: [safe]
  - step: safe
    tool:
      kind: postgres
      auth: pg
      command: SELECT * FROM t WHERE name = %(name)s LIMIT %(n)s
      params: {name: "{{ name }}", n: "{{ n }}"}
    next: [claim]
  - step: claim
    loop:
      cursor: {kind: postgres, auth: pg, claim: "UPDATE q SET owner = '{{ name }}' RETURNING id"}
      iterator: row
      spec: {mode: cursor}
    tool:
      - name: first
        kind: noop
      - name: second
        kind: duckdb
        commands: ["SELECT 1", "SELECT '{{ row.id }}'"]
    next: [spark]
  - step: spark
    tool:
      kind: spark
      inputs:
        src: {format: jdbc, auth: pg, query: "SELECT * FROM t WHERE name = '{{ name }}'"}
      sql: SELECT * FROM src WHERE name = "{{ name }}"
"""


def test_lint_names_file_line_step_and_field_of_every_pasted_template() -> None:
    text = HEADER + PLAYBOOK
    lines = text.splitlines()
    playbook = parse_playbook(text, FILE)
    warnings = lint_playbook(playbook)
    found = [(w.step, w.field, w.template, w.line) for w in warnings]

    def line_of(fragment: str) -> int:
        return next(i for i, line in enumerate(lines, start=1) if fragment in line)

    assert found == [
        ("workbook:lookup", "tool.query", "{{ name }}", line_of("SELECT * FROM t WHERE name = '")),
        ("start", "tool.command", "{{ name }}", line_of("WHERE name = '{{ name }}' LIMIT")),
        ("start", "tool.command", "{{ n }}", line_of("WHERE name = '{{ name }}' LIMIT")),
        ("claim", "loop.cursor.claim", "{{ name }}", line_of("UPDATE q SET owner")),
        ("claim", "tool[1].commands[1]", "{{ row.id }}", line_of("SELECT '{{ row.id }}'")),
        ("spark", "tool.sql", "{{ name }}", line_of('name = "{{ name }}"')),
        ("spark", "tool.inputs.src.query", "{{ name }}", line_of("src: {format: jdbc")),
    ]
    assert all(w.file.endswith(FILE) for w in warnings if w.file)
    assert "a jdbc source's `query` takes no `params`" in warnings[-1].message
    assert "(spark: `:name` with `params: {name:" in warnings[-2].message
    rendered = lint_playbook(playbook, "shown.yaml")[1].render()
    assert rendered.startswith(
        f"shown.yaml:{line_of('LIMIT')}: warning: step 'start', field 'tool.command': "
    )
    assert "{{ name }}" in rendered and "`params`" in rendered
    assert lint_playbook(playbook)[1].to_dict() == {
        "file": playbook.file,
        "line": line_of("LIMIT"),
        "step": "start",
        "field": "tool.command",
        "template": "{{ name }}",
        "position": "string",
        "role": None,
        "message": warnings[1].message,
    }


def test_the_params_form_has_no_warning() -> None:
    playbook = parse_playbook(
        HEADER
        + dedent(
            """\
            workflow:
              - step: start
                tool:
                  kind: postgres
                  auth: pg
                  command: "SELECT %(name)s, '%%' || %(name)s"
                  params: {name: "{{ name }}"}
            """
        ),
        FILE,
    )
    assert lint_playbook(playbook) == []


# -- params at validation ------------------------------------------------------------------


def errors_of(body: str) -> list[PlaybookError]:
    with pytest.raises(PlaybookError) as info:
        parse_playbook(HEADER + dedent(body), FILE)
    err = info.value
    return list(err.errors) if isinstance(err, PlaybookErrors) else [err]


def test_params_of_the_wrong_shape_fail_validation_with_file_line_step_and_field() -> None:
    [error] = errors_of(
        """\
        workflow:
          - step: load
            tool:
              kind: postgres
              auth: pg
              command: SELECT %s
              params: 5
        """
    )
    assert (error.file, error.line, error.step, error.field) == (FILE, 10, "load", "tool.params")
    assert "'params' must be a list (positional placeholders) or a mapping" in error.message


def test_cursor_params_and_spark_params_beside_code_fail_validation() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: claim
            loop:
              cursor: {kind: postgres, auth: pg, claim: "SELECT 1", params: "not a list"}
              iterator: row
              spec: {mode: cursor}
            tool: {kind: noop}
            next: [spark]
          - step: spark
            tool: {kind: spark, code: "def main(spark): return None", params: [1]}
        """
    )
    assert [(e.step, e.field) for e in errors] == [
        ("claim", "loop.cursor.params"),
        ("spark", "tool.params"),
    ]
    assert "binds the placeholders of 'sql'" in errors[1].message


def test_params_as_lists_mappings_or_templates_are_valid() -> None:
    playbook = parse_playbook(
        HEADER
        + dedent(
            """\
            workload: {values: [1]}
            workflow:
              - step: a
                tool: {kind: postgres, auth: pg, command: "SELECT %s", params: [1]}
                next: [b]
              - step: b
                tool: {kind: duckdb, query: "SELECT $x", params: {x: 1}}
                next: [c]
              - step: c
                tool: {kind: duckdb, query: "SELECT ?", params: "{{ values }}"}
            """
        ),
        FILE,
    )
    assert playbook.steps["c"].tasks[0].config["params"] == "{{ values }}"


def test_repeated_sql_lines_get_their_own_lines_and_engine_numbers_pass() -> None:
    text = HEADER + dedent(
        """\
        workflow:
          - step: save
            tool:
              kind: postgres
              auth: pg
              command: |
                INSERT INTO log VALUES ('{{ execution_id }}', '{{ loop_index }}');
                INSERT INTO t VALUES ('{{ item }}', '{{ item }}');
                INSERT INTO t VALUES ('{{ item }}', '{{ item }}');
        """
    )
    lines = text.splitlines()
    rows = [i for i, line in enumerate(lines, start=1) if "INSERT INTO t" in line]
    warnings = lint_playbook(parse_playbook(text, FILE))
    # The engine's own numbers cannot end a literal; two templates on a line: one warning.
    assert [(w.line, w.template) for w in warnings] == [(row, "{{ item }}") for row in rows]


# -- every position, its fix, the safe templates ------------------------------------------


def lint_sql(sql: str, kind: str = "postgres") -> list[SqlWarning]:
    auth = "auth: pg, " if kind == "postgres" else ""
    field = "sql" if kind == "spark" else "query"
    text = HEADER + (
        f"workflow:\n  - step: s\n    tool: {{kind: {kind}, {auth}{field}: {json.dumps(sql)}}}\n"
    )
    return lint_playbook(parse_playbook(text, FILE))


def test_the_probes_bare_value_is_warned_with_the_params_fix() -> None:
    # The probe: `id: "0; DROP TABLE t2; SELECT 1"` validated ok and dropped the table.
    [warning] = lint_sql("SELECT v FROM t WHERE length(v) = {{ id }}")
    assert (warning.position, warning.role, warning.line) == ("bare", "value", 6)
    assert "pasted bare into the SQL as a value" in warning.message
    assert '`%(id)s` with `params: {id: "{{ id }}"}`, or %s or $1 with a list' in warning.message


@pytest.mark.parametrize(
    ("kind", "placeholder"),
    [("postgres", "`%(id)s`"), ("duckdb", "`$id`"), ("spark", "`:id`")],
)
def test_the_fix_shows_the_tools_own_placeholder(kind: str, placeholder: str) -> None:
    [warning] = lint_sql("SELECT * FROM t WHERE id = {{ row.id }}", kind)
    assert placeholder in warning.message


@pytest.mark.parametrize(
    ("sql", "position", "says"),
    [
        ("SELECT $$ {{ x }} $$", "string", "where `$$` in its value ends the literal"),
        ("SELECT $f$ {{ x }} $f$", "string", "the closing `$tag$`"),
        ("SELECT E'{{ x }}'", "string", "a quote or a backslash"),
        ('SELECT "{{ x }}" FROM t', "identifier", "a name cannot be a bind parameter"),
        ("SELECT 1 -- {{ x }}", "comment", "where a newline in its value ends the comment"),
        ("SELECT 1 /* {{ x }} */", "comment", "where `*/` in its value"),
        ("SELECT * FROM t LIMIT {{ x }}", "bare", "`LIMIT %(x)s`) or make it a number"),
        ("SELECT * FROM {{ x }}", "bare", "restrict it to known names"),
        ("SELECT a -{{ x | int }}", "bare", "a negative number makes it a `--` comment"),
    ],
)
def test_each_position_has_its_own_fix(sql: str, position: str, says: str) -> None:
    [warning] = lint_sql(sql)
    assert warning.position == position
    assert says in warning.message, warning.message


def test_spark_limit_is_made_a_number_not_bound() -> None:
    [warning] = lint_sql("SELECT * FROM t LIMIT {{ n }}", "spark")
    assert "make it a number ({{ n | int }})" in warning.message and "params" not in warning.message


@pytest.mark.parametrize(
    "template",
    [
        "{{ execution_id }}",
        "{{ loop_index }}",
        "{{ execution_id | string }}",
        "{{ n | int }}",
        "{{ start.ratio | float }}",
        "{{ rows | length }}",
        "{{ 5 }}",
        "{{ ',' if not loop.last }}",
        "{{ col if col in ['name', 'created_at'] else 'name' }}",
        "{{ dir if dir in ('ASC', 'DESC') else 'ASC' }}",
    ],
)
def test_templates_that_cannot_end_a_token_are_exempt_everywhere(template: str) -> None:
    for sql in (
        f"SELECT * FROM t WHERE a = {template}",
        f"SELECT '{template}'",
        f'SELECT "{template}"',
        f"SELECT 1 -- {template}",
        f"SELECT * FROM t ORDER BY {template} LIMIT {template}",
    ):
        assert lint_sql(sql) == [], sql
    assert safe_template(template)


@pytest.mark.parametrize(
    "template",
    [
        "{{ n }}",
        "{{ n | string }}",
        "{{ execution_id | replace('1', ';') }}",
        "{{ col if col in ['a;b'] else 'a' }}",  # not plain words
        "{{ col if other in ['a'] else 'a' }}",  # shows what it did not check
        "{{ n | int }}{{ m }}",
        "{{ n",
    ],
)
def test_other_templates_are_not_exempt(template: str) -> None:
    assert not safe_template(template)


def test_a_quoted_multi_line_sql_keeps_its_line_and_warnings_are_capped() -> None:
    sql = "".join(f"SELECT '{{{{ a{i} }}}}';\n" for i in range(MAX_WARNINGS + 100))
    warnings = lint_sql(sql)  # one YAML line: a double-quoted scalar with \n escapes
    assert len(warnings) == MAX_WARNINGS
    assert {w.line for w in warnings} == {6}
    assert warnings[-1].template == f"{{{{ a{MAX_WARNINGS - 1} }}}}"
