"""The `postgres` tool: run a SQL script against PostgreSQL with psycopg 3.

A task names its SQL in `command` (or `query`) and its server in `auth` (or `credential`):
either a credential alias, an inline connection mapping or a DSN string. The script is
split into statements (quotes, dollar quoting and comments respected), which all run in one
transaction on a pooled connection. The result is NoETL's superset shape::

    {"command_0": {"columns": [...], "rows": [{...}], "row_count": n, "status": "ok"},
     "command_1": {...},
     "columns": [...], "rows": [...], "row_count": n}   # last statement that returned rows

Values reach the SQL through `params` (bind parameters the driver sends apart from the
text): a mapping for `%(name)s` placeholders, shared by every statement of the command,
or a list for `%s` in a one-statement command or for `$1..$n` in any.

psycopg is imported lazily: it is an optional dependency and costs start-up time.
Row values become JSON by the rules every tool's results follow (`flowtide.jsonvalues`,
README "Results as JSON").

The parts: statement splitting in `postgres_sql`, `params` binding in `postgres_params`,
connection info, credentials and the per-DSN pools in `postgres_conn`; this module runs
the statements in their transaction, maps their errors and shapes the result. The
driver-free helpers the SQL tools share, `split_sql`, `mask_sql` and `read_params`, are
importable from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from flowtide.errors import ToolError
from flowtide.jsonvalues import records
from flowtide.tools.base import ToolContext, redact
from flowtide.tools.postgres_conn import DEFAULT_POOL_MAX_SIZE as DEFAULT_POOL_MAX_SIZE
from flowtide.tools.postgres_conn import (
    _build_conninfo,
    _checkout,
    _connection_source,
    _pool_for,
    close_pools,
)
from flowtide.tools.postgres_conn import pool_count as pool_count
from flowtide.tools.postgres_params import _bind, read_params
from flowtide.tools.postgres_sql import mask_sql, split_sql
from flowtide.tools.script_source import load_script

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresTool", "close_pools", "mask_sql", "read_params", "split_sql"]

# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def _snippet(statement: str, limit: int = 160) -> str:
    text = " ".join(statement.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _statement_error(
    exc: psycopg.Error, index: int, statement: str, secrets: set[str]
) -> ToolError:
    """Map a failure while running statement `index` to a ToolError."""
    import psycopg

    sqlstate = exc.sqlstate
    diag = exc.diag
    primary = diag.message_primary or str(exc).strip() or type(exc).__name__
    parts = [f"postgres statement {index} (command_{index}) failed"]
    parts[0] += f" [{sqlstate}]: {primary}" if sqlstate else f": {primary}"
    if diag.message_detail:
        parts.append(f"DETAIL: {diag.message_detail}")
    if diag.message_hint:
        parts.append(f"HINT: {diag.message_hint}")
    parts.append(f"statement: {_snippet(statement)}")
    message = redact("\n".join(parts), secrets)

    state = sqlstate or ""
    if (
        state.startswith(("08", "57P"))
        or state == "53300"
        or (not state and isinstance(exc, psycopg.OperationalError))
    ):
        return ToolError(message, kind="connection", retryable=True, code=sqlstate)
    if state.startswith("28"):
        return ToolError(message, kind="auth", code=sqlstate)
    if state == "57014":  # query_canceled: our statement_timeout fired
        return ToolError(message, kind="timeout", retryable=True, code=sqlstate)
    # Serialization failures and deadlocks succeed when the transaction is simply rerun.
    retryable = state in ("40001", "40P01")
    return ToolError(message, kind="sql_error", retryable=retryable, code=sqlstate)


# ---------------------------------------------------------------------------------------
# The tool
# ---------------------------------------------------------------------------------------


def _statements_from(config: Mapping[str, Any], ctx: ToolContext) -> list[str]:
    source = None
    if config.get("script") not in (None, ""):
        # `script:` before `command:`, as NoETL reads them (`flowtide.tools.script_source`).
        source, _ = load_script(
            config["script"], ctx.base_dir, tool="postgres", step=ctx.step, kind="config_error"
        )
    for key in ("command", "query", "commands", "sql"):
        if source is None and config.get(key) not in (None, ""):
            source = config[key]
            break
    if source is None:
        raise ToolError(
            "postgres task has no SQL: set `command` (or `query`, or `script`) on the tool",
            kind="config_error",
        )
    scripts = source if isinstance(source, list) else [source]
    statements: list[str] = []
    for script in scripts:
        if not isinstance(script, str):
            raise ToolError(
                f"postgres `command` must be a string or a list of strings, "
                f"not {type(script).__name__}",
                kind="config_error",
            )
        statements.extend(split_sql(script))
    if not statements:
        raise ToolError(
            "postgres `command` holds no SQL statement (only whitespace or comments)",
            kind="config_error",
        )
    return statements


def _collect(cursor: psycopg.Cursor[Any], index: int) -> dict[str, Any]:
    if cursor.description is None:
        return {
            "columns": [],
            "rows": [],
            "row_count": max(cursor.rowcount, 0),
            "status": "ok",
        }
    columns = [column.name for column in cursor.description]
    rows = records(
        columns, cursor.fetchall(), root=f"result['command_{index}']['rows']", kind="sql_error"
    )
    return {"columns": columns, "rows": rows, "row_count": len(rows), "status": "ok"}


class PostgresTool:
    """Run a SQL script on PostgreSQL in one transaction (tool kind `postgres`)."""

    kind = "postgres"

    def run(self, config: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Execute every statement of `command`/`query` and return the per-statement results.

        Config: `command` | `query` (str or list of str) or `script` (a file: `{uri,
        source: {type: file}}`, found as python's are), `auth` | `credential` (alias,
        mapping or DSN), optional `params` (a mapping for `%(name)s`, a list for `%s` in
        a single statement or `$1..$n` in any), optional
        `pool: {max_size, min_size, timeout, max_waiting}`.
        Raises ToolError kind `sql_error` (code = SQLSTATE), `auth`, `connection`,
        `timeout`, `credential` or `config_error` (also for `params` that do not fit).
        """
        statements = _statements_from(config, ctx)
        params = read_params(config, "postgres", ctx.step)
        try:
            import psycopg
        except ImportError:
            raise ToolError(
                "the postgres tool needs psycopg: pip install 'flowtide[postgres]'",
                kind="config_error",
            ) from None
        bound = _bind(statements, params, ctx.step)

        conninfo = _build_conninfo(_connection_source(config, ctx), ctx)
        pool_config = config.get("pool") if isinstance(config.get("pool"), Mapping) else {}
        pool = _pool_for(conninfo, cast(Mapping[str, Any], pool_config), ctx)

        conn = _checkout(pool, ctx)

        notice_handler = _notice_collector(ctx)
        conn.add_notice_handler(notice_handler)
        results: dict[str, Any] = {}
        index = -1
        try:
            try:
                with conn.cursor() as cursor:
                    if ctx.timeout:
                        # SET LOCAL semantics (is_local=true): the limit dies with this
                        # transaction, so it never leaks to the next user of the connection.
                        cursor.execute(
                            "SELECT set_config('statement_timeout', %s, true)",
                            (str(max(1, int(ctx.timeout * 1000))),),
                        )
                    encoding = conn.info.encoding
                    for index, (statement, args) in enumerate(bound):
                        # psycopg types str queries as LiteralString (injection safety); this
                        # is the playbook's own SQL, so hand it over as bytes in the
                        # connection's encoding, exactly what psycopg would send.
                        cursor.execute(statement.encode(encoding), args)
                        results[f"command_{index}"] = _collect(cursor, index)
                conn.commit()
            except (psycopg.Error, TypeError) as exc:
                _rollback_quietly(conn)
                if index >= 0 and bound[index][1] is not None and _binding_failed(exc):
                    raise _params_error(exc, index, statements[index], ctx) from None
                if isinstance(exc, TypeError):
                    raise
                # index -1: the statement_timeout setup itself failed.
                statement = statements[index] if index >= 0 else "SELECT set_config(...)"
                raise _statement_error(exc, max(index, 0), statement, ctx.secrets) from None
        finally:
            conn.remove_notice_handler(notice_handler)
            pool.putconn(conn)

        # The flat keys repeat the last result set, which is what `{{ step.rows }}` and the
        # policy form `output.data.rows` read.
        per_statement = [results[f"command_{i}"] for i in range(len(statements))]
        with_rows = [r for r in per_statement if r["columns"]]
        last = with_rows[-1] if with_rows else per_statement[-1]
        results["columns"] = last["columns"]
        results["rows"] = last["rows"]
        results["row_count"] = last["row_count"]
        return results


def _binding_failed(exc: BaseException) -> bool:
    """psycopg refused the parameters before sending anything: TypeError for a list
    against named placeholders (or the reverse), a ProgrammingError without SQLSTATE for
    a count mismatch, a missing name, a stray `%` or a value it cannot adapt."""
    import psycopg

    return isinstance(exc, TypeError) or (
        isinstance(exc, psycopg.ProgrammingError) and exc.sqlstate is None
    )


def _params_error(exc: BaseException, index: int, statement: str, ctx: ToolContext) -> ToolError:
    message = str(exc).strip()
    hint = ""
    if "allowed as placeholders" in message:
        hint = "; with `params`, psycopg reads every % in the SQL: write a literal % as %%"
    return ToolError(
        redact(
            f"step '{ctx.step}': postgres statement {index} (command_{index}): `params` "
            f"do not fit its placeholders: {message}{hint}\nstatement: {_snippet(statement)}",
            ctx.secrets,
        ),
        kind="config_error",
    )


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.rollback()
    except Exception:  # a broken connection cannot roll back; the pool will discard it
        pass


def _notice_collector(ctx: ToolContext) -> Callable[[Any], None]:
    """A notice handler that forwards RAISE NOTICE output to the task's captured stdout."""

    def handle(diagnostic: Any) -> None:
        ctx.stdout.append(f"{diagnostic.severity}: {diagnostic.message_primary}\n")

    return handle
