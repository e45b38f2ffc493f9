"""The SQLite adapter: the conformance suite plus what only a file-backed store has."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowtide.errors import StoreError
from flowtide.store import Store
from flowtide.store.sqlite import SCHEMA_VERSION, SQLiteStore

from .conformance import RawQuery, StoreConformance, StoreFactory, event, make_execution


class TestSQLiteStore(StoreConformance):
    __test__ = True

    @pytest.fixture
    def path(self, tmp_path: Path) -> Path:
        return tmp_path / "nested" / "dirs" / "flowtide.db"

    @pytest.fixture
    def raw(self, path: Path) -> RawQuery:
        def query(sql: str) -> list[tuple[Any, ...]]:
            conn = _raw(path)
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()

        return query

    @pytest.fixture
    def store_factory(self, path: Path) -> Iterator[StoreFactory]:
        opened: list[SQLiteStore] = []

        def factory() -> Store:
            store = SQLiteStore(path)
            opened.append(store)
            return store

        yield factory
        for store in opened:
            store.close()


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def test_creates_parent_dirs_wal_and_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.db"
    with SQLiteStore(path):
        pass
    assert path.is_file()
    raw = _raw(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        versions = raw.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        # Version 1, then each migration, as a file made by an older flowtide gets them.
        assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    finally:
        raw.close()


def test_connection_uses_synchronous_normal(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        # 1 is NORMAL; the setting is per connection, so only the store's own can tell.
        assert store._connection().execute("PRAGMA synchronous").fetchone()[0] == 1
    finally:
        store.close()


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    SQLiteStore(path).close()
    raw = _raw(path)
    raw.execute(
        "INSERT INTO schema_version (version, applied) VALUES (?, 0)", (SCHEMA_VERSION + 1,)
    )
    raw.close()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1} is newer"):
        SQLiteStore(path)


def test_reopening_does_not_reapply_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    for _ in range(3):
        SQLiteStore(path).close()
    raw = _raw(path)
    try:
        assert raw.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        raw.close()


def test_a_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with SQLiteStore(path) as store:
        store.create_execution(
            1,
            playbook_path=None,
            playbook_version=None,
            playbook_file=None,
            playbook_text="workflow: []\n",
            workload={},
            parent_execution_id=None,
            parent_command_id=None,
            created=1.0,
        )
    raw = _raw(path)  # back to what flowtide with schema version 1 wrote
    raw.execute("DROP TABLE execution_summary")
    for table in ("trigger_firing", "trigger_state", "trigger_def", "notification"):
        raw.execute(f"DROP TABLE {table}")
    for index in ("execution_trigger", "execution_deadline", "execution_sla"):
        raw.execute(f"DROP INDEX {index}")
    for column in ("trigger_kind", "trigger_name", "trigger_key", "deadline", "sla"):
        raw.execute(f"ALTER TABLE execution DROP COLUMN {column}")
    raw.execute("DELETE FROM schema_version WHERE version > 1")
    raw.commit()
    raw.close()
    with SQLiteStore(path) as store:
        assert store.get_execution(1).playbook_text == "workflow: []\n"
        assert store.get_summary(1) is None
        store.put_summary(1, {"status": "completed"}, format=1)
        assert store.get_summary(1) == (1, {"status": "completed"})
        assert store.get_execution(1).trigger is None
        assert store.list_triggers() == []


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="junk.db"):
        SQLiteStore(path)


def test_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    raw = _raw(path)
    raw.execute("CREATE TABLE event (x TEXT)")
    raw.close()
    with pytest.raises(StoreError):
        SQLiteStore(path)


def test_unusable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError):
        SQLiteStore(blocker / "sub" / "s.db")


def test_out_of_range_integer_is_a_store_error(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "s.db") as store:
        with pytest.raises(StoreError):
            store.append([event(1, 1 << 70)])
        assert store.count_events(1) == 0


def test_two_stores_on_one_file_lose_nothing(tmp_path: Path) -> None:
    # Two processes (engine + CLI) share a file: each has its own connection, and the busy
    # timeout plus BEGIN IMMEDIATE must serialise their writers without errors.
    path = tmp_path / "s.db"
    stores = [SQLiteStore(path), SQLiteStore(path)]
    errors: list[BaseException] = []

    def writer(store: SQLiteStore, offset: int) -> None:
        try:
            for b in range(100):
                base = offset + b * 10
                store.append([event(1, base + i) for i in range(10)])
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=writer, args=(store, n * 1_000_000))
        for n, store in enumerate(stores)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    try:
        assert errors == []
        assert stores[0].count_events(1) == 2000
        assert stores[1].count_events(1) == 2000
    finally:
        for store in stores:
            store.close()


def test_repr_and_context_manager(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "s.db") as store:
        make_execution(store, 1)
        assert "s.db" in repr(store)
    with pytest.raises(StoreError, match="closed"):
        store.get_execution(1)
