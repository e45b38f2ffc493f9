"""Subscriptions on real processes: two servers of one shard share a JetStream durable
consumer (their listeners pull from it) on a NATS of the application's (reached through
a credential, `auth:`), and one of them is killed (`kill -9`) mid-stream and started
again. What it shows: every message starts exactly one execution with its payload, the
messages the killed server held come back (ack wait) and start nothing twice, and the
subscription's API (read by another server) shows the firings."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .stack import Stack, _free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

from natsserver import NatsServer  # noqa: E402

NOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: sub, path: tests/dist/sub}
workload: {n: none}
workflow:
  - step: start
    tool: {kind: noop}
"""

MESSAGES = 600


class Pair:
    def __init__(self, stacks: list[Stack], events: NatsServer) -> None:
        self.stacks = stacks
        self.events = events

    def runs(self, name: str) -> list[tuple[str, dict[str, Any]]]:
        with psycopg.connect(self.stacks[0].db) as conn:
            rows = conn.execute(
                "SELECT trigger_key, workload FROM execution"
                " WHERE trigger_kind = 'subscription' AND trigger_name = %s",
                (name,),
            ).fetchall()
        return [(str(k), w if isinstance(w, dict) else json.loads(w)) for k, w in rows]


@pytest.fixture(scope="module")
def pair(pg_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("subs")
    db = pg_server.create_database("subs_dist")
    nats = NatsServer.start_secured(root / "nats", pools=("default",))
    events = NatsServer.start(root / "events")
    first = Stack(db=db, nats=nats.url, root=root, nats_users=nats.users, lease=3.0)
    twin = replace(first, name="server_b", port=_free_port(), server=None, workers=[], logs=[])
    try:
        first.start_server()
        twin.start_server()
        first.start_worker(concurrency=16)
        path = root / "sub.yaml"
        path.write_text(NOOP)
        assert first.run("catalog", "register", path).returncode == 0
        yield Pair([first, twin], events)
    finally:
        for s in (twin, first):
            s.stop()
        events.stop()
        nats.stop()
        pg_server.drop_database("subs_dist")


async def _publish(url: str, count: int) -> None:
    import nats as nats_py

    nc = await nats_py.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.new"])
        for i in range(count):
            await js.publish("orders.new", json.dumps({"n": i}).encode())
    finally:
        await nc.close()


async def _consumer(url: str) -> tuple[int, int]:
    import nats as nats_py

    nc = await nats_py.connect(url)
    try:
        info = await nc.jetstream().consumer_info("ORDERS", "flowtide-sub-orders")
        return int(info.num_pending or 0), int(info.num_ack_pending or 0)
    finally:
        await nc.close()


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_each_message_starts_one_run_with_a_server_killed(pair: Pair) -> None:
    a, b = pair.stacks
    asyncio.run(_publish(pair.events.url, MESSAGES))
    with a.client("admin") as admin:
        r = admin.post(
            "/api/credentials",
            json={"name": "orders_nats", "kind": "nats", "data": {"url": pair.events.url}},
        )
        assert r.status_code in (200, 201), r.text
    with a.client("operator") as api:
        r = api.post(
            "/api/subscriptions",
            json={
                "name": "orders",
                "playbook": "tests/dist/sub",
                "auth": "orders_nats",
                "stream": "ORDERS",
                "ack_wait": "2s",
                "workload": {"n": "{{ message.data.n }}"},
            },
        )
        assert r.status_code == 201, r.text
        assert r.json()["consumer"] == "flowtide-sub-orders"
    _wait(lambda: len(pair.runs("orders")) >= MESSAGES // 4, 60, "the first runs")
    b.kill_server()  # it holds fetched messages, some with runs created and not acked
    assert len(pair.runs("orders")) < MESSAGES, "the kill came too late to matter"
    b.start_server()
    _wait(lambda: len(pair.runs("orders")) >= MESSAGES, 60, "every run")
    _wait(lambda: asyncio.run(_consumer(pair.events.url)) == (0, 0), 30, "every message acked")
    time.sleep(2.5)  # one more ack wait: anything unacked would be redelivered by now
    runs = pair.runs("orders")
    keys = Counter(k for k, _ in runs)
    assert len(runs) == MESSAGES and max(keys.values()) == 1, keys.most_common(3)
    assert set(keys) == {f"ORDERS:{seq}" for seq in range(1, MESSAGES + 1)}
    by_key = dict(runs)
    assert all(str(by_key[f"ORDERS:{i + 1}"]["n"]) == str(i) for i in range(MESSAGES))
    with b.client("reader") as api:
        doc = api.get("/api/subscriptions/orders").json()
        assert doc["auth"] == "orders_nats" and doc["firings"], doc
        assert {f["status"] for f in doc["firings"]} == {"started"}
        # The credential's body never shows.
        assert pair.events.url not in json.dumps(doc)
        listed = api.get("/api/subscriptions").json()["items"]
        assert [i["name"] for i in listed] == ["orders"]
        refused = api.post("/api/subscriptions/orders/pause")
        assert refused.status_code == 403
