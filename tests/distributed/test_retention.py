"""A server's retention (FLOWTIDE_RETENTION): its shard's executions that ended longer
ago than the setting go with their rows; open and recent ones stay; a bad value is
refused naming the variable."""

from __future__ import annotations

import asyncio
import time

import pytest

from flowtide.errors import SettingsError
from flowtide.server.retention import RetentionWatch
from flowtide.server.settings import ServerSettings
from flowtide.store.postgres import PostgresStore

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

DAY = 86400.0


def _run(store: PostgresStore, execution_id: int, status: str, updated: float) -> None:
    store.create_execution(
        execution_id,
        playbook_path="tests/retention",
        playbook_version=None,
        playbook_file=None,
        playbook_text="workflow: []\n",
        workload={},
        created=updated,
    )
    store.update_execution(execution_id, status=status, updated=updated)


def test_a_server_removes_what_ended_before_its_retention(pg_database: str) -> None:
    store = PostgresStore(pg_database, max_size=2)
    try:
        now = time.time()
        _run(store, 1, "completed", now - 40 * DAY)
        _run(store, 2, "failed", now - 31 * DAY)
        _run(store, 3, "running", now - 40 * DAY)
        _run(store, 4, "completed", now - 2 * DAY)
        gone = asyncio.run(RetentionWatch(store, 30 * DAY).collect(now))
        assert gone == 2
        assert {r.execution_id for r in store.list_executions(limit=10)} == {3, 4}
    finally:
        store.close()


def test_a_retention_that_is_not_a_duration_is_refused(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWTIDE_DB", pg_database)
    monkeypatch.setenv("FLOWTIDE_RETENTION", "a month")
    with pytest.raises(SettingsError) as caught:
        ServerSettings.from_env()
    assert caught.value.env == "FLOWTIDE_RETENTION"


def test_with_a_shared_bucket_one_server_of_the_shard_collects_a_round(
    pg_database: str,
) -> None:
    """Two servers of one shard sharing a bucket (memory:// stands for NATS here: one
    process): while one holds the shard's retention lease, the other skips its round;
    another shard's lease is its own."""
    from flowtide.kv import connect

    async def main(store: PostgresStore) -> tuple[int | None, int | None, int | None]:
        kv = await connect("memory://", "retention_duty")
        first = RetentionWatch(store, 30 * DAY, kv=kv, shard=0, holder="server-a")
        second = RetentionWatch(store, 30 * DAY, kv=kv, shard=0, holder="server-b")
        other = RetentionWatch(store, 30 * DAY, kv=kv, shard=1, holder="server-c")
        assert first.duty is not None
        now = time.time()
        async with await first.duty.acquire(timeout=0):  # server-a is collecting
            skipped = await second.round(now)
            elsewhere = await other.round(now)
        after = await second.round(now)  # released: server-b's turn
        await kv.close()
        return skipped, elsewhere, after

    store = PostgresStore(pg_database, max_size=2)
    try:
        now = time.time()
        _run(store, 1, "completed", now - 40 * DAY)
        skipped, elsewhere, after = asyncio.run(main(store))
        assert skipped is None  # another server of the shard holds the round
        assert elsewhere == 1  # shard 1's lease is not shard 0's (one store here)
        assert after == 0
        assert store.list_executions(limit=10) == []
    finally:
        store.close()
