"""The PostgreSQL adapter on a real server: the conformance suite, schema versions and
migrations, separate cluster database, many stores on one database, no leaked password."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from flowtide.errors import StoreError
from flowtide.store import Store, pgschema
from flowtide.store.postgres import PostgresStore, display_dsn

from .conformance import RawQuery, StoreConformance, StoreFactory, event, make_execution


@pytest.fixture
def database(pg_database: str) -> str:
    return pg_database


class TestPostgresStore(StoreConformance):
    __test__ = True

    @pytest.fixture
    def raw(self, database: str) -> RawQuery:
        def query(sql: str) -> list[tuple[Any, ...]]:
            with psycopg.connect(database) as conn:
                return conn.execute(sql).fetchall()  # type: ignore[arg-type]

        return query

    @pytest.fixture
    def store_factory(self, database: str) -> Iterator[StoreFactory]:
        opened: list[PostgresStore] = []

        def factory() -> Store:
            store = PostgresStore(database, max_size=10)
            opened.append(store)
            return store

        yield factory
        for store in opened:
            store.close()


def _versions(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return pgschema.current_versions(conn)


def test_fresh_database_gets_every_component_at_latest(database: str) -> None:
    with PostgresStore(database):
        pass
    assert _versions(database) == {c.name: c.latest for c in pgschema.COMPONENTS}
    # Opening again applies nothing twice.
    PostgresStore(database).close()
    with psycopg.connect(database) as conn:
        rows = conn.execute("SELECT component, version FROM flowtide_schema").fetchall()
    assert len(rows) == sum(c.latest for c in pgschema.COMPONENTS)


def test_migrate_false_refuses_an_old_schema_and_names_the_command(database: str) -> None:
    with pytest.raises(StoreError, match="flowtide db upgrade"):
        PostgresStore(database, migrate=False)
    PostgresStore(database).close()
    PostgresStore(database, migrate=False).close()


def test_newer_schema_is_refused(database: str) -> None:
    PostgresStore(database).close()
    with psycopg.connect(database) as conn:
        conn.execute(
            "INSERT INTO flowtide_schema VALUES ('shard', %s, 0)", (pgschema.SHARD.latest + 1,)
        )
    with pytest.raises(StoreError, match="newer than this flowtide supports"):
        PostgresStore(database)
    with pytest.raises(StoreError, match="newer than this flowtide supports"):
        PostgresStore(database, migrate=False)


def test_a_later_migration_applies_on_top(database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    PostgresStore(database).close()
    extra = pgschema.Component(
        "shard",
        {**pgschema.SHARD.migrations, pgschema.SHARD.latest + 1: ("CREATE TABLE probe (x int)",)},
    )
    with psycopg.connect(database, autocommit=True) as conn:
        report = pgschema.upgrade(conn, [extra], where="test")
        assert report == [("shard", pgschema.SHARD.latest, pgschema.SHARD.latest + 1)]
        assert conn.execute("SELECT to_regclass('probe') IS NOT NULL").fetchone() == (True,)


def test_failed_migration_rolls_back_and_names_the_database(database: str) -> None:
    PostgresStore(database).close()
    broken = pgschema.Component(
        "shard",
        {
            **pgschema.SHARD.migrations,
            pgschema.SHARD.latest + 1: ("CREATE TABLE half (x int)", "SELECT nonsense FROM"),
        },
    )
    with psycopg.connect(database, autocommit=True) as conn:
        with pytest.raises(StoreError, match="schema upgrade failed"):
            pgschema.upgrade(conn, [broken], where="db-x")
        assert conn.execute("SELECT to_regclass('half')").fetchone() == (None,)
    assert _versions(database)["shard"] == pgschema.SHARD.latest


def test_concurrent_first_opens_apply_the_schema_once(database: str) -> None:
    errors: list[BaseException] = []
    stores: list[PostgresStore] = []
    barrier = threading.Barrier(6)

    def opener() -> None:
        try:
            barrier.wait()
            stores.append(PostgresStore(database, min_size=1, max_size=1))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    for store in stores:
        store.close()
    assert errors == []
    assert _versions(database) == {c.name: c.latest for c in pgschema.COMPONENTS}


def test_cluster_tables_can_live_in_their_own_database(pg_server, database: str) -> None:  # type: ignore[no-untyped-def]
    cluster = pg_server.create_database("cluster_only")
    try:
        with PostgresStore(database, cluster_dsn=cluster) as store:
            make_execution(store, 1)
            store.register_playbook("a/b", "text", source_file=None, created=1.0)
            store.put_credential("pg", "postgres", b"x", updated=1.0)
        with psycopg.connect(database) as conn:
            tables = {
                r[0]
                for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            }
        with psycopg.connect(cluster) as conn:
            cluster_tables = {
                r[0]
                for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            }
            assert conn.execute("SELECT path FROM catalog").fetchall() == [("a/b",)]
        assert {"execution", "event", "command"} <= tables
        assert not {"catalog", "credential"} & tables
        assert {"catalog", "credential"} <= cluster_tables
        assert not {"execution", "event", "command"} & cluster_tables
        assert _versions(database)["cluster"] == 0
        assert _versions(cluster) == {"shard": 0, "cluster": pgschema.CLUSTER.latest}
    finally:
        pg_server.drop_database("cluster_only")


def test_two_stores_see_each_other_at_once(database: str) -> None:
    with PostgresStore(database) as a, PostgresStore(database) as b:
        make_execution(a, 1)
        a.append([event(1, 10)])
        assert b.count_events(1) == 1
        b.append([event(1, 11)])
        assert [e.event_id for e in a.events(1)] == [10, 11]


def test_concurrent_catalog_registrations_get_distinct_versions(database: str) -> None:
    stores = [PostgresStore(database, max_size=2) for _ in range(4)]
    versions: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def register(store: PostgresStore, n: int) -> None:
        barrier.wait()
        for i in range(10):
            v = store.register_playbook("p", f"text {n} {i}", source_file=None, created=1.0)
            with lock:
                versions.append(v)

    threads = [threading.Thread(target=register, args=(s, n)) for n, s in enumerate(stores)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    for s in stores:
        s.close()
    assert sorted(versions) == list(range(1, 41))


def test_unreachable_server_error_hides_the_password() -> None:
    dsn = "postgresql://flowtide:s3cret-pass@127.0.0.1:1/flowtide?connect_timeout=1"
    with pytest.raises(StoreError) as info:
        PostgresStore(dsn, connect_timeout=2)
    assert "s3cret-pass" not in str(info.value)
    assert "127.0.0.1:1" in str(info.value)


def test_wrong_password_error_hides_it(pg_server) -> None:  # type: ignore[no-untyped-def]
    dsn = f"host=127.0.0.1 port={pg_server.port} user={pg_server.user} password=not-it-123 dbname=flowtide"
    with pytest.raises(StoreError) as info:
        PostgresStore(dsn, connect_timeout=3)
    text = str(info.value)
    assert "not-it-123" not in text
    assert f"127.0.0.1:{pg_server.port}" in text


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("host=h port=5 user=u password=pw dbname=d", "postgresql://u@h:5/d"),
        ("dbname=d", "postgresql://localhost/d"),
    ],
)
def test_display_dsn(dsn: str, shown: str) -> None:
    assert display_dsn(dsn) == shown


def test_out_of_range_integer_is_a_store_error(database: str) -> None:
    with PostgresStore(database) as store:
        with pytest.raises(StoreError):
            store.append([event(1, 1 << 70)])
        assert store.count_events(1) == 0


def test_nul_and_lone_surrogates_round_trip(database: str) -> None:
    with PostgresStore(database) as store:
        make_execution(store, 1)
        payload = {"text": "a\x00b", "odd": "\ud800", "emoji": "🙂"}
        store.append([event(1, 1, payload=payload)])
        assert store.events(1)[0].payload == payload
