"""The topology endpoint and the server registry on a real stack (one shard)."""

from __future__ import annotations

import signal

import psycopg

from flowtide.store import pg

from .stack import Stack


def test_topology_lists_the_shard_and_its_live_server(stack: Stack) -> None:
    with stack.client("reader") as client:
        r = client.get("/api/internal/shards/topology")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["shards"] == 1 and doc["source"] == "single"
    assert doc["self"]["shard"] == 0
    [shard] = doc["map"]
    assert shard["shard"] == 0
    password = stack.db.split(":")[2].split("@")[0]
    assert password not in r.text  # the database is shown without its password
    ours = [s for s in shard["servers"] if s["server_id"] == doc["self"]["server_id"]]
    assert ours and ours[0]["url"] == stack.url and ours[0]["heartbeat_age"] < 15
    # A worker may read it too (to find a shard's servers); nobody without a token.
    with stack.client("worker") as client:
        assert client.get("/api/internal/shards/topology").status_code == 200
    import httpx

    assert httpx.get(f"{stack.url}/api/internal/shards/topology").status_code == 401


def test_a_stopped_server_leaves_the_registry(stack: Stack) -> None:
    with psycopg.connect(stack.db) as conn:
        before = {s.server_id for s in pg.servers.live(conn, 15, forget_after=3600)}
    assert len(before) >= 1
    assert stack.server is not None
    stack.server.send_signal(signal.SIGTERM)
    stack.server.wait(timeout=30)  # uvicorn ends by re-raising SIGTERM, after shutdown
    with psycopg.connect(stack.db) as conn:
        after = {s.server_id for s in pg.servers.live(conn, 15, forget_after=3600)}
    assert not before & after
    stack.start_server()
