"""The target end of a `transfer`: writers that take its rows a chunk at a time, so a
transfer holds one chunk in memory whatever the size of the data.

Writers: `postgres` (COPY per chunk; `upsert` and a custom `query` by executemany; every
value sent as text that the server parses as the column's type, which is NoETL's
`$n::text::<type>` coercion), `duckdb` (executemany; the table is created from the
first chunk when it does not exist) and files (chunks streamed to a JSON-lines file
beside the target, which DuckDB then turns into parquet or csv, or which becomes the
json target itself). Identifiers are quoted (psycopg.sql for PostgreSQL), values are
always bound, never pasted. The source end is `transfer_sources`; what both share,
`transfer_ends`.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flowtide.errors import ToolError
from flowtide.jsonvalues import dumps, to_json
from flowtide.tools.base import ToolContext
from flowtide.tools.transfer_ends import (
    duckdb_path,
    pg_connection,
    resolve_file,
    split_table,
    sql_error,
    statement_timeout,
)

if TYPE_CHECKING:
    import psycopg


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

        self.pool, self.conn = pg_connection(self.spec, self.ctx)
        self.columns = columns
        custom = self.spec.get("query")
        self.custom = custom.strip() if isinstance(custom, str) and custom.strip() else None
        tx = Transformer(self.conn)
        self.dump = lambda v: tx.get_dumper(v, PyFormat.TEXT).dump(v)
        try:
            with self.conn.cursor() as cur:
                statement_timeout(cur, self.ctx)
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
            raise sql_error(exc, "transfer target", self.ctx) from None
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
            raise sql_error(exc, "transfer target write failed", self.ctx) from None

    def close(self, ok: bool) -> None:
        if self.conn is None:
            return
        try:
            if ok:
                import psycopg

                try:
                    self.conn.commit()
                except psycopg.Error as exc:
                    raise sql_error(exc, "transfer target commit failed", self.ctx) from None
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
        self.connection = connect(duckdb_path(self.spec, self.ctx))
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
            raise sql_error(exc, "transfer target write failed", self.ctx) from None

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
                raise sql_error(exc, "transfer target commit failed", self.ctx) from None
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
            raise sql_error(exc, f"cannot write {self.fmt} file {self.path}", self.ctx) from None
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
