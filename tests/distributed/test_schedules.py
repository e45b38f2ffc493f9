"""Schedules on a cluster of real processes: two shards, shard 0 served by two servers
(so servers of one shard race for the same slots) and shard 1 by one. Every server runs
the scheduler. What it shows: each slot of each schedule starts exactly one execution,
on the shard that owns the schedule, however the servers race, and with one of them
killed (`kill -9`) mid-way and started again; a backfill repeated through another
shard's server starts each slot once."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowtide.sharding import shard_for

from .stack import Stack, _free_port, sharded

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

from natsserver import NatsServer  # noqa: E402

NOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: tick, path: tests/dist/tick}
workload: {slot: none}
workflow:
  - step: start
    tool: {kind: noop}
"""

#: Schedules firing every second, and how long they fire.
SCHEDULES = 30
SECONDS = 10


class Cluster:
    def __init__(self, stacks: list[Stack], shard_dbs: list[str]) -> None:
        #: shard 0's two servers, then shard 1's.
        self.stacks = stacks
        self.shard_dbs = shard_dbs

    def runs(self, schedule_prefix: str) -> list[tuple[str, str, int, int]]:
        """(schedule, slot, execution id, shard) of every run schedules of this prefix
        started, read from each shard's database."""
        found = []
        for shard, db in enumerate(self.shard_dbs):
            with psycopg.connect(db) as conn:
                rows = conn.execute(
                    "SELECT trigger_name, trigger_key, execution_id FROM execution"
                    " WHERE trigger_kind = 'schedule' AND trigger_name LIKE %s",
                    (schedule_prefix + "%",),
                ).fetchall()
            found += [(str(n), str(k), int(e), shard) for n, k, e in rows]
        return found


@pytest.fixture(scope="module")
def cluster(pg_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("schedules")
    cluster_db = pg_server.create_database("sched_cluster")
    shard_dbs = [pg_server.create_database("sched_0"), pg_server.create_database("sched_1")]
    nats = NatsServer.start_secured(root / "nats", pools=("default",))
    first, second = sharded(cluster_db, shard_dbs, nats=nats.url, root=root, nats_users=nats.users)
    # A second server of shard 0: the same databases, a port and log of its own.
    twin = replace(first, name="server0b", port=_free_port(), server=None, workers=[], logs=[])
    stacks = [first, twin, second]
    try:
        for s in stacks:
            s.start_server()
        first.start_worker(concurrency=16)
        second.start_worker(concurrency=16)
        assert first.run("catalog", "register", _write(root, NOOP)).returncode == 0
        yield Cluster(stacks, shard_dbs)
    finally:
        for s in stacks:
            s.stop()
        nats.stop()
        for name in ("sched_cluster", "sched_0", "sched_1"):
            pg_server.drop_database(name)


def _write(root: Path, text: str) -> Path:
    path = root / "tick.yaml"
    path.write_text(text)
    return path


def test_each_slot_starts_one_run_with_servers_racing_and_one_killed(cluster: Cluster) -> None:
    a, b, c = cluster.stacks
    with a.client("operator") as api:
        for i in range(SCHEDULES):
            r = api.post(
                "/api/schedules",
                json={
                    "name": f"race-{i:02}",
                    "playbook": "tests/dist/tick",
                    "every": "1s",
                    "overlap": "allow",
                    "workload": {"slot": "{{ schedule.slot }}"},
                },
            )
            assert r.status_code == 201, r.text
        began = time.time()
        time.sleep(SECONDS / 2)
        b.kill_server()  # one of shard 0's two servers, mid-firing
        time.sleep(1)
        b.start_server()
        time.sleep(SECONDS / 2)
        for i in range(SCHEDULES):
            assert api.post(f"/api/schedules/race-{i:02}/pause").status_code == 200
        ended = time.time()
    time.sleep(1.5)  # a round in flight when the pause was read
    runs = cluster.runs("race-")
    per_slot = Counter((name, slot) for name, slot, _, _ in runs)
    assert per_slot and max(per_slot.values()) == 1, [k for k, n in per_slot.items() if n > 1]
    # Every schedule fired every second it was active: no slot lost to the kill.
    by_schedule: dict[str, list[str]] = {}
    for name, slot, _, _ in runs:
        by_schedule.setdefault(name, []).append(slot)
    assert len(by_schedule) == SCHEDULES
    for name, slots in by_schedule.items():
        stamps = sorted(_stamp(s) for s in slots)
        assert stamps == [stamps[0] + i for i in range(len(stamps))], (name, slots)
        assert len(stamps) >= SECONDS - 2, (name, len(stamps), ended - began)
    # Each run is on the shard that owns its schedule.
    with a.client("reader") as api:
        owners = {item["name"]: item for item in api.get("/api/schedules").json()["items"]}
    assert set(owners) >= set(by_schedule)
    shards = {shard for _, _, _, shard in runs}
    assert shards == {0, 1}, "30 schedules spread over both shards"
    for _name, _slot, execution_id, shard in runs:
        assert shard_for(execution_id, 2) == shard


def _stamp(slot: str) -> int:
    import datetime

    return int(datetime.datetime.fromisoformat(slot.replace("Z", "+00:00")).timestamp())


def test_backfill_starts_each_slot_once_through_any_server(cluster: Cluster) -> None:
    a, _, c = cluster.stacks
    window = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-05T03:00:00Z"}
    with a.client("operator") as api:
        r = api.post(
            "/api/schedules",
            json={
                "name": "fill",
                "playbook": "tests/dist/tick",
                "cron": "0 * * * *",
                "overlap": "allow",
                "paused": True,
            },
        )
        assert r.status_code == 201, r.text
        first = api.post("/api/schedules/fill/backfill", json=window)
        assert first.status_code == 200, first.text
    assert len(first.json()["started"]) == 100
    with c.client("operator") as other:
        again = other.post("/api/schedules/fill/backfill", json=window)
        assert again.status_code == 200, again.text
        assert again.json()["started"] == {} and len(again.json()["already"]) == 100
        shown = other.get("/api/schedules/fill").json()
    assert len(shown["firings"]) == 50  # the latest, newest first
    runs = cluster.runs("fill")
    assert len(runs) == 100 and len({slot for _, slot, _, _ in runs}) == 100
