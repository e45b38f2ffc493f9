"""Where a postgres task connects, and the connections it gets: its `auth` (a credential
alias, an inline mapping, or a DSN) turned into a libpq conninfo string with every secret
in it registered for redaction, and one shared connection pool per conninfo, created
after a probe connection so that a wrong password is reported at once, closed at exit. A
failure to connect becomes a `ToolError` of kind `auth` or `connection`.
"""

from __future__ import annotations

import atexit
import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext, redact

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

# Defaults for the per-DSN pool; a task's `pool:` mapping can override them when it is the
# first task to use that DSN (pools are shared, so later settings cannot resize them).
DEFAULT_POOL_MAX_SIZE = 10
DEFAULT_POOL_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 10

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


def _checkout(pool: ConnectionPool, ctx: ToolContext) -> Any:
    """A connection of `pool`, a failure to get one as a ToolError (kind connection,
    retryable, for a pool that stays busy; auth or connection for a refused connect)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    try:
        return pool.getconn()
    except PoolTimeout as exc:
        raise ToolError(
            f"postgres: no pooled connection became available ({redact(str(exc), ctx.secrets)})",
            kind="connection",
            retryable=True,
            code="POOL_TIMEOUT",
        ) from None
    except psycopg.Error as exc:
        raise _connect_error(exc, ctx.secrets) from None


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
