"""DuckDBTool on in-memory and file databases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flowtide.errors import ToolError
from flowtide.tools.duckdb import DuckDBTool


def run(config: dict[str, Any], ctx: Any) -> Any:
    return DuckDBTool().run({"kind": "duckdb", **config}, ctx)


def test_duckdb_test_fixture_shape(make_ctx: Any) -> None:
    # The exact query of noetl-e2e playbooks/duckdb_test.yaml.
    query = (
        "CREATE TABLE users (id INTEGER, name VARCHAR, age INTEGER);\n"
        "INSERT INTO users VALUES (1, 'Alice', 30), (2, 'Bob', 25), (3, 'Charlie', 35);\n"
        "SELECT name, age FROM users WHERE age >= 30 ORDER BY age;\n"
    )
    result = run({"database": ":memory:", "query": query}, make_ctx())
    assert result == [{"name": "Alice", "age": 30}, {"name": "Charlie", "age": 35}]


def test_last_row_returning_statement_wins(make_ctx: Any) -> None:
    result = run(
        {"command": "CREATE TABLE t (a INT); SELECT 'first' AS x; INSERT INTO t VALUES (1);"},
        make_ctx(),
    )
    assert result == [{"x": "first"}]


def test_no_rows_gives_empty_list(make_ctx: Any) -> None:
    assert run({"query": "CREATE TABLE t (a INT); INSERT INTO t VALUES (1)"}, make_ctx()) == []


def test_insert_returning_counts_as_rows(make_ctx: Any) -> None:
    result = run(
        {"query": "CREATE TABLE t (a INT); INSERT INTO t VALUES (4), (5) RETURNING a"},
        make_ctx(),
    )
    assert result == [{"a": 4}, {"a": 5}]


def test_commands_list_and_dollar_quotes(make_ctx: Any) -> None:
    result = run(
        {
            "commands": [
                "CREATE TABLE t (s VARCHAR); INSERT INTO t VALUES ($$a;b$$), ('c;''d');",
                "-- comment; here\nSELECT s FROM t ORDER BY s",
            ]
        },
        make_ctx(),
    )
    assert result == [{"s": "a;b"}, {"s": "c;'d"}]


def test_values_are_json_friendly(make_ctx: Any) -> None:
    result = run(
        {
            "query": "SELECT 1.25::DECIMAL(10,2) AS price, DATE '2024-01-02' AS day, "
            "TIMESTAMP '2024-01-02 03:04:05' AS at, "
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::UUID AS uid, "
            "[1, 2] AS list, {'k': 'v'} AS struct, 'ab'::BLOB AS raw, NULL AS nothing, "
            "INTERVAL 90 SECOND AS span, 10::HUGEINT AS big"
        },
        make_ctx(),
    )
    assert result == [
        {
            "price": 1.25,
            "day": "2024-01-02",
            "at": "2024-01-02T03:04:05",
            "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "list": [1, 2],
            "struct": {"k": "v"},
            "raw": "YWI=",
            "nothing": None,
            "span": 90.0,
            "big": 10,
        }
    ]
    json.dumps(result, allow_nan=False)


def test_file_database_relative_to_base_dir(make_ctx: Any, tmp_path: Path) -> None:
    ctx = make_ctx(base_dir=tmp_path)
    run({"database": "data/test.duckdb", "query": "CREATE TABLE t AS SELECT 42 AS v"}, ctx)
    assert (tmp_path / "data" / "test.duckdb").is_file()
    assert run({"database": "data/test.duckdb", "query": "SELECT v FROM t"}, ctx) == [{"v": 42}]


def test_sql_error(make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        run({"query": "SELECT 1; SELECT * FROM missing_table"}, make_ctx())
    assert info.value.kind == "sql_error"
    assert info.value.retryable is False
    assert "statement 1" in info.value.message
    assert "missing_table" in info.value.message


def test_parse_error(make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        run({"query": "SELEC oops"}, make_ctx())
    assert info.value.kind == "sql_error"


def test_missing_sql(make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        run({"database": ":memory:"}, make_ctx())
    assert info.value.kind == "config_error"


def test_timeout_interrupts(make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        run(
            {"query": "SELECT sum(a * b) FROM range(1000000) t1(a), range(1000000) t2(b)"},
            make_ctx(timeout=0.3),
        )
    assert info.value.kind == "timeout"
    assert info.value.retryable is True
