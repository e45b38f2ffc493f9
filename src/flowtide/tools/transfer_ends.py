"""What both ends of a `transfer` share (`transfer_sources` reads the source,
`transfer_targets` writes the target): a file end's path, checked against the worker's
file roots; a table name's parts; the ToolError of a failed SQL statement; and the
connections of a postgres end (the postgres tool's conninfo, credentials and pools) and a
duckdb end (the duckdb tool's database path).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools import files
from flowtide.tools.base import ToolContext, redact

FILE_TYPES = ("parquet", "csv", "json")


def resolve_file(path: Any, ctx: ToolContext) -> Path:
    """The file a file end names (`file://` allowed; relative to the playbook's folder),
    checked against the file roots of this process."""
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


def sql_error(exc: Exception, what: str, ctx: ToolContext) -> ToolError:
    """A database error of either end as a ToolError (secrets masked): a lost connection
    or a cancelled statement is retryable, as are serialisation failures and deadlocks."""
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


def pg_connection(spec: Mapping[str, Any], ctx: ToolContext) -> tuple[Any, Any]:
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


def statement_timeout(cursor: Any, ctx: ToolContext) -> None:
    """The step's timeout as the PostgreSQL transaction's statement_timeout."""
    if ctx.timeout:
        cursor.execute(
            "SELECT set_config('statement_timeout', %s, true)",
            (str(max(1, int(ctx.timeout * 1000))),),
        )


def duckdb_path(spec: Mapping[str, Any], ctx: ToolContext) -> str:
    """The database a duckdb end names (`database` or `connection`), found as a duckdb
    step's."""
    from flowtide.tools.duckdb import _database_path

    return _database_path({"database": spec.get("database") or spec.get("connection")}, ctx)
