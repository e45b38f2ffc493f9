"""The same values give the same JSON whichever tool made them (README, "Results as
JSON"): python in this process and in a child process (plain Python values, and numpy /
pandas ones), postgres (a real server), duckdb, and an HTTP body."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flowtide.tools.duckdb import DuckDBTool
from flowtide.tools.http import HttpTool
from flowtide.tools.postgres import PostgresTool
from flowtide.tools.python import PythonTool
from flowtide.tools.python_pool import Isolation
from jsonsample import EXPECTED, PANDAS_CODE, PYTHON_CODE, UID, canonical
from pyuser import PYTHON_USER

POSTGRES_SQL = f"""
SET LOCAL TimeZone = 'UTC';
SELECT 600::numeric AS whole, 12.50::numeric(10, 2) AS price,
       'NaN'::float8 AS nan, 'Infinity'::float8 AS inf,
       '\\x00ff'::bytea AS raw, 'ab'::bytea AS text_bytes,
       timestamptz '2024-05-06 07:08:09+00' AS at, timestamp '2024-05-06 07:08:09' AS naive,
       date '2024-05-06' AS day, time '07:08:09' AS clock, timetz '07:08:09+02' AS clock_tz,
       interval '90 seconds' AS span, '{UID}'::uuid AS uid, ARRAY[1, 2] AS list,
       '{{"k": "v"}}'::jsonb AS obj, NULL::text AS nothing, true AS flag, 42 AS n, 'text' AS s
"""

DUCKDB_SQL = f"""
SET TimeZone = 'UTC';
SELECT 600::DECIMAL(18, 0) AS whole, 12.50::DECIMAL(10, 2) AS price,
       'NaN'::DOUBLE AS nan, 'Infinity'::DOUBLE AS inf,
       '\\x00\\xFF'::BLOB AS raw, 'ab'::BLOB AS text_bytes,
       TIMESTAMPTZ '2024-05-06 07:08:09+00' AS at, TIMESTAMP '2024-05-06 07:08:09' AS naive,
       DATE '2024-05-06' AS day, TIME '07:08:09' AS clock, TIMETZ '07:08:09+02' AS clock_tz,
       INTERVAL 90 SECOND AS span, '{UID}'::UUID AS uid, [1, 2] AS list,
       {{'k': 'v'}} AS obj, NULL AS nothing, true AS flag, 42 AS n, 'text' AS s
"""


@pytest.fixture(scope="module", params=["thread", "process"])
def python_tool(request: pytest.FixtureRequest) -> Iterator[PythonTool]:
    tool = PythonTool(isolation=Isolation(mode=request.param, user=PYTHON_USER))
    yield tool
    tool.configure(Isolation())  # stops the children


def test_python_plain_values(python_tool: PythonTool, make_ctx: Any) -> None:
    rows = python_tool.run({"code": PYTHON_CODE}, make_ctx())
    assert canonical(rows) == canonical([EXPECTED])


def test_python_numpy_and_pandas_values(python_tool: PythonTool, make_ctx: Any) -> None:
    rows = python_tool.run({"code": PANDAS_CODE}, make_ctx())
    assert canonical(rows) == canonical([EXPECTED])


def test_duckdb(make_ctx: Any) -> None:
    rows = DuckDBTool().run({"query": DUCKDB_SQL}, make_ctx())
    assert canonical(rows) == canonical([EXPECTED])


@pytest.mark.postgres
def test_postgres(pg_alias: str, make_ctx: Any) -> None:
    result = PostgresTool().run({"auth": pg_alias, "command": POSTGRES_SQL}, make_ctx())
    assert canonical(result["rows"]) == canonical([EXPECTED])
    assert result["command_1"]["rows"] == result["rows"]


def test_unknown_types_fail_alike(python_tool: PythonTool, make_ctx: Any) -> None:
    from flowtide.errors import ToolError

    with pytest.raises(ToolError) as info:
        python_tool.run({"code": "result = {'rows': [1, 1j]}"}, make_ctx())
    assert info.value.code == "ResultNotSerializable"
    assert info.value.data == {"path": "result['rows'][1]", "type": "complex"}


def test_http_body_non_finite_numbers_are_null(http_stub: Any, make_ctx: Any) -> None:
    result = HttpTool().run({"method": "GET", "url": f"{http_stub.url}/non-finite"}, make_ctx())
    assert result["data"] == {"nan": None, "inf": None, "minus_inf": None, "n": 1.5}
    assert canonical(result["data"])  # strict JSON
