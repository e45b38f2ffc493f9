"""The topology endpoint and the server registry on a real stack (one shard)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

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


def test_gateway_config_from_the_registry(stack: Stack, tmp_path: Path) -> None:
    # Without --backend, the servers are the live ones the cluster database knows.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTIDE_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowtide.cli",
            "shards",
            "gateway-config",
            "--out",
            str(tmp_path),
            "--cluster-db",
            stack.db,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    config = (tmp_path / "haproxy.cfg").read_text()
    address = stack.url.removeprefix("http://")
    assert f"backend shard0\n    balance roundrobin\n    server s0_0 {address} " in config
    assert "SHARDS = 1" in (tmp_path / "flowtide_shard.lua").read_text()
