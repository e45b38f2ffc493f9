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
This module also hosts driver-free helpers the SQL tools share: `split_sql`, `mask_sql`,
and `read_params`. Row values become JSON by the rules every tool's results follow
(`flowtide.jsonvalues`, README "Results as JSON").
"""

from __future__ import annotations

import atexit
import re
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from flowtide.errors import ToolError
from flowtide.jsonvalues import records
from flowtide.tools.base import ToolContext, redact

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["PostgresTool", "close_pools", "mask_sql", "read_params", "split_sql"]

# Defaults for the per-DSN pool; a task's `pool:` mapping can override them when it is the
# first task to use that DSN (pools are shared, so later settings cannot resize them).
DEFAULT_POOL_MAX_SIZE = 10
DEFAULT_POOL_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 10

# ---------------------------------------------------------------------------------------
# Statement splitting
# ---------------------------------------------------------------------------------------

# `$tag$` opens a dollar-quoted string; the tag follows identifier rules and cannot start
# with a digit, which is what keeps positional parameters such as `$1` out of it.
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$")


def _is_ident_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_$"


def mask_sql(script: str) -> str:
    """`script` with everything that is not SQL code blanked out, at the same offsets.

    Comments become spaces (newlines kept); the insides of single-quoted strings (including
    `E'...'` with backslash escapes), double-quoted identifiers and dollar-quoted bodies
    become `_`, their delimiters stay. A search for `;` or `$1` in the result finds only
    the ones PostgreSQL would read as code.
    """
    out = list(script)
    n = len(script)

    def blank(begin: int, end: int, fill: str) -> None:
        for k in range(begin, min(end, n)):
            if out[k] != "\n":
                out[k] = fill

    i = 0
    while i < n:
        ch = script[i]
        if ch == "-" and script.startswith("--", i):
            newline = script.find("\n", i)
            end = n if newline < 0 else newline
            blank(i, end, " ")
            i = end
            continue
        if ch == "/" and script.startswith("/*", i):
            # PostgreSQL block comments nest, unlike C's.
            begin = i
            depth = 1
            i += 2
            while i < n and depth:
                if script.startswith("/*", i):
                    depth += 1
                    i += 2
                elif script.startswith("*/", i):
                    depth -= 1
                    i += 2
                else:
                    i += 1
            blank(begin, i, " ")
            continue
        if ch == "'":
            prev = script[i - 1] if i else ""
            before = script[i - 2] if i > 1 else ""
            backslash_escapes = prev in "eE" and not _is_ident_char(before)
            begin = i + 1
            i += 1
            while i < n:
                c = script[i]
                if backslash_escapes and c == "\\":
                    i += 2
                    continue
                if c == "'":
                    if i + 1 < n and script[i + 1] == "'":
                        i += 2
                        continue
                    break
                i += 1
            blank(begin, i, "_")
            i += 1
            continue
        if ch == '"':
            begin = i + 1
            i += 1
            while i < n:
                if script[i] == '"':
                    if i + 1 < n and script[i + 1] == '"':
                        i += 2
                        continue
                    break
                i += 1
            blank(begin, i, "_")
            i += 1
            continue
        if ch == "$" and not (i and _is_ident_char(script[i - 1])):
            match = _DOLLAR_TAG.match(script, i)
            if match:
                tag = match.group(0)
                close = script.find(tag, match.end())
                blank(match.end(), n if close < 0 else close, "_")
                i = n if close < 0 else close + len(tag)
                continue
        i += 1
    return "".join(out)


def split_sql(script: str) -> list[str]:
    """Split a SQL script into statements on top-level semicolons.

    Semicolons inside single-quoted strings (including `E'...'` with backslash escapes),
    double-quoted identifiers, dollar-quoted bodies (`$$...$$`, `$tag$...$tag$`), `--` line
    comments and (nested) `/* */` block comments do not split. Pieces holding nothing but
    whitespace and comments are dropped; each statement is returned stripped, without its
    trailing semicolon.
    """
    masked = mask_sql(script)
    statements: list[str] = []
    start = 0
    for end in [*(m.start() for m in re.finditer(";", masked)), len(script)]:
        if masked[start:end].strip():
            statements.append(script[start:end].strip())
        start = end + 1
    return statements


# ---------------------------------------------------------------------------------------
# Bind parameters
# ---------------------------------------------------------------------------------------

# `params:` is how a value reaches SQL: handed to the driver, never pasted into the text,
# so a quote in a value cannot end a literal and start a statement of its own.
# What NoETL does (checked in its public source): the Python postgres tool
# (noetl/noetl, noetl/tools/postgres/command.py) has no parameters at all; it renders
# templates into the SQL after doubling single quotes in `with:` values. The newer Rust
# tool runner (noetl/tools, src/tools/postgres.rs) takes `params: [...]` bound to
# `$1..$n`, and sends a command that has params as one statement (splitting only
# commands without them). flowtide accepts that list-with-`$n` form, and psycopg's own:
# a mapping for `%(name)s`, a list for `%s`.
_NUMBERED = re.compile(r"(?<![\w$])\$([0-9]+)")


def read_params(
    config: Mapping[str, Any], tool: str, step: str
) -> list[Any] | dict[str, Any] | None:
    """The task's `params`: a list (positional placeholders), a mapping with string keys
    (named placeholders), or None when the task has none.

    Raises:
        ToolError: kind "config_error" for any other shape.
    """
    raw = config.get("params")
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        bad = [repr(k) for k in raw if not isinstance(k, str) or not k]
        if bad:
            raise ToolError(
                f"step '{step}': {tool} `params` keys must be placeholder names, "
                f"not {', '.join(bad)}",
                kind="config_error",
            )
        return dict(raw)
    if isinstance(raw, list | tuple):
        return list(raw)
    raise ToolError(
        f"step '{step}': {tool} `params` must be a list (positional placeholders) or a "
        f"mapping (named placeholders), not {type(raw).__name__}",
        kind="config_error",
    )


def _adapt(value: Any) -> Any:
    """A rendered value as psycopg should send it: mappings (and lists holding any) as
    jsonb, which psycopg does not do by itself; other lists as arrays (`= ANY(%s)`)."""
    from psycopg.types.json import Jsonb

    if isinstance(value, Mapping):
        return Jsonb(dict(value))
    if isinstance(value, list | tuple):
        if any(isinstance(item, Mapping) for item in value):
            return Jsonb(list(value))
        return [_adapt(item) for item in value]
    return value


def _numbered_to_named(
    statement: str, index: int, values: list[Any], step: str
) -> tuple[str, dict[str, Any]]:
    """Rewrite `$n` placeholders as psycopg's `%(n)s` (and every `%` as `%%`, which
    psycopg then reads back as one `%`), binding each to `values[n - 1]`."""
    parts: list[str] = []
    bound: dict[str, Any] = {}
    last = 0
    for match in _NUMBERED.finditer(mask_sql(statement)):
        number = int(match.group(1))
        if not 1 <= number <= len(values):
            raise ToolError(
                f"step '{step}': postgres statement {index} (command_{index}) uses "
                f"${number} but `params` has {len(values)} value(s)",
                kind="config_error",
            )
        parts.append(statement[last : match.start()].replace("%", "%%"))
        parts.append(f"%({number})s")
        bound[str(number)] = values[number - 1]
        last = match.end()
    parts.append(statement[last:].replace("%", "%%"))
    return "".join(parts), bound


def _bind(
    statements: list[str], params: list[Any] | dict[str, Any] | None, step: str
) -> list[tuple[str, Any]]:
    """(SQL, driver parameters) per statement; parameters are None without `params`."""
    if params is None:
        return [(statement, None) for statement in statements]
    if isinstance(params, dict):
        # Every statement gets the whole mapping: each uses the names it needs (psycopg
        # ignores the others), so one command can create, insert and select.
        named = {key: _adapt(value) for key, value in params.items()}
        return [(statement, named) for statement in statements]
    values = [_adapt(value) for value in params]
    if any(_NUMBERED.search(mask_sql(statement)) for statement in statements):
        return [
            _numbered_to_named(statement, index, values, step)
            for index, statement in enumerate(statements)
        ]
    if len(statements) > 1:
        raise ToolError(
            f"step '{step}': postgres `params` is a list, which binds the %s placeholders of "
            f"one statement, and `command` has {len(statements)} statements: use a mapping "
            "(%(name)s placeholders, shared by every statement) or $1..$n",
            kind="config_error",
        )
    return [(statements[0], values)]


# ---------------------------------------------------------------------------------------
# Connection info
# ---------------------------------------------------------------------------------------

_KV_DSN = re.compile(r"^\s*[A-Za-z_]+\s*=")
_FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "host": ("host", "hostname", "server"),
    "port": ("port",),
    "user": ("user", "username"),
    "password": ("password",),
    "dbname": ("database", "dbname", "db"),
    "sslmode": ("sslmode",),
}


def _looks_like_dsn(text: str) -> bool:
    return text.startswith(("postgresql://", "postgres://")) or bool(_KV_DSN.match(text))


def _resolve_alias(alias: str, ctx: ToolContext) -> dict[str, Any]:
    return ctx.resolve_credential(alias)


def _connection_source(config: Mapping[str, Any], ctx: ToolContext) -> str | dict[str, Any]:
    """Return a DSN string or a mapping of connection fields for this task."""
    ref = None
    for key in ("auth", "credential", "dsn", "connection_string"):
        if config.get(key) not in (None, ""):
            ref = config[key]
            break
    if ref is None:
        raise ToolError(
            "postgres task needs `auth` (a credential alias or a DSN) to know which server to use",
            kind="config_error",
        )
    if isinstance(ref, str):
        ref = ref.strip()
        if _looks_like_dsn(ref):
            ctx.add_secret(ref)
            return ref
        return _resolve_alias(ref, ctx)
    if isinstance(ref, Mapping):
        body = dict(ref)
        # NoETL v2 also writes `auth: {credential: alias}` / `{key: alias}`: resolve the alias
        # and let inline fields override what it holds.
        alias = body.get("credential") or body.get("key") or body.get("alias")
        if isinstance(alias, str) and alias:
            resolved = _resolve_alias(alias, ctx)
            resolved.update(
                {k: v for k, v in body.items() if k not in ("credential", "key", "alias")}
            )
            body = resolved
        return body
    raise ToolError(
        f"postgres `auth` must be a credential alias, a DSN or a mapping, not {type(ref).__name__}",
        kind="config_error",
    )


def _build_conninfo(source: str | dict[str, Any], ctx: ToolContext) -> str:
    """Turn a DSN or field mapping into a libpq conninfo string; registers the secrets."""
    from psycopg import conninfo as pg_conninfo

    try:
        if isinstance(source, str):
            dsn = source
            params = pg_conninfo.conninfo_to_dict(dsn)
        else:
            dsn = ""
            for key in ("dsn", "connection_string", "url"):
                value = source.get(key)
                if isinstance(value, str) and value:
                    dsn = value
                    break
            if dsn:
                ctx.add_secret(dsn)
                params = pg_conninfo.conninfo_to_dict(dsn)
            else:
                params = {}
                for target, names in _FIELD_ALIASES.items():
                    for name in names:
                        if source.get(name) not in (None, ""):
                            params[target] = str(source[name])
                            break
        password = params.get("password")
        if password is not None:
            ctx.add_secret(str(password))
        extra: dict[str, Any] = {}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT
        if "application_name" not in params:
            extra["application_name"] = "flowtide"
        if dsn:
            conninfo = pg_conninfo.make_conninfo(dsn, **extra)
        else:
            conninfo = pg_conninfo.make_conninfo("", **params, **extra)
    except ToolError:
        raise
    except Exception as exc:  # psycopg.ProgrammingError for a malformed DSN, among others
        raise ToolError(
            "invalid postgres connection info: " + redact(str(exc), ctx.secrets),
            kind="config_error",
        ) from None
    ctx.add_secret(conninfo)
    return conninfo


# ---------------------------------------------------------------------------------------
# Pools
# ---------------------------------------------------------------------------------------

_pools: dict[str, ConnectionPool] = {}
_creation_locks: dict[str, threading.Lock] = {}
_registry_lock = threading.Lock()
_atexit_registered = False


def close_pools() -> None:
    """Close every pooled PostgreSQL connection (called at exit; tests call it too)."""
    with _registry_lock:
        pools = list(_pools.values())
        _pools.clear()
        _creation_locks.clear()
    for pool in pools:
        try:
            pool.close(timeout=5.0)
        except Exception:  # closing at exit must never raise
            pass


def pool_count() -> int:
    """Number of open per-DSN pools (for diagnostics and tests)."""
    with _registry_lock:
        return len(_pools)


def _connect_error(exc: Exception, secrets: set[str]) -> ToolError:
    """Map a failure to connect into a ToolError (auth vs connection)."""
    message = redact(str(exc).strip(), secrets)
    sqlstate = getattr(exc, "sqlstate", None)
    lowered = message.lower()
    if (sqlstate or "").startswith("28") or any(
        marker in lowered
        for marker in ("password authentication failed", "no pg_hba.conf entry", "password is")
    ):
        return ToolError(
            f"postgres authentication failed: {message}", kind="auth", code=sqlstate or "28000"
        )
    if sqlstate == "3D000" or "does not exist" in lowered:
        return ToolError(f"postgres connection failed: {message}", kind="connection", code=sqlstate)
    return ToolError(
        f"postgres connection failed: {message}",
        kind="connection",
        retryable=True,
        code=sqlstate or "08001",
    )


def _pool_for(conninfo: str, pool_config: Mapping[str, Any], ctx: ToolContext) -> ConnectionPool:
    """Return the shared pool for `conninfo`, creating it after a probe connection."""
    global _atexit_registered
    import psycopg
    from psycopg_pool import ConnectionPool

    with _registry_lock:
        pool = _pools.get(conninfo)
        if pool is not None:
            return pool
        creation_lock = _creation_locks.setdefault(conninfo, threading.Lock())
    # One creator per DSN: the first of 100 parallel iterations probes and builds the pool,
    # the other 99 wait here and then reuse it.
    with creation_lock:
        with _registry_lock:
            pool = _pools.get(conninfo)
            if pool is not None:
                return pool
        # Probe first: a pool retries failed connects in the background and only reports a
        # bare timeout, which would hide "password authentication failed" for 30 s.
        try:
            psycopg.connect(conninfo).close()
        except psycopg.Error as exc:
            raise _connect_error(exc, ctx.secrets) from None
        max_size = int(pool_config.get("max_size") or DEFAULT_POOL_MAX_SIZE)
        min_size = min(int(pool_config.get("min_size") or 0), max_size)
        pool = ConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            timeout=float(pool_config.get("timeout") or DEFAULT_POOL_TIMEOUT),
            max_waiting=int(pool_config.get("max_waiting") or 0),
            # Validates an idle connection before handing it out, so a server restart costs
            # a reconnect instead of a failed task.
            check=ConnectionPool.check_connection,
            name=f"flowtide-pg-{len(_pools) + 1}",
            open=False,
        )
        pool.open(wait=False)
        with _registry_lock:
            _pools[conninfo] = pool
            if not _atexit_registered:
                atexit.register(close_pools)
                _atexit_registered = True
        return pool


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


def _statements_from(config: Mapping[str, Any]) -> list[str]:
    source = None
    for key in ("command", "query", "commands", "sql"):
        if config.get(key) not in (None, ""):
            source = config[key]
            break
    if source is None:
        raise ToolError(
            "postgres task has no SQL: set `command` (or `query`) on the tool",
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

        Config: `command` | `query` (str or list of str), `auth` | `credential` (alias,
        mapping or DSN), optional `params` (a mapping for `%(name)s`, a list for `%s` in
        a single statement or `$1..$n` in any), optional
        `pool: {max_size, min_size, timeout, max_waiting}`.
        Raises ToolError kind `sql_error` (code = SQLSTATE), `auth`, `connection`,
        `timeout`, `credential` or `config_error` (also for `params` that do not fit).
        """
        statements = _statements_from(config)
        params = read_params(config, "postgres", ctx.step)
        try:
            import psycopg
            from psycopg_pool import PoolTimeout
        except ImportError:
            raise ToolError(
                "the postgres tool needs psycopg: pip install 'flowtide[postgres]'",
                kind="config_error",
            ) from None
        bound = _bind(statements, params, ctx.step)

        conninfo = _build_conninfo(_connection_source(config, ctx), ctx)
        pool_config = config.get("pool") if isinstance(config.get("pool"), Mapping) else {}
        pool = _pool_for(conninfo, cast(Mapping[str, Any], pool_config), ctx)

        try:
            conn = pool.getconn()
        except PoolTimeout as exc:
            raise ToolError(
                f"postgres: no pooled connection became available ({redact(str(exc), ctx.secrets)})",
                kind="connection",
                retryable=True,
                code="POOL_TIMEOUT",
            ) from None
        except psycopg.Error as exc:
            raise _connect_error(exc, ctx.secrets) from None

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
