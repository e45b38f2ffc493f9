"""`--db postgresql://...`: the embedded runtime on a real PostgreSQL event store, and
`flowtide db status|upgrade`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowtide.store import pgschema

from .helpers import PLAYBOOKS, Flowtide, describe


@pytest.fixture
def pg_db(pg_database: str) -> str:
    return pg_database


def _strip_ids(doc: dict) -> dict:  # type: ignore[type-arg]
    return {k: v for k, v in doc.items() if k != "execution_id"}


def test_db_status_and_upgrade(ft: Flowtide, pg_db: str) -> None:
    shard, cluster = pgschema.SHARD.latest, pgschema.CLUSTER.latest
    before = ft("db", "status", "--db", pg_db)
    assert before.returncode == 1, describe(before)
    assert f"shard: version 0 (needs upgrade to {shard})" in before.stdout

    up = ft.ok("db", "upgrade", "--db", pg_db)
    assert f"shard: version {shard} (upgraded 0 -> {shard})" in up.stdout
    assert f"cluster: version {cluster} (upgraded 0 -> {cluster})" in up.stdout
    # The password never shows.
    assert pg_db.split(":")[2].split("@")[0] not in up.stdout

    again = json.loads(ft.ok("db", "upgrade", "--db", pg_db, "--json").stdout)
    assert {(r["component"], r["from"], r["version"]) for r in again} == {
        ("shard", shard, shard),
        ("cluster", cluster, cluster),
    }
    ft.ok("db", "status", "--db", pg_db)


def test_run_on_postgres_matches_sqlite(ft: Flowtide, pg_db: str) -> None:
    playbook = PLAYBOOKS / "parallel_big.yaml"
    args = ("run", playbook, "--json", "--set", "count=200")
    on_pg = ft.ok(*args, "--db", pg_db)
    on_sqlite = ft.ok(*args)
    pg_doc, sqlite_doc = json.loads(on_pg.stdout), json.loads(on_sqlite.stdout)
    assert pg_doc["status"] == "completed"
    assert _strip_ids(pg_doc) == _strip_ids(sqlite_doc)

    # The other commands read the same store.
    eid = pg_doc["execution_id"]
    status = json.loads(ft.ok("status", eid, "--json", "--db", pg_db).stdout)
    assert status["status"] == "completed"
    listing = json.loads(ft.ok("list", "--json", "--db", pg_db).stdout)
    assert [row["execution_id"] for row in listing] == [eid]
    events = json.loads(ft.ok("events", eid, "--json", "--db", pg_db).stdout)
    types = [e["type"] for e in events]
    assert types[0] == "playbook.initialized" and types[-1] == "playbook.completed"
    assert types.count("call.done") == 200


def test_catalog_and_credentials_on_postgres(ft: Flowtide, pg_db: str, tmp_path: Path) -> None:
    folder = tmp_path / "catalog"
    folder.mkdir()
    (folder / "basic.yaml").write_text((PLAYBOOKS / "basic.yaml").read_text())
    assert "tests/cli/basic v1" in ft.ok("catalog", "register", folder, "--db", pg_db).stdout
    doc = json.loads(ft.ok("run", "tests/cli/basic", "--json", "--db", pg_db).stdout)
    assert doc["result"] == {"message": "hello: 12"}


def test_unreachable_postgres_is_a_clear_error_without_the_password(ft: Flowtide) -> None:
    proc = ft("run", PLAYBOOKS / "basic.yaml", "--db", "postgresql://u:hunter2-pw@127.0.0.1:1/x")
    assert proc.returncode == 1, describe(proc)
    assert "cannot connect to PostgreSQL" in proc.stderr
    assert "postgresql://u:***@127.0.0.1:1/x" in proc.stderr
    assert "hunter2-pw" not in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
