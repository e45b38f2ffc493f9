"""`params`: values bound by the driver, never pasted into the SQL text (issue 14, item 6).

The postgres cases run on a real server (tests/pgserver.py), the duckdb cases on a real
in-memory database; `mask_sql` is pure logic.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from flowtide.errors import ToolError
from flowtide.tools.duckdb import DuckDBTool
from flowtide.tools.postgres import PostgresTool, mask_sql

# A value that closes the literal it is pasted into and runs statements of its own.
ATTACK = "x'; DELETE FROM {table}; SELECT 'y"


@pytest.fixture
def table() -> str:
    return f"victim_{uuid.uuid4().hex[:12]}"


def pg(config: dict[str, Any], ctx: Any) -> Any:
    return PostgresTool().run({"kind": "postgres", **config}, ctx)


def duck(config: dict[str, Any], ctx: Any) -> Any:
    return DuckDBTool().run({"kind": "duckdb", **config}, ctx)


# ---------------------------------------------------------------------------------------
# mask_sql (no server)
# ---------------------------------------------------------------------------------------


def test_mask_keeps_offsets_and_blanks_everything_but_code() -> None:
    script = "SELECT $1, '$2;x', \"$3\", $$ $4 $$, E'\\'$5' -- $6\n/* $7 */ FROM t; SELECT price$1"
    masked = mask_sql(script)
    assert len(masked) == len(script)
    assert "$1," in masked and masked.count(";") == 1
    for hidden in ("$2", "$3", "$4", "$5", "$6", "$7"):
        assert hidden not in masked
    # `price$1` is an identifier, which the masked text keeps as code.
    assert masked.endswith("SELECT price$1")


# ---------------------------------------------------------------------------------------
# postgres
# ---------------------------------------------------------------------------------------


@pytest.fixture
def victim(pg_alias: str, make_ctx: Any, table: str) -> str:
    pg(
        {
            "auth": pg_alias,
            "command": f"CREATE TABLE {table} (id int); INSERT INTO {table} VALUES (1), (2)",
        },
        make_ctx(),
    )
    return table


def victim_rows(pg_alias: str, make_ctx: Any, table: str) -> int:
    result = pg({"auth": pg_alias, "command": f"SELECT count(*) AS n FROM {table}"}, make_ctx())
    return int(result["rows"][0]["n"])


@pytest.mark.postgres
def test_pasted_value_runs_as_sql_which_is_the_attack(
    pg_alias: str, make_ctx: Any, victim: str
) -> None:
    # The control for the tests below: pasted into the text, the value deletes the rows.
    value = ATTACK.format(table=victim)
    pg({"auth": pg_alias, "command": f"SELECT '{value}' AS v"}, make_ctx())
    assert victim_rows(pg_alias, make_ctx, victim) == 0


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("command", "params"),
    [
        ("SELECT %(name)s AS v", {"name": "VALUE"}),
        ("SELECT %s AS v", ["VALUE"]),
        ("SELECT $1 AS v", ["VALUE"]),
    ],
    ids=["named", "positional", "numbered"],
)
def test_bound_value_is_data_not_sql(
    pg_alias: str, make_ctx: Any, victim: str, command: str, params: Any
) -> None:
    value = ATTACK.format(table=victim)
    bound = {k: value for k in params} if isinstance(params, dict) else [value for _ in params]
    result = pg({"auth": pg_alias, "command": command, "params": bound}, make_ctx())
    assert result["rows"] == [{"v": value}]
    assert set(result) == {"command_0", "columns", "rows", "row_count"}
    assert victim_rows(pg_alias, make_ctx, victim) == 2


@pytest.mark.postgres
def test_mapping_is_shared_by_every_statement(pg_alias: str, make_ctx: Any, table: str) -> None:
    result = pg(
        {
            "auth": pg_alias,
            "command": f"""
                CREATE TABLE {table} (id int, name text, tags text[], doc jsonb);
                INSERT INTO {table} VALUES (%(id)s, %(name)s, %(tags)s, %(doc)s);
                SELECT id, name, tags, doc, name LIKE 'it''s%%' AS pct FROM {table}
                WHERE id = %(id)s AND 'b' = ANY(tags);
            """,
            "params": {
                "id": 7,
                "name": "it's; DROP TABLE x",
                "tags": ["a", "b"],
                "doc": {"k": [1, {"n": None}]},
                "unused": "ignored",
            },
        },
        make_ctx(),
    )
    assert result["rows"] == [
        {
            "id": 7,
            "name": "it's; DROP TABLE x",
            "tags": ["a", "b"],
            "doc": {"k": [1, {"n": None}]},
            "pct": True,
        }
    ]


@pytest.mark.postgres
def test_numbered_placeholders_bind_across_statements(
    pg_alias: str, make_ctx: Any, table: str
) -> None:
    # NoETL's tool runner form: a list bound to $1..$n. Here `%` stays a plain character.
    result = pg(
        {
            "auth": pg_alias,
            "command": f"""
                CREATE TABLE {table} (a int, b text);
                INSERT INTO {table} VALUES ($2, $1), ($2 + 1, '100%');
                SELECT a, b, '$1' AS literal FROM {table} WHERE b LIKE $3 ORDER BY a;
            """,
            "params": ["one", 5, "%"],
        },
        make_ctx(),
    )
    assert result["rows"] == [
        {"a": 5, "b": "one", "literal": "$1"},
        {"a": 6, "b": "100%", "literal": "$1"},
    ]


@pytest.mark.postgres
def test_cursor_claim_style_query_binds_params(pg_alias: str, make_ctx: Any, table: str) -> None:
    # What a cursor loop runs: its `claim` becomes the command, its params ride along.
    pg(
        {
            "auth": pg_alias,
            "command": f"CREATE TABLE {table} (id int, done bool DEFAULT false); "
            f"INSERT INTO {table} (id) SELECT generate_series(1, 5)",
        },
        make_ctx(),
    )
    claimed = pg(
        {
            "auth": pg_alias,
            "command": f"UPDATE {table} SET done = true WHERE id IN (SELECT id FROM {table} "
            "WHERE NOT done ORDER BY id LIMIT %(n)s) RETURNING id",
            "params": {"n": 2},
        },
        make_ctx(),
    )
    assert sorted(r["id"] for r in claimed["rows"]) == [1, 2]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("command", "params", "expected"),
    [
        ("SELECT 1; SELECT %s", [1], "`command` has 2 statements"),
        ("SELECT $1, $3", ["a", "b"], "uses $3 but `params` has 2 value(s)"),
        ("SELECT %(a)s", ["x"], "`params` do not fit its placeholders"),
        ("SELECT %s", {"a": 1}, "`params` do not fit its placeholders"),
        ("SELECT %(a)s", {"b": 1}, "query parameter missing: a"),
        ("SELECT %s, %s", [1], "2 placeholders but 1 parameters"),
        ("SELECT 'a%' LIKE %(p)s", {"p": "a"}, "write a literal % as %%"),
        ("SELECT 1", "x", "must be a list (positional placeholders) or a mapping"),
    ],
)
def test_params_that_do_not_fit_are_config_errors_naming_step_and_field(
    pg_alias: str, make_ctx: Any, command: str, params: Any, expected: str
) -> None:
    with pytest.raises(ToolError) as info:
        pg({"auth": pg_alias, "command": command, "params": params}, make_ctx(step="load"))
    assert info.value.kind == "config_error"
    assert "step 'load'" in info.value.message and "params" in info.value.message
    assert expected in info.value.message


@pytest.mark.postgres
def test_bind_error_rolls_back_earlier_statements(pg_alias: str, make_ctx: Any, table: str) -> None:
    with pytest.raises(ToolError):
        pg(
            {
                "auth": pg_alias,
                "command": f"CREATE TABLE {table} (a int); SELECT %(missing)s",
                "params": {"other": 1},
            },
            make_ctx(),
        )
    exists = pg(
        {
            "auth": pg_alias,
            "command": "SELECT to_regclass(%(t)s) IS NOT NULL AS e",
            "params": {"t": table},
        },
        make_ctx(),
    )
    assert exists["rows"] == [{"e": False}]


# ---------------------------------------------------------------------------------------
# duckdb
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "params"),
    [
        ("SELECT $name AS v", {"name": "VALUE"}),
        ("SELECT ? AS v", ["VALUE"]),
        ("SELECT $1 AS v", ["VALUE"]),
    ],
    ids=["named", "positional", "numbered"],
)
def test_duckdb_bound_value_is_data_not_sql(make_ctx: Any, query: str, params: Any) -> None:
    database = {"database": "victim.duckdb"}
    setup = "CREATE OR REPLACE TABLE victim (id INT); INSERT INTO victim VALUES (1), (2)"
    count = {**database, "query": "SELECT count(*) AS n FROM victim"}
    value = ATTACK.format(table="victim")

    duck({**database, "query": setup}, make_ctx())
    duck({**database, "query": f"SELECT '{value}' AS v"}, make_ctx())
    assert duck(count, make_ctx()) == [{"n": 0}]  # the control: pasted, the value deletes

    duck({**database, "query": setup}, make_ctx())
    bound = {k: value for k in params} if isinstance(params, dict) else [value]
    assert duck({**database, "query": query, "params": bound}, make_ctx()) == [{"v": value}]
    assert duck(count, make_ctx()) == [{"n": 2}]


def test_duckdb_mapping_shared_by_statements_each_taking_its_names(make_ctx: Any) -> None:
    result = duck(
        {
            "query": (
                "CREATE TABLE t (a INT, b VARCHAR, c INT[]);"
                "INSERT INTO t VALUES ($a, $b, $c);"
                "SELECT a, b, c, 'x%' LIKE $pattern AS m FROM t WHERE a = $a"
            ),
            "params": {"a": 1, "b": "it's", "c": [1, 2], "pattern": "x%"},
        },
        make_ctx(),
    )
    assert result == [{"a": 1, "b": "it's", "c": [1, 2], "m": True}]


def test_duckdb_numbered_placeholders_across_statements(make_ctx: Any) -> None:
    result = duck(
        {
            "commands": [
                "CREATE TABLE t (a INT, b VARCHAR); INSERT INTO t VALUES ($2, $1)",
                "SELECT * FROM t WHERE a = $2",
            ],
            "params": ["x", 3],
        },
        make_ctx(),
    )
    assert result == [{"a": 3, "b": "x"}]


@pytest.mark.parametrize(
    ("query", "params", "expected"),
    [
        ("SELECT 1; SELECT ?", [1], "binds the ? placeholders of one statement"),
        ("SELECT $1, $3", [1, 2], "uses $3 but `params` has 2 value(s)"),
        ("SELECT $a", {"b": 1}, "uses $a, which `params` does not name"),
        ("SELECT $a", [1], "`params` must be a mapping for them"),
        ("SELECT ?", {"a": 1}, "`params` must be a list for them"),
        ("SELECT 1", 3, "must be a list (positional placeholders) or a mapping"),
    ],
)
def test_duckdb_params_that_do_not_fit_are_config_errors(
    make_ctx: Any, query: str, params: Any, expected: str
) -> None:
    with pytest.raises(ToolError) as info:
        duck({"query": query, "params": params}, make_ctx(step="agg"))
    assert info.value.kind == "config_error"
    assert "step 'agg'" in info.value.message
    assert expected in info.value.message
