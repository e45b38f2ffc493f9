"""SQLite adapter of the store port: one file, WAL, group commit.

Connection model: one connection shared by every thread, guarded by a lock. SQLite admits a
single writer at a time anyway, so one connection per thread would only buy parallel reads,
and would cost BUSY waits between our own connections plus thread-local connections that
`close()` cannot reach. With one connection the writer thread never waits on a sibling,
`close()` is deterministic, and other processes (a CLI next to a running engine) still read
concurrently thanks to WAL.

Write transactions start with BEGIN IMMEDIATE: taking the write lock up front lets the busy
timeout apply, whereas a deferred transaction that upgrades to a writer after another
connection committed fails at once with SQLITE_BUSY_SNAPSHOT.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from flowtide.engine.events import Event
from flowtide.errors import NotFoundError, StoreError
from flowtide.store.base import (
    COMMAND_STATUSES,
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

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION: Final = 1

# Driver-level failures translated to StoreError. sqlite3 raises OverflowError for integers
# beyond 64 bits and UnicodeEncodeError (a ValueError) for strings it cannot encode.
_DB_ERRORS: Final = (sqlite3.Error, OverflowError, ValueError)

_STATUS_LIST = ", ".join(f"'{s}'" for s in sorted(COMMAND_STATUSES))

# Version 1. Every per-execution table is keyed first by execution_id (or has it as the
# leading index column) so sharding by execution_id needs no schema change; catalog and
# credential are cluster-wide. Plain CREATE TABLE (no IF NOT EXISTS): a file that already
# holds unrelated tables of these names is refused instead of silently adopted.
_SCHEMA_V1: Final = (
    """
    CREATE TABLE execution (
        execution_id        INTEGER NOT NULL PRIMARY KEY,
        parent_execution_id INTEGER,
        parent_command_id   INTEGER,
        playbook_path       TEXT,
        playbook_version    INTEGER,
        playbook_file       TEXT,
        playbook_text       TEXT NOT NULL,
        workload            TEXT NOT NULL,
        status              TEXT NOT NULL,
        result              TEXT,
        error               TEXT,
        created             REAL NOT NULL,
        updated             REAL NOT NULL
    )
    """,
    "CREATE INDEX execution_status ON execution (status, execution_id)",
    # WITHOUT ROWID clusters each execution's log by event_id: reading a log is one range
    # scan instead of an index walk plus a table lookup per event.
    """
    CREATE TABLE event (
        execution_id    INTEGER NOT NULL,
        event_id        INTEGER NOT NULL,
        type            TEXT NOT NULL,
        step            TEXT,
        status          TEXT,
        payload         TEXT,
        error           TEXT,
        parent_event_id INTEGER,
        command_id      INTEGER,
        worker_id       TEXT,
        time            REAL NOT NULL,
        PRIMARY KEY (execution_id, event_id)
    ) WITHOUT ROWID
    """,
    f"""
    CREATE TABLE command (
        command_id    INTEGER NOT NULL PRIMARY KEY,
        execution_id  INTEGER NOT NULL,
        step          TEXT NOT NULL,
        status        TEXT NOT NULL CHECK (status IN ({_STATUS_LIST})),
        attempt       INTEGER NOT NULL,
        loop_instance INTEGER,
        loop_index    INTEGER,
        worker_id     TEXT,
        payload       TEXT,
        created       REAL NOT NULL,
        updated       REAL NOT NULL
    )
    """,
    "CREATE INDEX command_execution ON command (execution_id, status, command_id)",
    """
    CREATE TABLE catalog (
        path        TEXT NOT NULL,
        version     INTEGER NOT NULL,
        content     TEXT NOT NULL,
        source_file TEXT,
        created     REAL NOT NULL,
        PRIMARY KEY (path, version)
    )
    """,
    """
    CREATE TABLE credential (
        name       TEXT NOT NULL PRIMARY KEY,
        kind       TEXT NOT NULL,
        ciphertext BLOB NOT NULL,
        created    REAL NOT NULL,
        updated    REAL NOT NULL
    )
    """,
)

# Migrations from version N to N + 1, applied in order on open. Empty while at version 1.
_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {}

_INSERT_EVENT: Final = (
    "INSERT INTO event (execution_id, event_id, type, step, status, payload, error,"
    " parent_event_id, command_id, worker_id, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

# `attempt` is bound twice (insert default and update) because after COALESCE on insert the
# excluded row can no longer tell "not given" from 1.
_UPSERT_COMMAND: Final = (
    "INSERT INTO command (command_id, execution_id, step, status, attempt, loop_instance,"
    " loop_index, worker_id, payload, created, updated)"
    " VALUES (?, ?, ?, ?, COALESCE(?, 1), ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (command_id) DO UPDATE SET"
    " status = excluded.status,"
    " attempt = COALESCE(?, command.attempt),"
    " worker_id = CASE WHEN excluded.status = 'issued' THEN excluded.worker_id"
    " ELSE COALESCE(excluded.worker_id, command.worker_id) END,"
    " payload = COALESCE(excluded.payload, command.payload),"
    " updated = excluded.updated"
)
_PENDING_COMMANDS: Final = (
    f"SELECT {COMMAND_COLUMNS} FROM command WHERE execution_id = ?"
    f" AND status IN ({', '.join(repr(s) for s in PENDING_COMMAND_STATUSES)})"
    " ORDER BY command_id"
)

_CATALOG_COLUMNS: Final = (
    f"{CATALOG_FIELDS}, (SELECT COUNT(*) FROM catalog n WHERE n.path = c.path)"
)


_UPDATE_EXECUTION: Final = {
    (r, e): update_execution_sql(r, e, "?") for r in (False, True) for e in (False, True)
}


class SQLiteStore:
    """The store port on one SQLite file (created with its parent directories)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0) -> None:
        """Open (and create or migrate) the store at `path`.

        Args:
            path: the database file; parent directories are created.
            busy_timeout: seconds to wait for another process holding the write lock.
        Raises:
            StoreError: the file cannot be opened, is not a flowtide store, or was written
                by a newer flowtide (schema version above `SCHEMA_VERSION`).
        """
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create directory: {exc}") from exc
        try:
            # isolation_level=None: the module must not open transactions behind our back;
            # we issue BEGIN/COMMIT ourselves so one batch is exactly one transaction.
            conn = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open: {exc}") from exc
        self._conn: sqlite3.Connection | None = conn
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            # In WAL mode NORMAL syncs only at checkpoints: a commit costs no fsync, and a
            # power loss can drop the last commits but never corrupts the file.
            conn.execute("PRAGMA synchronous = NORMAL")
            self._migrate(conn)
        except BaseException as exc:
            self._conn = None
            conn.close()
            if isinstance(exc, _DB_ERRORS):
                raise StoreError(f"{self.path}: cannot open store: {exc}") from exc
            raise

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # IMMEDIATE so two processes opening a fresh file do not both create the schema.
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                " version INTEGER NOT NULL PRIMARY KEY, applied REAL NOT NULL)"
            )
            found = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
            if found is not None and found > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {found} is newer than this flowtide "
                    f"supports ({SCHEMA_VERSION}); upgrade flowtide to open this file"
                )
            if found is None:
                for statement in _SCHEMA_V1:
                    conn.execute(statement)
                self._set_version(conn, 1)
                found = 1
            while found < SCHEMA_VERSION:
                for statement in _MIGRATIONS[found]:
                    conn.execute(statement)
                found += 1
                self._set_version(conn, found)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _set_version(conn: sqlite3.Connection, version: int) -> None:
        conn.execute(
            "INSERT INTO schema_version (version, applied) VALUES (?, ?)", (version, time.time())
        )

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self.path}: store is closed")
        return self._conn

    @contextmanager
    def _transaction(self, op: str) -> Iterator[sqlite3.Connection]:
        """Hold the lock for one write transaction; roll back on any error."""
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except _DB_ERRORS as exc:
                raise StoreError(f"{op}: cannot start a transaction: {exc}") from exc
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # the original error matters more; SQLite discards the txn anyway
                if isinstance(exc, _DB_ERRORS):
                    raise StoreError(f"{op}: {exc}") from exc
                raise

    def _query(self, op: str, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            conn = self._connection()
            try:
                return conn.execute(sql, params).fetchall()
            except _DB_ERRORS as exc:
                raise StoreError(f"{op}: {exc}") from exc

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
        with self._transaction("create_execution") as conn:
            try:
                conn.execute(
                    "INSERT INTO execution (execution_id, parent_execution_id,"
                    " parent_command_id, playbook_path, playbook_version, playbook_file,"
                    " playbook_text, workload, status, created, updated)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
            except sqlite3.IntegrityError as exc:
                raise StoreError(f"execution {execution_id} already exists") from exc

    def get_execution(self, execution_id: int) -> ExecutionRow:
        """See `flowtide.store.base.Store.get_execution`."""
        rows = self._query(
            "get_execution",
            f"SELECT {EXECUTION_COLUMNS} FROM execution WHERE execution_id = ?",
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
            where.append("status = ?")
            params.append(status)
        if before_id is not None:
            where.append("execution_id < ?")
            params.append(before_id)
        sql = f"SELECT {EXECUTION_COLUMNS} FROM execution"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY execution_id DESC LIMIT ?"
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
        sql, params = self._execution_update(update)
        with self._transaction("update_execution") as conn:
            if conn.execute(sql, params).rowcount == 0:
                raise NotFoundError(f"execution {execution_id} not found")

    @staticmethod
    def _execution_update(update: ExecutionUpdate) -> tuple[str, tuple[Any, ...]]:
        shape, params = execution_update_params(update)
        return _UPDATE_EXECUTION[shape], params

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
        # Serialise before taking the lock: the writer holds it only for the SQL itself.
        event_rows = event_params(events)
        command_rows = command_params(commands)
        updates = [(u.execution_id, *self._execution_update(u)) for u in execution_updates]
        with self._transaction("append (batch rolled back)") as conn:
            if event_rows:
                conn.executemany(_INSERT_EVENT, event_rows)
            if command_rows:
                conn.executemany(_UPSERT_COMMAND, command_rows)
            for execution_id, sql, params in updates:
                if conn.execute(sql, params).rowcount == 0:
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
        sql = f"SELECT {EVENT_COLUMNS} FROM event WHERE execution_id = ?"
        params: list[Any] = [execution_id]
        if after_event_id is not None:
            sql += " AND event_id > ?"
            params.append(after_event_id)
        sql += " ORDER BY event_id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [event_row(r) for r in self._query("events", sql, params)]

    def count_events(self, execution_id: int) -> int:
        """See `flowtide.store.base.Store.count_events`."""
        rows = self._query(
            "count_events", "SELECT COUNT(*) FROM event WHERE execution_id = ?", (execution_id,)
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
            f"SELECT {COMMAND_COLUMNS} FROM command WHERE command_id = ?",
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
        with self._transaction("register_playbook") as conn:
            if version is None:
                latest = conn.execute(
                    "SELECT version, content FROM catalog WHERE path = ?"
                    " ORDER BY version DESC LIMIT 1",
                    (path,),
                ).fetchone()
                if latest is not None and latest[1] == text:
                    return int(latest[0])
                version = 1 if latest is None else int(latest[0]) + 1
            else:
                existing = conn.execute(
                    "SELECT content FROM catalog WHERE path = ? AND version = ?",
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
                " VALUES (?, ?, ?, ?, ?)",
                (path, version, text, source_file, created),
            )
            return version

    def get_playbook(self, path: str, version: int | None = None) -> CatalogRow:
        """See `flowtide.store.base.Store.get_playbook`."""
        if version is None:
            rows = self._query(
                "get_playbook",
                f"SELECT {_CATALOG_COLUMNS} FROM catalog c WHERE c.path = ?"
                " ORDER BY c.version DESC LIMIT 1",
                (path,),
            )
            if not rows:
                raise NotFoundError(f"playbook {path!r} not found in the catalog")
        else:
            rows = self._query(
                "get_playbook",
                f"SELECT {_CATALOG_COLUMNS} FROM catalog c WHERE c.path = ? AND c.version = ?",
                (path, version),
            )
            if not rows:
                raise NotFoundError(f"playbook {path!r} version {version} not found")
        return catalog_row(rows[0])

    def list_playbooks(self) -> list[CatalogRow]:
        """See `flowtide.store.base.Store.list_playbooks`."""
        rows = self._query(
            "list_playbooks",
            "SELECT c.path, c.version, c.content, c.source_file, c.created, m.n"
            " FROM catalog c JOIN ("
            "SELECT path, MAX(version) AS v, COUNT(*) AS n FROM catalog GROUP BY path"
            ") m ON c.path = m.path AND c.version = m.v"
            " ORDER BY c.path",
        )
        return [catalog_row(r) for r in rows]

    # -- credentials -----------------------------------------------------------------

    def put_credential(self, name: str, kind: str, ciphertext: bytes, *, updated: float) -> None:
        """See `flowtide.store.base.Store.put_credential`."""
        with self._transaction("put_credential") as conn:
            conn.execute(
                "INSERT INTO credential (name, kind, ciphertext, created, updated)"
                " VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET kind = excluded.kind,"
                " ciphertext = excluded.ciphertext, updated = excluded.updated",
                (name, kind, bytes(ciphertext), updated, updated),
            )

    def get_credential(self, name: str) -> tuple[str, bytes]:
        """See `flowtide.store.base.Store.get_credential`."""
        rows = self._query(
            "get_credential", "SELECT kind, ciphertext FROM credential WHERE name = ?", (name,)
        )
        if not rows:
            raise NotFoundError(f"credential {name!r} not found")
        return rows[0][0], bytes(rows[0][1])

    def list_credentials(self) -> list[dict[str, Any]]:
        """See `flowtide.store.base.Store.list_credentials`."""
        rows = self._query(
            "list_credentials", "SELECT name, kind, created, updated FROM credential ORDER BY name"
        )
        return [{"name": r[0], "kind": r[1], "created": r[2], "updated": r[3]} for r in rows]

    def delete_credential(self, name: str) -> None:
        """See `flowtide.store.base.Store.delete_credential`."""
        with self._transaction("delete_credential") as conn:
            if conn.execute("DELETE FROM credential WHERE name = ?", (name,)).rowcount == 0:
                raise NotFoundError(f"credential {name!r} not found")

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """See `flowtide.store.base.Store.close`."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            try:
                conn.close()
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: close failed: {exc}") from exc
