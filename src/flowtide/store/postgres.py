"""PostgreSQL adapter of the store port (psycopg 3 with a connection pool).

    store = PostgresStore("postgresql://flowtide:***@127.0.0.1:5432/flowtide")

Per-execution tables (execution, event, command) live in the database of `dsn`; the
cluster-wide tables (catalog, credential) in the database of `cluster_dsn`, which defaults
to the same one. The schema is versioned per part (`flowtide.store.pgschema`); a store
opened with `migrate=True` (the default) upgrades it, otherwise it refuses a schema that
is not current and names `flowtide db upgrade`.

Connection model: a pool shared by every thread. Each port call borrows one connection
for one transaction, so any number of threads and processes (API servers) write
concurrently; PostgreSQL's row locks and the primary keys keep the batches atomic and
unique. Nothing is cached in the process: two stores on one database see each other's
writes at once, which is what a stateless server needs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from flowtide.engine.events import Event
from flowtide.errors import NotFoundError, StoreError
from flowtide.store import pgschema
from flowtide.store.base import (
    EXECUTION_CREATED,
    PENDING_COMMAND_STATUSES,
    UNSET,
    CatalogRow,
    CommandRow,
    CommandUpdate,
    ExecutionRow,
    ExecutionUpdate,
    Unset,
)
from flowtide.store.codec import (
    CATALOG_FIELDS,
    COMMAND_COLUMNS,
    EVENT_COLUMNS,
    EXECUTION_COLUMNS,
    catalog_row,
    check_limit,
    command_params,
    command_row,
    encode_value,
    event_params,
    event_row,
    execution_row,
    execution_update_params,
    update_execution_sql,
)
from flowtide.urls import redact_url, scrub_url

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["PostgresStore", "display_dsn", "is_postgres_url"]

_SCHEMES: Final = ("postgresql://", "postgres://")

_INSERT_EVENT: Final = (
    "INSERT INTO event (execution_id, event_id, type, step, status, payload, error,"
    " parent_event_id, command_id, worker_id, time)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
# Same semantics as the SQLite upsert (see CommandUpdate): `attempt` is bound twice.
_UPSERT_COMMAND: Final = (
    "INSERT INTO command (command_id, execution_id, step, status, attempt, loop_instance,"
    " loop_index, worker_id, payload, created, updated)"
    " VALUES (%s, %s, %s, %s, COALESCE(%s, 1), %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (command_id) DO UPDATE SET"
    " status = excluded.status,"
    " attempt = COALESCE(%s, command.attempt),"
    " worker_id = CASE WHEN excluded.status = 'issued' THEN excluded.worker_id"
    " ELSE COALESCE(excluded.worker_id, command.worker_id) END,"
    " payload = COALESCE(excluded.payload, command.payload),"
    " updated = excluded.updated"
)
_PENDING_COMMANDS: Final = (
    f"SELECT {COMMAND_COLUMNS} FROM command WHERE execution_id = %s"
    f" AND status IN ({', '.join(repr(s) for s in PENDING_COMMAND_STATUSES)})"
    " ORDER BY command_id"
)
_CATALOG_COLUMNS: Final = (
    f"{CATALOG_FIELDS}, (SELECT COUNT(*) FROM catalog n WHERE n.path = c.path)"
)
_UPDATE_EXECUTION: Final = {
    (r, e): update_execution_sql(r, e, "%s") for r in (False, True) for e in (False, True)
}


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


class PostgresStore:
    """The store port on PostgreSQL; usable from any number of threads."""

    def __init__(
        self,
        dsn: str,
        *,
        cluster_dsn: str | None = None,
        min_size: int = 1,
        max_size: int = 8,
        migrate: bool = True,
        connect_timeout: float = 10.0,
    ) -> None:
        """Connect, and upgrade (`migrate=True`) or check the schema.

        Args:
            dsn: database of the per-execution tables (URL or key=value string).
            cluster_dsn: database of the cluster-wide tables; None for `dsn`'s.
            min_size: connections each pool keeps open.
            max_size: connections each pool opens at most (concurrent port calls).
            migrate: apply pending schema migrations; False only checks the version.
            connect_timeout: seconds to wait for the first connection.
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
        self._secrets = {s for s in (_password(dsn), _password(cluster_dsn or "")) if s}
        self._dsns = {"shard": dsn, "cluster": cluster_dsn or dsn}
        self._lock = threading.Lock()
        self._closed = False
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
            # A connection broken by a server restart is replaced instead of handed out.
            check=pool_class.check_connection,
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
        try:
            with self._pools[part].connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout, OverflowError) as exc:
            raise StoreError(f"{op}: {self._scrub(str(exc)).strip()}") from exc
        except PoolClosed as exc:
            raise StoreError(f"{self.dsn_display}: store is closed") from exc

    def _query(
        self, op: str, sql: str, params: Sequence[Any] = (), part: str = "shard"
    ) -> list[Any]:
        with self.transaction(op, part) as conn:
            return conn.execute(sql, params).fetchall()

    # -- executions ------------------------------------------------------------------

    def create_execution(
        self,
        execution_id: int,
        *,
        playbook_path: str | None,
        playbook_version: int | None,
        playbook_file: str | None,
        playbook_text: str,
        workload: dict[str, Any],
        parent_execution_id: int | None = None,
        parent_command_id: int | None = None,
        created: float,
    ) -> None:
        """See `flowtide.store.base.Store.create_execution`."""
        import psycopg

        row = (
            execution_id,
            parent_execution_id,
            parent_command_id,
            playbook_path,
            playbook_version,
            playbook_file,
            playbook_text,
            encode_value(workload, f"execution {execution_id}: workload"),
            EXECUTION_CREATED,
            created,
            created,
        )
        try:
            with self.transaction("create_execution") as conn:
                conn.execute(
                    "INSERT INTO execution (execution_id, parent_execution_id,"
                    " parent_command_id, playbook_path, playbook_version, playbook_file,"
                    " playbook_text, workload, status, created, updated)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    row,
                )
        except StoreError as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise StoreError(f"execution {execution_id} already exists") from exc
            raise

    def get_execution(self, execution_id: int) -> ExecutionRow:
        """See `flowtide.store.base.Store.get_execution`."""
        rows = self._query(
            "get_execution",
            f"SELECT {EXECUTION_COLUMNS} FROM execution WHERE execution_id = %s",
            (execution_id,),
        )
        if not rows:
            raise NotFoundError(f"execution {execution_id} not found")
        return execution_row(rows[0])

    def list_executions(
        self,
        *,
        status: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> list[ExecutionRow]:
        """See `flowtide.store.base.Store.list_executions`."""
        check_limit(limit)
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = %s")
            params.append(status)
        if before_id is not None:
            where.append("execution_id < %s")
            params.append(before_id)
        sql = f"SELECT {EXECUTION_COLUMNS} FROM execution"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY execution_id DESC LIMIT %s"
        params.append(limit)
        return [execution_row(r) for r in self._query("list_executions", sql, params)]

    def update_execution(
        self,
        execution_id: int,
        *,
        status: str,
        result: Any | Unset = UNSET,
        error: dict[str, Any] | None | Unset = UNSET,
        updated: float,
    ) -> None:
        """See `flowtide.store.base.Store.update_execution`."""
        update = ExecutionUpdate(
            execution_id=execution_id, status=status, updated=updated, result=result, error=error
        )
        shape, params = execution_update_params(update)
        with self.transaction("update_execution") as conn:
            if conn.execute(_UPDATE_EXECUTION[shape], params).rowcount == 0:
                raise NotFoundError(f"execution {execution_id} not found")

    # -- events ----------------------------------------------------------------------

    def append(
        self,
        events: Sequence[Event],
        *,
        commands: Sequence[CommandUpdate] = (),
        execution_updates: Sequence[ExecutionUpdate] = (),
    ) -> None:
        """See `flowtide.store.base.Store.append`."""
        if not events and not commands and not execution_updates:
            return
        event_rows = event_params(events)
        command_rows = command_params(commands)
        updates = [(u.execution_id, *execution_update_params(u)) for u in execution_updates]
        with self.transaction("append (batch rolled back)") as conn:
            self.write_batch(conn, event_rows, command_rows, updates)

    @staticmethod
    def write_batch(
        conn: psycopg.Connection,
        event_rows: list[tuple[Any, ...]],
        command_rows: list[tuple[Any, ...]],
        updates: list[tuple[int, tuple[bool, bool], tuple[Any, ...]]],
    ) -> None:
        """Write prepared rows inside the caller's transaction on `conn`."""
        with conn.cursor() as cur:
            if event_rows:
                cur.executemany(_INSERT_EVENT, event_rows)
            if command_rows:
                cur.executemany(_UPSERT_COMMAND, command_rows)
            for execution_id, shape, params in updates:
                cur.execute(_UPDATE_EXECUTION[shape], params)
                if cur.rowcount == 0:
                    raise NotFoundError(f"execution {execution_id} not found (batch rolled back)")

    def events(
        self,
        execution_id: int,
        *,
        after_event_id: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """See `flowtide.store.base.Store.events`."""
        check_limit(limit)
        sql = f"SELECT {EVENT_COLUMNS} FROM event WHERE execution_id = %s"
        params: list[Any] = [execution_id]
        if after_event_id is not None:
            sql += " AND event_id > %s"
            params.append(after_event_id)
        sql += " ORDER BY event_id"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        return [event_row(r) for r in self._query("events", sql, params)]

    def count_events(self, execution_id: int) -> int:
        """See `flowtide.store.base.Store.count_events`."""
        rows = self._query(
            "count_events", "SELECT COUNT(*) FROM event WHERE execution_id = %s", (execution_id,)
        )
        return int(rows[0][0])

    # -- commands --------------------------------------------------------------------

    def pending_commands(self, execution_id: int) -> list[CommandRow]:
        """See `flowtide.store.base.Store.pending_commands`."""
        rows = self._query("pending_commands", _PENDING_COMMANDS, (execution_id,))
        return [command_row(r) for r in rows]

    def get_command(self, command_id: int) -> CommandRow:
        """See `flowtide.store.base.Store.get_command`."""
        rows = self._query(
            "get_command",
            f"SELECT {COMMAND_COLUMNS} FROM command WHERE command_id = %s",
            (command_id,),
        )
        if not rows:
            raise NotFoundError(f"command {command_id} not found")
        return command_row(rows[0])

    # -- catalog ---------------------------------------------------------------------

    def register_playbook(
        self,
        path: str,
        text: str,
        *,
        source_file: str | None,
        created: float,
        version: int | None = None,
    ) -> int:
        """See `flowtide.store.base.Store.register_playbook`."""
        if version is not None and version < 1:
            raise StoreError(f"playbook {path!r}: version must be >= 1, got {version}")
        with self.transaction("register_playbook", "cluster") as conn:
            # Serialise registrations of one path (two servers registering at once would
            # otherwise both pick the same next version).
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (path,))
            if version is None:
                latest = conn.execute(
                    "SELECT version, content FROM catalog WHERE path = %s"
                    " ORDER BY version DESC LIMIT 1",
                    (path,),
                ).fetchone()
                if latest is not None and latest[1] == text:
                    return int(latest[0])
                version = 1 if latest is None else int(latest[0]) + 1
            else:
                existing = conn.execute(
                    "SELECT content FROM catalog WHERE path = %s AND version = %s",
                    (path, version),
                ).fetchone()
                if existing is not None:
                    if existing[0] == text:
                        return version
                    raise StoreError(
                        f"playbook {path!r} version {version} is already registered "
                        "with different content"
                    )
            conn.execute(
                "INSERT INTO catalog (path, version, content, source_file, created)"
                " VALUES (%s, %s, %s, %s, %s)",
                (path, version, text, source_file, created),
            )
            return version

    def get_playbook(self, path: str, version: int | None = None) -> CatalogRow:
        """See `flowtide.store.base.Store.get_playbook`."""
        if version is None:
            rows = self._query(
                "get_playbook",
                f"SELECT {_CATALOG_COLUMNS} FROM catalog c WHERE c.path = %s"
                " ORDER BY c.version DESC LIMIT 1",
                (path,),
                "cluster",
            )
            if not rows:
                raise NotFoundError(f"playbook {path!r} not found in the catalog")
        else:
            rows = self._query(
                "get_playbook",
                f"SELECT {_CATALOG_COLUMNS} FROM catalog c WHERE c.path = %s AND c.version = %s",
                (path, version),
                "cluster",
            )
            if not rows:
                raise NotFoundError(f"playbook {path!r} version {version} not found")
        return catalog_row(rows[0])

    def list_playbooks(self) -> list[CatalogRow]:
        """See `flowtide.store.base.Store.list_playbooks`."""
        rows = self._query(
            "list_playbooks",
            f"SELECT {CATALOG_FIELDS}, m.n"
            " FROM catalog c JOIN ("
            "SELECT path, MAX(version) AS v, COUNT(*) AS n FROM catalog GROUP BY path"
            ") m ON c.path = m.path AND c.version = m.v"
            " ORDER BY c.path",
            (),
            "cluster",
        )
        return [catalog_row(r) for r in rows]

    # -- credentials -----------------------------------------------------------------

    def put_credential(self, name: str, kind: str, ciphertext: bytes, *, updated: float) -> None:
        """See `flowtide.store.base.Store.put_credential`."""
        with self.transaction("put_credential", "cluster") as conn:
            conn.execute(
                "INSERT INTO credential (name, kind, ciphertext, created, updated)"
                " VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (name) DO UPDATE SET kind = excluded.kind,"
                " ciphertext = excluded.ciphertext, updated = excluded.updated",
                (name, kind, bytes(ciphertext), updated, updated),
            )

    def get_credential(self, name: str) -> tuple[str, bytes]:
        """See `flowtide.store.base.Store.get_credential`."""
        rows = self._query(
            "get_credential",
            "SELECT kind, ciphertext FROM credential WHERE name = %s",
            (name,),
            "cluster",
        )
        if not rows:
            raise NotFoundError(f"credential {name!r} not found")
        return rows[0][0], bytes(rows[0][1])

    def list_credentials(self) -> list[dict[str, Any]]:
        """See `flowtide.store.base.Store.list_credentials`."""
        rows = self._query(
            "list_credentials",
            "SELECT name, kind, created, updated FROM credential ORDER BY name",
            (),
            "cluster",
        )
        return [{"name": r[0], "kind": r[1], "created": r[2], "updated": r[3]} for r in rows]

    def delete_credential(self, name: str) -> None:
        """See `flowtide.store.base.Store.delete_credential`."""
        with self.transaction("delete_credential", "cluster") as conn:
            if conn.execute("DELETE FROM credential WHERE name = %s", (name,)).rowcount == 0:
                raise NotFoundError(f"credential {name!r} not found")

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """See `flowtide.store.base.Store.close`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._close_pools()
