"""PostgreSQL adapter of the store port (psycopg 3 with a connection pool).

    store = PostgresStore("postgresql://flowtide:***@127.0.0.1:5432/flowtide")

Per-execution tables (execution, event, command) live in the database of `dsn`; the
cluster-wide tables (catalog, credential, worker, keychain) in the database of
`cluster_dsn`, which defaults to the same one. The schema is versioned per part
(`flowtide.store.pgschema`); a store opened with `migrate=True` (the default) upgrades it,
otherwise it refuses a schema that is not current and names `flowtide db upgrade`.

Connection model: a pool shared by every thread. Each port call borrows one connection
for one transaction, so any number of threads and processes (API servers) write
concurrently; PostgreSQL's row locks and the primary keys keep the batches atomic and
unique. Nothing is cached in the process: two stores on one database see each other's
writes at once, which is what a stateless server needs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Final

from flowtide.errors import NotFoundError, StoreError
from flowtide.sealing import Sealer
from flowtide.store import pgschema
from flowtide.store.pgkeychain import KeychainTables
from flowtide.store.sql import INSERT_EVENT, UPSERT_COMMAND, SQLStore
from flowtide.urls import redact_url, scrub_url

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["PostgresStore", "display_dsn", "is_postgres_url"]

#: Seconds a caller waits for a pooled connection before its call fails (503).
_POOL_WAIT: Final = 10.0
#: Seconds the pool of a moved shard's old address stays open for calls that took it.
_OLD_POOL_GRACE: Final = 30.0
#: Seconds a probe of a database that was down waits for its connection.
_PROBE_TIMEOUT: Final = 3

_SCHEMES: Final = ("postgresql://", "postgres://")


def is_postgres_url(text: str) -> bool:
    """True for a postgresql:// or postgres:// URL (what `--db` treats as PostgreSQL)."""
    return text.startswith(_SCHEMES)


def display_dsn(dsn: str) -> str:
    """`dsn` fit for messages: a URL with its password hidden, or for a key=value DSN
    `postgresql://user@host:port/dbname` built from its parts (never the password)."""
    if is_postgres_url(dsn):
        return redact_url(dsn)
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(dsn)
    except Exception:  # a malformed DSN must still never be echoed with its password
        return "postgresql://(unparsable connection string)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = parts.get("host") or "localhost"
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname') or ''}"


def _password(dsn: str) -> str | None:
    try:
        from psycopg.conninfo import conninfo_to_dict

        value = conninfo_to_dict(dsn).get("password")
    except Exception:
        return None
    return str(value) if value else None


#: INSERT_EVENT over column arrays (in EVENT order), rows inserted in array order.
_INSERT_EVENTS: Final = (
    "INSERT INTO event (execution_id, event_id, type, step, status, payload, error,"
    " parent_event_id, command_id, worker_id, time)"
    " SELECT u.execution_id, u.event_id, u.type, u.step, u.status, u.payload, u.error,"
    " u.parent_event_id, u.command_id, u.worker_id, u.time"
    " FROM unnest(%b::bigint[], %b::bigint[], %b::text[], %b::text[], %b::text[],"
    " %b::text[], %b::text[], %b::bigint[], %b::bigint[], %b::text[], %b::float8[])"
    " WITH ORDINALITY AS u(execution_id, event_id, type, step, status, payload, error,"
    " parent_event_id, command_id, worker_id, time, n) ORDER BY u.n"
)
#: UPSERT_COMMAND over column arrays (distinct command ids), by whether the rows give
#: an attempt (True: the update sets it; False: inserted as 1, the row's kept on update).
_UPSERT_COMMANDS_SQL: Final = (
    "INSERT INTO command (command_id, execution_id, step, status, attempt, loop_instance,"
    " loop_index, worker_id, payload, created, updated)"
    " SELECT u.command_id, u.execution_id, u.step, u.status, COALESCE(u.attempt, 1),"
    " u.loop_instance, u.loop_index, u.worker_id, u.payload, u.created, u.updated"
    " FROM unnest(%b::bigint[], %b::bigint[], %b::text[], %b::text[], %b::integer[],"
    " %b::bigint[], %b::bigint[], %b::text[], %b::text[], %b::float8[], %b::float8[])"
    " AS u(command_id, execution_id, step, status, attempt, loop_instance, loop_index,"
    " worker_id, payload, created, updated)"
    " ON CONFLICT (command_id) DO UPDATE SET"
    " status = excluded.status,"
    " {attempt}"
    " worker_id = CASE WHEN excluded.status = 'issued' THEN excluded.worker_id"
    " ELSE COALESCE(excluded.worker_id, command.worker_id) END,"
    " payload = COALESCE(excluded.payload, command.payload),"
    " updated = excluded.updated"
)
_UPSERT_COMMANDS: Final = {
    True: _UPSERT_COMMANDS_SQL.format(attempt="attempt = excluded.attempt,"),
    False: _UPSERT_COMMANDS_SQL.format(attempt=""),
}

#: A connection back in the pool for less than this is handed out without the check's
#: round trip (under load that round trip was one in four of a step's).
_CHECK_AFTER_IDLE = 2.0


def _mark_returned(conn: psycopg.Connection) -> None:
    conn._flowtide_returned = time.monotonic()  # type: ignore[attr-defined]


def _check_idle(conn: psycopg.Connection) -> None:
    """The pool's check: a connection idle for a while is probed with an empty query (a
    broken one is replaced instead of handed out); a closed one always fails."""
    import psycopg
    from psycopg_pool import ConnectionPool

    if conn.closed:
        raise psycopg.OperationalError("connection is closed")
    returned = getattr(conn, "_flowtide_returned", None)
    if returned is None or time.monotonic() - returned > _CHECK_AFTER_IDLE:
        ConnectionPool.check_connection(conn)


class PostgresStore(SQLStore, KeychainTables):
    """The store port on PostgreSQL; usable from any number of threads."""

    #: Its outbox rows go with an execution too.
    GC_TABLES: ClassVar[tuple[str, ...]] = (
        "event",
        "command",
        "execution_summary",
        "notification",
        "outbox",
    )

    PARAM = "%s"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    LOCK_EXECUTION = True
    SEALED_TABLES = ("credential", "keychain")

    def __init__(
        self,
        dsn: str,
        *,
        cluster_dsn: str | None = None,
        min_size: int = 1,
        max_size: int = 8,
        migrate: bool = True,
        connect_timeout: float = 10.0,
        sealer: Sealer | None = None,
    ) -> None:
        """Connect, and upgrade (`migrate=True`) or check the schema.

        Args:
            dsn: database of the per-execution tables (URL or key=value string).
            cluster_dsn: database of the cluster-wide tables; None for `dsn`'s.
            min_size: connections each pool keeps open.
            max_size: connections each pool opens at most (concurrent port calls).
            migrate: apply pending schema migrations; False only checks the version.
            connect_timeout: seconds to wait for the first connection.
            sealer: seals what holds a secret (default: the master key of
                $FLOWTIDE_HOME or ./.flowtide, or FLOWTIDE_MASTER_KEY: the server's vault's).
        Raises:
            StoreError: the database cannot be reached (the message shows the DSN without
                its password), or its schema is newer than this flowtide, or older and
                `migrate` is False.
        """
        try:
            import psycopg  # noqa: F401  (fail early with a clear message)
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise StoreError(
                "the PostgreSQL store needs psycopg 3 and psycopg-pool: "
                "pip install 'flowtide[postgres]'"
            ) from exc
        self.dsn_display = display_dsn(dsn)
        if sealer is None:
            from flowtide.home import find_home
            from flowtide.settings import HomeSection, read

            sealer = Sealer(find_home(read(HomeSection).home))
        self.sealer = sealer
        self._secrets = {s for s in (_password(dsn), _password(cluster_dsn or "")) if s}
        self._dsns = {"shard": dsn, "cluster": cluster_dsn or dsn}
        self._lock = threading.Lock()
        self._closed = False
        self._sizes = (min_size, max_size, connect_timeout)
        #: When each part's database last failed to give a connection (monotonic).
        self._down: dict[str, float] = {}
        separate = cluster_dsn is not None and cluster_dsn != dsn
        self._pools: dict[str, ConnectionPool] = {}
        try:
            shard_pool = self._open_pool(ConnectionPool, dsn, min_size, max_size, connect_timeout)
            self._pools["shard"] = shard_pool
            if separate:
                assert cluster_dsn is not None
                self._pools["cluster"] = self._open_pool(
                    ConnectionPool, cluster_dsn, min_size, max_size, connect_timeout
                )
            else:
                self._pools["cluster"] = shard_pool
            self._prepare_schema(migrate, separate)
        except BaseException:
            self._close_pools()
            raise

    def __repr__(self) -> str:
        return f"PostgresStore({self.dsn_display!r})"

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for dsn in self._dsns.values():
            text = scrub_url(text, dsn)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _open_pool(
        self, pool_class: type[ConnectionPool], dsn: str, lo: int, hi: int, timeout: float
    ) -> ConnectionPool:
        pool = pool_class(
            dsn,
            min_size=lo,
            max_size=max(lo, hi),
            open=False,
            name="flowtide-store",
            # How long a caller waits for a connection (psycopg_pool's default is 30 s).
            timeout=_POOL_WAIT,
            # A connection broken by a server restart is replaced instead of handed out.
            check=_check_idle,
            reset=_mark_returned,
        )
        try:
            pool.open(wait=True, timeout=timeout)
        except Exception as exc:
            pool.close()
            raise StoreError(
                f"{display_dsn(dsn)}: cannot connect to PostgreSQL: "
                f"{self._scrub(str(exc)) or type(exc).__name__}"
            ) from exc
        return pool

    def _prepare_schema(self, migrate: bool, separate: bool) -> None:
        import psycopg

        parts = [("shard", [pgschema.SHARD])]
        if separate:
            parts.append(("cluster", [pgschema.CLUSTER]))
        else:
            parts[0][1].append(pgschema.CLUSTER)
        for name, components in parts:
            where = display_dsn(self._dsns[name])
            try:
                with self._pools[name].connection() as conn:
                    if migrate:
                        conn.commit()  # upgrade() runs its own transactions
                        pgschema.upgrade(conn, components, where=where)
                    else:
                        pgschema.check_current(conn, components, where=where)
            except psycopg.Error as exc:
                raise StoreError(f"{where}: {self._scrub(str(exc))}") from exc

    def _close_pools(self) -> None:
        for pool in {id(p): p for p in self._pools.values()}.values():
            pool.close()

    def pool(self, part: str = "shard") -> ConnectionPool:
        """The connection pool of "shard" or "cluster" (for callers that manage their own
        transactions across awaits, like the server's coordinator)."""
        if self._closed:
            raise StoreError(f"{self.dsn_display}: store is closed")
        return self._pools[part]

    def getconn(self, pool: ConnectionPool, part: str = "shard") -> psycopg.Connection:
        """A connection of `pool` (what `pool(part)` gave) for a caller that gives it
        back itself (`pool.putconn`), across awaits; called in a worker thread.

        While the database is known down, a probe first: each call fails at once instead
        of holding a thread and a step slot for the pool's 10 s wait, and the worker's
        request with them (a worker's reports of other shards waited behind it).

        Raises:
            StoreError: no connection (the database is down, or the pool had none free).
        """
        import psycopg
        from psycopg_pool import PoolTimeout

        if part in self._down:
            self._probe(part)
        try:
            return pool.getconn()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            self._down[part] = time.monotonic()
            raise StoreError(f"{self.dsn_display}: {self._scrub(str(exc)).strip()}") from exc

    @contextmanager
    def transaction(self, op: str, part: str = "shard") -> Iterator[psycopg.Connection]:
        """One transaction on a pooled connection; commit on success, roll back on error.

        `part` is "shard" (per-execution tables) or "cluster". Driver errors become
        StoreError naming `op`; the server runtime uses this for its own statements.
        """
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        if self._closed:
            raise StoreError(f"{self.dsn_display}: store is closed")
        if part in self._down:
            self._probe(part)
        try:
            with self._pools[part].connection() as conn:
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            self._down[part] = time.monotonic()
            raise StoreError(f"{op}: {self._scrub(str(exc)).strip()}") from exc
        except (psycopg.Error, OverflowError) as exc:
            raise StoreError(f"{op}: {self._scrub(str(exc)).strip()}") from exc
        except PoolClosed as exc:
            raise StoreError(f"{self.dsn_display}: store is closed") from exc

    def move_shard(self, dsn: str) -> None:
        """Use the shard's database at a new address (the shard map moved it): a pool
        on `dsn` is opened and its schema checked first; calls already running finish on
        the old pool's connections, which are closed as they come back.

        Raises:
            StoreError: `dsn` cannot be reached or its schema is not current; the store
                then keeps the database it had.
        """
        from psycopg_pool import ConnectionPool

        if self._pools["shard"] is self._pools["cluster"]:
            raise StoreError("a one-database store cannot move its shard apart from the cluster's")
        lo, hi, timeout = self._sizes
        new = self._open_pool(ConnectionPool, dsn, lo, hi, timeout)
        where = display_dsn(dsn)
        try:
            import psycopg

            with new.connection() as conn:
                pgschema.check_current(conn, [pgschema.SHARD], where=where)
        except (psycopg.Error, StoreError) as exc:
            new.close()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"{where}: {self._scrub(str(exc))}") from exc
        with self._lock:
            old = self._pools["shard"]
            self._pools["shard"] = new
            self._dsns["shard"] = dsn
            password = _password(dsn)
            if password:
                self._secrets.add(password)
            self.dsn_display = where
            self._down.pop("shard", None)
        # Closed a while later: a call that took the old pool just before the swap still
        # gets its connection from it.
        closer = threading.Timer(_OLD_POOL_GRACE, old.close)
        closer.daemon = True
        closer.start()

    def _probe(self, part: str) -> None:
        """After a database failed to give a connection: a fresh connection first, so
        that while it is down each call fails at once (a refused connect) rather than
        after the pool's wait. Back, and the pool is used as before.

        Raises:
            StoreError: the database still cannot be reached.
        """
        import psycopg

        dsn = self._dsns[part]
        try:
            psycopg.connect(dsn, connect_timeout=_PROBE_TIMEOUT).close()
        except psycopg.Error as exc:
            self._down[part] = time.monotonic()
            raise StoreError(
                f"{display_dsn(dsn)}: database unreachable: {self._scrub(str(exc)).strip()}"
            ) from exc
        self._down.pop(part, None)

    def _lock_catalog_path(self, conn: psycopg.Connection, path: str) -> None:
        # Two servers registering one path at once would both pick the same next version.
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (path,))

    def _query(
        self, op: str, sql: str, params: Sequence[Any] = (), part: str = "shard"
    ) -> list[Any]:
        """One read in its own transaction (see `SQLStore`)."""
        with self.transaction(op, part) as conn:
            return conn.execute(sql, params).fetchall()

    # -- executions ------------------------------------------------------------------

    def _is_duplicate(self, error: BaseException | None) -> bool:
        import psycopg

        return isinstance(error, psycopg.errors.UniqueViolation)

    # -- events ----------------------------------------------------------------------

    @classmethod
    def write_batch(
        cls,
        conn: psycopg.Connection,
        event_rows: list[tuple[Any, ...]],
        command_rows: list[tuple[Any, ...]],
        updates: list[tuple[int, str, tuple[Any, ...]]],
    ) -> None:
        """See `SQLStore.write_batch`; the server's step transaction calls it too.

        Raises NotFoundError when an update finds no execution row, except inside a
        pipeline: there a statement's row count is known only once the pipeline syncs,
        after the caller's commit went with it. A caller writing in a pipeline locks the
        executions' rows first (the coordinator does: `SELECT ... FOR UPDATE`).
        """
        from psycopg import pq

        checked = conn.pgconn.pipeline_status == pq.PipelineStatus.OFF
        with conn.cursor() as cur:
            if len(event_rows) > 1:
                # One statement over column arrays: executemany sends a statement per row,
                # and processing their results cost more than the rows themselves.
                cur.execute(_INSERT_EVENTS, [list(c) for c in zip(*event_rows, strict=True)])
            elif event_rows:
                cur.execute(cls._sql(INSERT_EVENT), event_rows[0])
            if len(command_rows) > 1 and len({r[0] for r in command_rows}) == len(command_rows):
                # (An upsert statement cannot touch a row twice: a command with two rows
                # in one batch goes the slow way.)
                # Rows without an attempt keep the row's on update: two statements.
                for given in (True, False):
                    part = [r for r in command_rows if (r[4] is not None) is given]
                    if part:
                        columns = [list(c) for c in zip(*part, strict=True)][:11]
                        cur.execute(_UPSERT_COMMANDS[given], columns)
            elif command_rows:
                cur.executemany(cls._sql(UPSERT_COMMAND), command_rows)
            for execution_id, sql, params in updates:
                cur.execute(sql, params)
                if checked and cur.rowcount == 0:
                    raise NotFoundError(f"execution {execution_id} not found (batch rolled back)")

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """See `flowtide.store.base.Store.close`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._close_pools()
