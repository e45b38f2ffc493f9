"""The source end of a `transfer`: readers that yield a source's rows a chunk at a time,
so a transfer holds one chunk in memory whatever the size of the data (an HTTP source is
the exception: one response, parsed whole, as NoETL reads it).

Readers: `http` (one request through the http tool: its auth, headers, errors),
`postgres` (a server-side cursor, `fetchmany(chunk_size)`), `duckdb` (`fetchmany`) and
files (`parquet`, `csv`, `json`: DuckDB's readers, `fetchmany`). The target end is
`transfer_targets`; what both share, `transfer_ends`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext
from flowtide.tools.transfer_ends import (
    duckdb_path,
    pg_connection,
    resolve_file,
    sql_error,
    statement_timeout,
)

_READ_FUNCTIONS = {"parquet": "read_parquet", "csv": "read_csv_auto", "json": "read_json_auto"}

Chunks = Iterator[list[dict[str, Any]]]


@dataclass
class Source:
    """An open source: its columns when known before the first row (SQL and files; an
    HTTP source's come from its first record) and its rows, a chunk at a time."""

    columns: list[str] | None
    chunks: Chunks
    fetched: int | None = None  # records an HTTP response held


def as_records(columns: list[str], batch: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows of a SQL source as records, values as the driver gave them (a Decimal stays
    exact on its way to another database; file targets convert to JSON themselves)."""
    return [dict(zip(columns, row, strict=True)) for row in batch]


def _chunked(rows: Sequence[Any], size: int) -> Chunks:
    for start in range(0, len(rows), size):
        yield list(rows[start : start + size])


def _data_path(data: Any, path: Any) -> Any:
    """NoETL's `data_path`: dotted keys into the response body."""
    if not path:
        return data
    for part in str(path).split("."):
        if isinstance(data, Mapping):
            if part not in data:
                raise ToolError(
                    f"transfer source `data_path` {path!r}: no '{part}' in the response",
                    kind="config_error",
                )
            data = data[part]
        else:
            break  # NoETL: a list reached before the path ends is the data
    return data


@contextlib.contextmanager
def read_http(spec: Mapping[str, Any], ctx: ToolContext, chunk_size: int) -> Iterator[Source]:
    from flowtide.tools.http import HttpTool

    request = {
        k: spec[k]
        for k in (
            "url",
            "endpoint",
            "method",
            "headers",
            "params",
            "auth",
            "json",
            "payload",
            "body",
            "data",
            "timeout",
            "verify_ssl",
            "follow_redirects",
        )
        if k in spec
    }
    response = HttpTool().run({"kind": "http", **request}, ctx)
    data = _data_path(response.get("data"), spec.get("data_path"))
    rows = data if isinstance(data, list) else [data]
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, Mapping)), None)
    if bad is not None:
        raise ToolError(
            f"transfer http source: record {bad} is {type(rows[bad]).__name__}, not an "
            "object (set `data_path` to the list of records in the response)",
            kind="config_error",
        )
    yield Source(None, _chunked(rows, chunk_size), fetched=len(rows))


def _query_and_params(spec: Mapping[str, Any], ctx: ToolContext, tool: str) -> tuple[str, Any]:
    from flowtide.tools.postgres_params import read_params

    query = spec.get("query") or spec.get("command") or spec.get("sql")
    if not isinstance(query, str) or not query.strip():
        raise ToolError(f"a {tool} transfer source needs `query`", kind="config_error")
    return query.strip().rstrip(";"), read_params(spec, f"transfer source ({tool})", ctx.step)


@contextlib.contextmanager
def read_postgres(spec: Mapping[str, Any], ctx: ToolContext, chunk_size: int) -> Iterator[Source]:
    import psycopg

    from flowtide.tools.postgres_params import _bind

    query, params = _query_and_params(spec, ctx, "postgres")
    ((statement, args),) = _bind([query], params, ctx.step)
    pool, conn = pg_connection(spec, ctx)
    try:
        with conn.cursor() as setup:
            statement_timeout(setup, ctx)
        # A named cursor lives on the server: rows come chunk_size at a time.
        with conn.cursor(name=f"flowtide_transfer_{uuid.uuid4().hex[:12]}") as cursor:
            cursor.itersize = chunk_size
            try:
                cursor.execute(statement.encode(conn.info.encoding), args)
            except psycopg.Error as exc:
                raise sql_error(exc, "transfer source query failed", ctx) from None
            columns = [c.name for c in cursor.description or []]

            def chunks() -> Chunks:
                while True:
                    try:
                        batch = cursor.fetchmany(chunk_size)
                    except psycopg.Error as exc:
                        raise sql_error(exc, "transfer source query failed", ctx) from None
                    if not batch:
                        return
                    yield as_records(columns, batch)

            yield Source(columns, chunks())
    finally:
        with contextlib.suppress(Exception):
            conn.rollback()
        pool.putconn(conn)


def _duck_rows(
    cursor: Any, chunk_size: int, what: str, ctx: ToolContext
) -> tuple[list[str], Chunks]:
    columns = [d[0] for d in cursor.description or []]

    def chunks() -> Chunks:
        while True:
            try:
                batch = cursor.fetchmany(chunk_size)
            except Exception as exc:  # duckdb raises several classes
                raise sql_error(exc, what, ctx) from None
            if not batch:
                return
            yield as_records(columns, batch)

    return columns, chunks()


@contextlib.contextmanager
def read_duckdb(spec: Mapping[str, Any], ctx: ToolContext, chunk_size: int) -> Iterator[Source]:
    from flowtide.tools.duckdb import connect

    query, params = _query_and_params(spec, ctx, "duckdb")
    # The playbook's SQL: a connection confined like a duckdb step's.
    connection = connect(duckdb_path(spec, ctx), read_only=False)
    try:
        try:
            cursor = connection.execute(query, params)
        except Exception as exc:
            raise sql_error(exc, "transfer source query failed", ctx) from None
        columns, chunks = _duck_rows(cursor, chunk_size, "transfer source query failed", ctx)
        yield Source(columns, chunks)
    finally:
        connection.close()


@contextlib.contextmanager
def read_file(
    spec: Mapping[str, Any], fmt: str, ctx: ToolContext, chunk_size: int
) -> Iterator[Source]:
    import duckdb

    path = resolve_file(spec.get("path") or spec.get("uri"), ctx)
    if not path.exists():
        raise ToolError(f"transfer source file {path} does not exist", kind="config_error")
    connection = duckdb.connect()
    try:
        try:
            cursor = connection.execute(
                f"SELECT * FROM {_READ_FUNCTIONS[fmt]}($path)", {"path": str(path)}
            )
        except Exception as exc:
            raise sql_error(exc, f"cannot read {fmt} file {path}", ctx) from None
        columns, chunks = _duck_rows(cursor, chunk_size, f"cannot read {path}", ctx)
        yield Source(columns, chunks)
    finally:
        connection.close()
