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

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from flowtide.errors import NotFoundError, StoreError
from flowtide.home import private_dir
from flowtide.sealing import Sealer
from flowtide.store.base import (
    COMMAND_STATUSES,
)
from flowtide.store.sql import INSERT_EVENT, UPSERT_COMMAND, SQLStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION: Final = 4

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
# Version n -> the statements that bring a file from version n to n + 1.
_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    # What the UI shows of an ended execution at a glance, written when it ends (see
    # the PostgreSQL schema's shard version 6).
    1: (
        """
        CREATE TABLE execution_summary (
            execution_id INTEGER PRIMARY KEY,
            format       INTEGER NOT NULL,
            doc          TEXT NOT NULL
        )
        """,
    ),
    # Triggers (see the PostgreSQL schema's shard version 7 and cluster version 8).
    2: (
        "ALTER TABLE execution ADD COLUMN trigger_kind TEXT",
        "ALTER TABLE execution ADD COLUMN trigger_name TEXT",
        "ALTER TABLE execution ADD COLUMN trigger_key TEXT",
        "CREATE INDEX execution_trigger ON execution (trigger_kind, trigger_name, execution_id)",
        "ALTER TABLE execution ADD COLUMN deadline REAL",
        "ALTER TABLE execution ADD COLUMN sla REAL",
        "CREATE INDEX execution_deadline ON execution (deadline) WHERE deadline IS NOT NULL",
        "CREATE INDEX execution_sla ON execution (sla) WHERE sla IS NOT NULL",
        """
        CREATE TABLE trigger_firing (
            trigger_id   INTEGER NOT NULL,
            key          TEXT NOT NULL,
            slot         REAL,
            status       TEXT NOT NULL,
            execution_id INTEGER,
            time         REAL NOT NULL,
            reason       TEXT,
            PRIMARY KEY (trigger_id, key)
        )
        """,
        "CREATE INDEX trigger_firing_time ON trigger_firing (trigger_id, time)",
        """
        CREATE TABLE trigger_state (
            trigger_id INTEGER NOT NULL PRIMARY KEY,
            watermark  REAL NOT NULL,
            updated    REAL NOT NULL
        )
        """,
        """
        CREATE TABLE trigger_def (
            kind       TEXT NOT NULL,
            name       TEXT NOT NULL,
            trigger_id INTEGER NOT NULL UNIQUE,
            spec       TEXT NOT NULL,
            secret     BLOB,
            paused     INTEGER NOT NULL DEFAULT 0,
            resumed    REAL,
            created    REAL NOT NULL,
            updated    REAL NOT NULL,
            PRIMARY KEY (kind, name)
        )
        """,
    ),
    # The notification outbox (see the PostgreSQL schema's shard version 8).
    3: (
        """
        CREATE TABLE notification (
            id            INTEGER PRIMARY KEY,
            execution_id  INTEGER NOT NULL,
            event_id      INTEGER NOT NULL,
            on_transition TEXT NOT NULL,
            target        TEXT NOT NULL,
            doc           TEXT NOT NULL,
            attempts      INTEGER NOT NULL DEFAULT 0,
            next_at       REAL NOT NULL,
            locked_until  REAL,
            created       REAL NOT NULL
        )
        """,
        "CREATE INDEX notification_due ON notification (next_at)",
        "CREATE INDEX notification_execution ON notification (execution_id)",
    ),
}


class SQLiteStore(SQLStore):
    """The store port on one SQLite file (created with its parent directories)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        sealer: Sealer | None = None,
    ) -> None:
        """Open (and create or migrate) the store at `path`.

        Args:
            path: the database file; parent directories are created.
            busy_timeout: seconds to wait for another process holding the write lock.
            sealer: seals what holds a secret (default: the master key of the file's
                folder, the flowtide home, or FLOWTIDE_MASTER_KEY).
        Raises:
            StoreError: the file cannot be opened, is not a flowtide store, or was written
                by a newer flowtide (schema version above `SCHEMA_VERSION`).
        """
        self.path = Path(path)
        self.sealer = sealer or Sealer(self.path.parent)
        self._lock = threading.Lock()
        try:
            private_dir(self.path.parent)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot create directory: {exc}") from exc
        with contextlib.suppress(OSError):  # a new file is this user's alone (SQLite
            # gives its -wal and -shm files the database file's mode)
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
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
    def transaction(self, op: str, part: str = "shard") -> Iterator[sqlite3.Connection]:
        """Hold the lock for one write transaction; roll back on any error (one file:
        `part` does not matter)."""
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

    def reclaim(self) -> None:
        """VACUUM, then a checkpoint that truncates the write-ahead log (VACUUM writes the
        whole file through it): the files shrink by what `collect` freed (a reader waits
        meanwhile)."""
        with self._lock:
            try:
                conn = self._connection()
                conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except _DB_ERRORS as exc:
                raise StoreError(f"vacuum: {exc}") from exc

    def _query(
        self, op: str, sql: str, params: Sequence[Any] = (), part: str = "shard"
    ) -> list[Any]:
        with self._lock:
            conn = self._connection()
            try:
                return conn.execute(sql, params).fetchall()
            except _DB_ERRORS as exc:
                raise StoreError(f"{op}: {exc}") from exc

    # -- executions ------------------------------------------------------------------

    def _is_duplicate(self, error: BaseException | None) -> bool:
        return isinstance(error, sqlite3.IntegrityError)

    # -- events ----------------------------------------------------------------------

    @classmethod
    def write_batch(
        cls,
        conn: sqlite3.Connection,
        event_rows: list[tuple[Any, ...]],
        command_rows: list[tuple[Any, ...]],
        updates: list[tuple[int, str, tuple[Any, ...]]],
    ) -> None:
        """See `SQLStore.write_batch`."""
        if event_rows:
            conn.executemany(INSERT_EVENT, event_rows)
        if command_rows:
            conn.executemany(UPSERT_COMMAND, command_rows)
        for execution_id, sql, params in updates:
            if conn.execute(sql, params).rowcount == 0:
                raise NotFoundError(f"execution {execution_id} not found (batch rolled back)")

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
