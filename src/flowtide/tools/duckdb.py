"""The `duckdb` tool: run a SQL script on an in-memory or file DuckDB database.

The result is the rows of the last statement that returned rows, as a list of row dicts
(`duckdb_test.yaml` reads `{{ start }}` as that list); a script whose statements return no
rows gives `[]`. Values become JSON by the rules every tool's results follow
(`flowtide.jsonvalues`, README "Results as JSON"). Values reach the SQL through `params`, bound by duckdb and never pasted:
a mapping for `$name` placeholders (each statement takes the names it uses), or a list
for `$1..$n` in any statement or `?` in a one-statement script. duckdb is imported inside
`run`: it is a heavy import and most playbooks never touch it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowtide.errors import ToolError
from flowtide.jsonvalues import records
from flowtide.tools import files
from flowtide.tools.base import ToolContext, redact
from flowtide.tools.postgres import mask_sql, read_params

__all__ = ["DuckDBTool"]

_MEMORY = frozenset({"", ":memory:", "memory"})
# Statement kinds whose result is real rows even when shaped like a bare count.
_ROW_TYPES = frozenset({"SELECT", "EXPLAIN", "PRAGMA", "CALL", "EXECUTE", "RELATION"})


def _scripts(config: Mapping[str, Any]) -> list[str]:
    source = None
    for key in ("query", "command", "commands", "sql"):
        if config.get(key) not in (None, "", []):
            source = config[key]
            break
    if source is None:
        raise ToolError(
            "duckdb task has no SQL: set `query`, `command` or `commands`", kind="config_error"
        )
    scripts = source if isinstance(source, list) else [source]
    for script in scripts:
        if not isinstance(script, str):
            raise ToolError(
                f"duckdb SQL must be a string or a list of strings, not {type(script).__name__}",
                kind="config_error",
            )
    return scripts


def _database_path(config: Mapping[str, Any], ctx: ToolContext) -> str:
    database = config.get("database")
    if database is None or str(database).strip() in _MEMORY:
        return ":memory:"
    text = str(database).strip()
    if text.startswith(":memory:") or text.startswith(("md:", "motherduck:")):
        return text  # named in-memory databases and remote URLs are not paths
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = Path(ctx.base_dir) / path
    files.check(path, what=f"step '{ctx.step}', duckdb `database`")
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)


def connect(database: str, **kwargs: Any) -> Any:
    """A DuckDB connection to `database` that reaches only the files this process's
    steps may use (`flowtide.tools.files`: confined on a worker). Every connection that
    runs a playbook's SQL is opened here."""
    import duckdb

    connection = duckdb.connect(database, **kwargs)
    access = files.current()
    if not access.unconfined:
        try:
            _confine(connection, access)
        except BaseException:
            connection.close()
            raise
    return connection


def _confine(connection: Any, access: files.FileAccess) -> None:
    """Let `connection` reach only `access`'s folders (DuckDB checks every file a query
    opens: read_csv, COPY, ATTACH, extension installs), locked so that no statement can
    undo it."""
    directories, paths = access.duckdb_allowed()
    connection.execute("SET allowed_directories = $1", [directories])
    if paths:
        connection.execute("SET allowed_paths = $1", [paths])
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")


def _returns_rows(statement_type: str, description: list[Any] | None) -> bool:
    if not description:
        return False
    if statement_type in _ROW_TYPES:
        return True
    # DDL and DML without RETURNING report a single BIGINT column named "Count"; that is a
    # status, not a result set the playbook asked for.
    return not (len(description) == 1 and description[0][0] == "Count")


def _statement_args(
    statement: Any,
    index: int,
    params: list[Any] | dict[str, Any] | None,
    step: str,
    statement_count: int,
) -> dict[str, Any] | None:
    """The parameters of one statement, keyed by the names duckdb found in it (`$1` and
    `?` are named "1", "2", ...): duckdb refuses values a statement does not use, so each
    statement gets exactly its own."""
    if params is None:
        return None
    names = sorted(statement.named_parameters)
    positional = [name for name in names if name.isdigit()]
    if isinstance(params, dict):
        if positional and not all(name in params for name in positional):
            raise ToolError(
                f"step '{step}': duckdb statement {index} uses positional placeholders "
                "(? or $1..$n): `params` must be a list for them",
                kind="config_error",
            )
        missing = [name for name in names if name not in params]
        if missing:
            raise ToolError(
                f"step '{step}': duckdb statement {index} uses "
                f"{', '.join('$' + name for name in missing)}, which `params` does not name",
                kind="config_error",
            )
        return {name: params[name] for name in names}
    if len(positional) < len(names):
        raise ToolError(
            f"step '{step}': duckdb statement {index} uses named placeholders "
            f"({', '.join('$' + n for n in names if not n.isdigit())}): `params` must be a "
            "mapping for them",
            kind="config_error",
        )
    if statement_count > 1 and "?" in mask_sql(statement.query):
        # `?` counts from the first value in every statement: which values a second
        # statement meant is anyone's guess.
        raise ToolError(
            f"step '{step}': duckdb `params` is a list, which binds the ? placeholders of one "
            f"statement, and the script has {statement_count}: use a mapping ($name "
            "placeholders, shared by every statement) or $1..$n",
            kind="config_error",
        )
    beyond = [name for name in names if not 1 <= int(name) <= len(params)]
    if beyond:
        raise ToolError(
            f"step '{step}': duckdb statement {index} uses "
            f"{', '.join('$' + n for n in beyond)} but `params` has {len(params)} value(s)",
            kind="config_error",
        )
    return {name: params[int(name) - 1] for name in names}


class DuckDBTool:
    """Run SQL on DuckDB (tool kind `duckdb`)."""

    kind = "duckdb"

    def run(self, config: dict[str, Any], ctx: ToolContext) -> list[dict[str, Any]]:
        """Execute `query` | `command` | `commands` (str or list of str) on `database`.

        `database` is ':memory:' (default) or a file path relative to ctx.base_dir;
        `params` (optional) a mapping for `$name` or a list for `$1..$n` / `?`.
        Returns the last row-returning statement's rows as a list of dicts.
        Raises ToolError kind `sql_error` (statement index in the message), `timeout` when
        ctx.timeout elapses, or `config_error` (also for `params` that do not fit).
        """
        scripts = _scripts(config)
        params = read_params(config, "duckdb", ctx.step)
        database = _database_path(config, ctx)
        try:
            connection = connect(database)
        except Exception as exc:  # duckdb raises several unrelated classes on open
            raise ToolError(
                f"duckdb: cannot open database {database!r}: {redact(str(exc), ctx.secrets)}",
                kind="sql_error",
            ) from None

        # DuckDB has no statement timeout setting; interrupt() from a timer thread is the
        # supported way to abort a running query.
        timer: threading.Timer | None = None
        timed_out = threading.Event()
        if ctx.timeout:

            def interrupt() -> None:
                timed_out.set()
                connection.interrupt()

            timer = threading.Timer(ctx.timeout, interrupt)
            timer.daemon = True
            timer.start()

        rows: list[dict[str, Any]] | None = None
        index = -1
        statement_text = ""
        try:
            statements = []
            for script in scripts:
                try:
                    statements.extend(connection.extract_statements(script))
                except Exception as exc:
                    raise ToolError(
                        f"duckdb: cannot parse SQL: {redact(str(exc), ctx.secrets)}",
                        kind="sql_error",
                    ) from None
            for statement in statements:
                index += 1
                statement_text = statement.query
                args = _statement_args(statement, index, params, ctx.step, len(statements))
                try:
                    cursor = connection.execute(statement, args)
                    description = cursor.description
                    if description and _returns_rows(statement.type.name, description):
                        columns = [column[0] for column in description]
                        rows = records(columns, cursor.fetchall(), root="result", kind="sql_error")
                except Exception as exc:  # every duckdb failure becomes a ToolError
                    if timed_out.is_set():
                        raise ToolError(
                            f"duckdb statement {index} interrupted after {ctx.timeout:g} s",
                            kind="timeout",
                            retryable=True,
                        ) from None
                    snippet = " ".join(statement_text.split())[:160]
                    raise ToolError(
                        redact(
                            f"duckdb statement {index} failed: {exc}\nstatement: {snippet}",
                            ctx.secrets,
                        ),
                        kind="sql_error",
                        code=type(exc).__name__,
                    ) from None
        finally:
            if timer is not None:
                timer.cancel()
            connection.close()
        return rows if rows is not None else []
