"""The ends of a `transfer`: readers that yield a source's rows a chunk at a time, and
writers that take them a chunk at a time, so a transfer holds one chunk in memory
whatever the size of the data (an HTTP source is the exception: one response, parsed
whole, as NoETL reads it).

Readers: `http` (one request through the http tool: its auth, headers, errors),
`postgres` (a server-side cursor, `fetchmany(chunk_size)`), `duckdb` (`fetchmany`) and
files (`parquet`, `csv`, `json`: DuckDB's readers, `fetchmany`).

Writers: `postgres` (COPY per chunk; `upsert` and a custom `query` by executemany; every
value sent as text that the server parses as the column's type, which is NoETL's
`$n::text::<type>` coercion), `duckdb` (executemany; the table is created from the
first chunk when it does not exist) and files (chunks streamed to a JSON-lines file
beside the target, which DuckDB then turns into parquet or csv, or which becomes the
json target itself). Identifiers are quoted (psycopg.sql for PostgreSQL), values are
always bound, never pasted.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowtide.errors import ToolError
from flowtide.jsonvalues import dumps, to_json
from flowtide.tools import files
from flowtide.tools.base import ToolContext, redact

if TYPE_CHECKING:
    import psycopg

FILE_TYPES = ("parquet", "csv", "json")
_READ_FUNCTIONS = {"parquet": "read_parquet", "csv": "read_csv_auto", "json": "read_json_auto"}

Chunks = Iterator[list[dict[str, Any]]]


@dataclass
class Source:
    """An open source: its columns when known before the first row (SQL and files; an
    HTTP source's come from its first record) and its rows, a chunk at a time."""

    columns: list[str] | None
    chunks: Chunks
    fetched: int | None = None  # records an HTTP response held


# ---------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------


def resolve_file(path: Any, ctx: ToolContext) -> Path:
    if not isinstance(path, str) or not path:
        raise ToolError("a file end of a transfer needs `path`", kind="config_error")
    text = path.removeprefix("file://")
    p = Path(text).expanduser()
    p = p if p.is_absolute() else Path(ctx.base_dir) / p
    return files.check(p, what=f"step '{ctx.step}', transfer file")


def split_table(name: Any) -> tuple[str, ...]:
    """`schema.table` (either part may be "quoted") as its parts, unquoted."""
    if not isinstance(name, str) or not name.strip():
        raise ToolError("the transfer target needs `table`", kind="config_error")
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    text = name.strip()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if quoted and i + 1 < len(text) and text[i + 1] == '"':
                current.append('"')
                i += 2
                continue
            quoted = not quoted
        elif ch == "." and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    if quoted or any(not p for p in parts) or len(parts) > 3:
        raise ToolError(f"invalid table name {name!r}", kind="config_error")
    return tuple(parts)


def _sql_error(exc: Exception, what: str, ctx: ToolContext) -> ToolError:
    sqlstate = getattr(exc, "sqlstate", None)
    message = redact(str(exc).strip() or type(exc).__name__, ctx.secrets)
    state = sqlstate or ""
    if state.startswith(("08", "57P")):
        return ToolError(f"{what}: {message}", kind="connection", retryable=True, code=sqlstate)
    if state == "57014":
        return ToolError(f"{what}: {message}", kind="timeout", retryable=True, code=sqlstate)
    return ToolError(
        f"{what}: {message}",
        kind="sql_error",
        code=sqlstate or type(exc).__name__,
        retryable=state in ("40001", "40P01"),
    )


def as_records(columns: list[str], batch: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows of a SQL source as records, values as the driver gave them (a Decimal stays
    exact on its way to another database; file targets convert to JSON themselves)."""
    return [dict(zip(columns, row, strict=True)) for row in batch]


def _chunked(rows: Sequence[Any], size: int) -> Chunks:
    for start in range(0, len(rows), size):
        yield list(rows[start : start + size])


# ---------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------


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


def _pg_connection(spec: Mapping[str, Any], ctx: ToolContext) -> tuple[Any, Any]:
    """(pool, connection) for one end, through the postgres tool's conninfo, credential
    resolution and pools."""
    from flowtide.tools.postgres_conn import (
        _build_conninfo,
        _checkout,
        _connection_source,
        _pool_for,
    )

    conninfo = _build_conninfo(_connection_source(spec, ctx), ctx)
    pool = _pool_for(conninfo, {}, ctx)
    return pool, _checkout(pool, ctx)


def _statement_timeout(cursor: Any, ctx: ToolContext) -> None:
    if ctx.timeout:
        cursor.execute(
            "SELECT set_config('statement_timeout', %s, true)",
            (str(max(1, int(ctx.timeout * 1000))),),
        )


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
    pool, conn = _pg_connection(spec, ctx)
    try:
        with conn.cursor() as setup:
            _statement_timeout(setup, ctx)
        # A named cursor lives on the server: rows come chunk_size at a time.
        with conn.cursor(name=f"flowtide_transfer_{uuid.uuid4().hex[:12]}") as cursor:
            cursor.itersize = chunk_size
            try:
                cursor.execute(statement.encode(conn.info.encoding), args)
            except psycopg.Error as exc:
                raise _sql_error(exc, "transfer source query failed", ctx) from None
            columns = [c.name for c in cursor.description or []]

            def chunks() -> Chunks:
                while True:
                    try:
                        batch = cursor.fetchmany(chunk_size)
                    except psycopg.Error as exc:
                        raise _sql_error(exc, "transfer source query failed", ctx) from None
                    if not batch:
                        return
                    yield as_records(columns, batch)

            yield Source(columns, chunks())
    finally:
        with contextlib.suppress(Exception):
            conn.rollback()
        pool.putconn(conn)


def _duckdb_path(spec: Mapping[str, Any], ctx: ToolContext) -> str:
    from flowtide.tools.duckdb import _database_path

    return _database_path({"database": spec.get("database") or spec.get("connection")}, ctx)


def _duck_rows(
    cursor: Any, chunk_size: int, what: str, ctx: ToolContext
) -> tuple[list[str], Chunks]:
    columns = [d[0] for d in cursor.description or []]

    def chunks() -> Chunks:
        while True:
            try:
                batch = cursor.fetchmany(chunk_size)
            except Exception as exc:  # duckdb raises several classes
                raise _sql_error(exc, what, ctx) from None
            if not batch:
                return
            yield as_records(columns, batch)

    return columns, chunks()


@contextlib.contextmanager
def read_duckdb(spec: Mapping[str, Any], ctx: ToolContext, chunk_size: int) -> Iterator[Source]:
    from flowtide.tools.duckdb import connect

    query, params = _query_and_params(spec, ctx, "duckdb")
    # The playbook's SQL: a connection confined like a duckdb step's.
    connection = connect(_duckdb_path(spec, ctx), read_only=False)
    try:
        try:
            cursor = connection.execute(query, params)
        except Exception as exc:
            raise _sql_error(exc, "transfer source query failed", ctx) from None
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
            raise _sql_error(exc, f"cannot read {fmt} file {path}", ctx) from None
        columns, chunks = _duck_rows(cursor, chunk_size, f"cannot read {path}", ctx)
        yield Source(columns, chunks)
    finally:
        connection.close()


# ---------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------


@dataclass
class Writer:
    """One target: `open(columns)`, `write(rows)` per chunk (rows: lists of values in
    column order), `close(ok)`: commit (or finish the file) or roll back."""

    spec: Mapping[str, Any]
    ctx: ToolContext
    mode: str
    described: dict[str, Any] = field(default_factory=dict)

    def open(self, columns: list[str]) -> None:
        raise NotImplementedError

    def write(self, rows: list[list[Any]]) -> None:
        raise NotImplementedError

    def close(self, ok: bool) -> None:
        raise NotImplementedError


def _pg_text(value: Any, category: str, dump: Callable[[Any], Any]) -> str | None:
    """`value` as the text PostgreSQL parses as a column of type category `category`
    (pg_type.typcategory): NoETL's `$n::text::<type>` coercion. JSON objects (and lists,
    outside array columns) become JSON text; bool is `true`/`false`; the rest is what
    psycopg writes for the value (timestamps, numerics, arrays, intervals, UUIDs)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, Mapping) or (isinstance(value, list | tuple) and category != "A"):
        return dumps(to_json(value, root="transfer value"))
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    return bytes(dump(value)).decode("utf-8")


class PostgresWriter(Writer):
    """COPY into an existing table (`append`/`insert`; `replace` truncates it first, in
    the same transaction), `upsert` (NoETL: INSERT ... ON CONFLICT on `key`, by default
    the first column), or the target's own `query` (%s placeholders in column order)."""

    conn: Any = None
    pool: Any = None
    table: Any = None
    categories: list[str]

    def open(self, columns: list[str]) -> None:
        import psycopg
        from psycopg import sql
        from psycopg.adapt import PyFormat, Transformer

        self.pool, self.conn = _pg_connection(self.spec, self.ctx)
        self.columns = columns
        custom = self.spec.get("query")
        self.custom = custom.strip() if isinstance(custom, str) and custom.strip() else None
        tx = Transformer(self.conn)
        self.dump = lambda v: tx.get_dumper(v, PyFormat.TEXT).dump(v)
        try:
            with self.conn.cursor() as cur:
                _statement_timeout(cur, self.ctx)
                if self.custom is not None:
                    self.categories = ["X"] * len(columns)
                    return
                self.table = sql.Identifier(*split_table(self.spec.get("table")))
                types = self._column_types(cur)
                missing = [c for c in columns if c not in types]
                if missing:
                    raise ToolError(
                        f"transfer target table {self.spec.get('table')} has no column "
                        f"{', '.join(missing)} (it has {', '.join(types)}); map source "
                        "fields to its columns with `mapping: {column: field}`",
                        kind="config_error",
                    )
                self.categories = [types[c] for c in columns]
                if self.mode == "replace":
                    cur.execute(sql.SQL("TRUNCATE TABLE {}").format(self.table))
        except psycopg.Error as exc:
            raise _sql_error(exc, "transfer target", self.ctx) from None
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        marks = sql.SQL(", ").join(sql.Placeholder() * len(columns))
        self.copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(self.table, cols)
        insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(self.table, cols, marks)
        if self.mode == "upsert":
            key = self.spec.get("key") or self.spec.get("conflict") or columns[0]
            keys = [key] if isinstance(key, str) else [str(k) for k in key]
            rest = [c for c in columns if c not in keys]
            action = (
                sql.SQL("DO UPDATE SET {}").format(
                    sql.SQL(", ").join(
                        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                        for c in rest
                    )
                )
                if rest
                else sql.SQL("DO NOTHING")
            )
            insert = sql.SQL("{} ON CONFLICT ({}) {}").format(
                insert, sql.SQL(", ").join(sql.Identifier(k) for k in keys), action
            )
        self.insert_sql = insert

    def _column_types(self, cur: psycopg.Cursor[Any]) -> dict[str, str]:
        """column -> pg_type.typcategory of the target table (the name is bound as a
        parameter and parsed by the server as a regclass)."""
        name = self.table.as_string(self.conn)
        cur.execute(
            "SELECT a.attname, t.typcategory FROM pg_attribute a "
            "JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum",
            (name,),
        )
        return {str(n): str(c) for n, c in cur.fetchall()}

    def write(self, rows: list[list[Any]]) -> None:
        import psycopg

        texts = [
            [_pg_text(v, cat, self.dump) for v, cat in zip(row, self.categories, strict=True)]
            for row in rows
        ]
        try:
            with self.conn.cursor() as cur:
                if self.custom is not None:
                    cur.executemany(self.custom.encode(self.conn.info.encoding), texts)
                elif self.mode == "upsert":
                    cur.executemany(self.insert_sql, texts)
                else:
                    with cur.copy(self.copy_sql) as copy:
                        for row in texts:
                            copy.write_row(row)
        except psycopg.Error as exc:
            raise _sql_error(exc, "transfer target write failed", self.ctx) from None

    def close(self, ok: bool) -> None:
        if self.conn is None:
            return
        try:
            if ok:
                import psycopg

                try:
                    self.conn.commit()
                except psycopg.Error as exc:
                    raise _sql_error(exc, "transfer target commit failed", self.ctx) from None
            else:
                with contextlib.suppress(Exception):
                    self.conn.rollback()
        finally:
            self.pool.putconn(self.conn)
            self.conn = None


def _duck_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _duck_type(values: list[Any]) -> str:
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return "VARCHAR"
    if kinds == {bool}:
        return "BOOLEAN"
    if kinds <= {int}:
        return "BIGINT"
    if kinds <= {int, float}:
        return "DOUBLE"
    if kinds <= {dict, list}:
        return "JSON"
    return "VARCHAR"


def _duck_value(value: Any) -> Any:
    if isinstance(value, Mapping | list | tuple):
        return dumps(to_json(value, root="transfer value"))
    return value


class DuckDBWriter(Writer):
    """INSERT (executemany) into a DuckDB table, created from the first chunk's values
    when missing; `replace` deletes its rows first (all in one transaction)."""

    connection: Any = None

    def open(self, columns: list[str]) -> None:
        from flowtide.tools.duckdb import connect

        self.columns = columns
        self.table = ".".join(_duck_ident(p) for p in split_table(self.spec.get("table")))
        self.connection = connect(_duckdb_path(self.spec, self.ctx))
        self.connection.execute("BEGIN TRANSACTION")
        self.ready = False

    def _exists(self) -> bool:
        parts = split_table(self.spec.get("table"))
        query = "SELECT count(*) FROM duckdb_tables() WHERE table_name = ?"
        args: list[Any] = [parts[-1]]
        if len(parts) > 1:
            query += " AND schema_name = ?"
            args.append(parts[-2])
        if len(parts) > 2:
            query += " AND database_name = ?"
            args.append(parts[-3])
        found = self.connection.execute(query, args).fetchone()
        return bool(found and found[0])

    def _prepare(self, rows: list[list[Any]]) -> None:
        if not self._exists():
            if self.spec.get("query"):
                raise ToolError(
                    f"transfer target table {self.spec.get('table')} does not exist",
                    kind="config_error",
                )
            defs = ", ".join(
                f"{_duck_ident(c)} {_duck_type([r[i] for r in rows])}"
                for i, c in enumerate(self.columns)
            )
            self.connection.execute(f"CREATE TABLE {self.table} ({defs})")
        elif self.mode == "replace":
            self.connection.execute(f"DELETE FROM {self.table}")
        cols = ", ".join(_duck_ident(c) for c in self.columns)
        marks = ", ".join("?" * len(self.columns))
        custom = self.spec.get("query")
        self.insert = (
            str(custom) if custom else f"INSERT INTO {self.table} ({cols}) VALUES ({marks})"
        )
        self.ready = True

    def write(self, rows: list[list[Any]]) -> None:
        try:
            if not self.ready:
                self._prepare(rows)
            self.connection.executemany(self.insert, [[_duck_value(v) for v in r] for r in rows])
        except ToolError:
            raise
        except Exception as exc:
            raise _sql_error(exc, "transfer target write failed", self.ctx) from None

    def close(self, ok: bool) -> None:
        if self.connection is None:
            return
        try:
            if ok and not self.ready and self.mode == "replace":
                with contextlib.suppress(Exception):
                    self.connection.execute(f"DELETE FROM {self.table}")
            self.connection.execute("COMMIT" if ok else "ROLLBACK")
        except Exception as exc:
            if ok:
                raise _sql_error(exc, "transfer target commit failed", self.ctx) from None
        finally:
            self.connection.close()
            self.connection = None


class FileWriter(Writer):
    """Rows streamed as JSON lines to a file beside the target; on success that file is
    the `json` target, or DuckDB turns it into `parquet` / `csv` (column types from the
    target's `schema: {column: TYPE}` when given, else inferred). `replace` (the default
    for files) overwrites; `append` adds to a json or csv file, never to parquet."""

    fmt: str = "json"
    handle: Any = None

    def open(self, columns: list[str]) -> None:
        self.path = resolve_file(self.spec.get("path") or self.spec.get("uri"), self.ctx)
        if self.mode == "upsert":
            raise ToolError("a file target takes mode append or replace", kind="config_error")
        if self.mode in ("append", "insert") and self.fmt == "parquet" and self.path.exists():
            raise ToolError(
                f"parquet file {self.path} cannot be appended to: use mode: replace or a new path",
                kind="config_error",
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = columns
        self.staging = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.jsonl")
        self.handle = open(self.staging, "w", encoding="utf-8")  # noqa: SIM115
        self.described = {"target_path": str(self.path), "format": self.fmt}

    def write(self, rows: list[list[Any]]) -> None:
        lines = [
            dumps(to_json(dict(zip(self.columns, row, strict=True)), root="row")) for row in rows
        ]
        self.handle.write("\n".join(lines) + "\n")

    def close(self, ok: bool) -> None:
        if self.handle is None:
            return
        self.handle.close()
        self.handle = None
        try:
            if ok:
                self._finish()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.staging)

    def _finish(self) -> None:
        appending = self.mode in ("append", "insert") and self.path.exists()
        schema = self.spec.get("schema")
        if self.fmt == "json" and not schema:
            if appending:
                with (
                    open(self.path, "a", encoding="utf-8") as target,
                    open(self.staging, encoding="utf-8") as staged,
                ):
                    for line in staged:
                        target.write(line)
            else:
                os.replace(self.staging, self.path)
            return
        import duckdb

        columns = ""
        if isinstance(schema, Mapping) and schema:
            columns = ", columns = " + _struct_literal(schema)
        source = f"read_json({_literal(str(self.staging))}, format = 'newline_delimited'{columns})"
        out = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.out")
        options = {"parquet": "FORMAT parquet", "csv": "FORMAT csv, HEADER", "json": "FORMAT json"}
        if appending and self.fmt == "csv":
            options["csv"] = "FORMAT csv, HEADER false"
        con = duckdb.connect()
        try:
            con.execute(
                f"COPY (SELECT * FROM {source}) TO {_literal(str(out))} ({options[self.fmt]})"
            )
        except Exception as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(out)
            raise _sql_error(exc, f"cannot write {self.fmt} file {self.path}", self.ctx) from None
        finally:
            con.close()
        if appending:
            with open(self.path, "ab") as target, open(out, "rb") as part:
                target.write(part.read())
            os.unlink(out)
        else:
            os.replace(out, self.path)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _struct_literal(columns: Mapping[str, Any]) -> str:
    items = ", ".join(
        f"{_literal(str(name))}: {_literal(str(kind))}" for name, kind in columns.items()
    )
    return "{" + items + "}"
