"""A server whose shards come from the cluster database's map (`shard_endpoint`, phase G)
reads the map again while it serves: a shard moved to a new address is used there without
a restart and without a failed request; a changed number of shards is refused and the
map kept; SIGHUP reads it at once (and does not stop the server)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .stack import Stack, flowtide_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

from natsserver import NatsServer  # noqa: E402

LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: moving, path: tests/moving}
workflow:
  - step: work
    loop:
      in: "{{ range(60) | list }}"
      iterator: i
      spec: {mode: sequential}
    tool:
      kind: python
      input: {i: "{{ i }}"}
      code: |
        import time
        time.sleep(0.05)
        result = {"i": i}
"""


class Mapped:
    def __init__(self, stack: Stack, cluster: str, env: dict[str, str], pg: Any) -> None:
        self.stack = stack
        self.cluster = cluster
        self.env = env
        self.pg = pg

    def ft(self, *args: str, flag: str = "--cluster-db") -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "flowtide.cli", *args, flag, self.cluster],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    def topology(self) -> dict[str, Any]:
        with self.stack.client("reader") as client:
            r = client.get("/api/internal/shards/topology")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def mapped(pg_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mapped]:
    root = tmp_path_factory.mktemp("shardmap")
    cluster = pg_server.create_database("map_cluster")
    shard = pg_server.create_database("map_s0")
    spare = pg_server.create_database("map_s1")
    env = flowtide_env(root / "home")
    nats = NatsServer.start_secured(root / "nats", pools=("default",))
    stack = Stack(
        db=cluster,
        nats=nats.url,
        root=root,
        nats_users=nats.users,
        db_args=("--cluster-db", cluster),
    )
    m = Mapped(stack, cluster, env, pg_server)
    try:
        login = json.dumps({"user": pg_server.user, "password": pg_server.password})
        m.ft("db", "upgrade")
        m.ft("credential", "set", "shard_login", "--json", login, "--kind", "postgres", flag="--db")
        for index, dsn in ((0, shard), (1, spare)):
            m.ft(
                "shards",
                "add",
                str(index),
                "--host",
                "127.0.0.1",
                "--port",
                str(pg_server.port),
                "--database",
                dsn.rsplit("/", 1)[1],
                "--credential",
                "shard_login",
            )
        # Migrated through the map, then the second row put aside: a one-shard cluster.
        m.ft("db", "upgrade")
        m.ft("shards", "set", "1", "--inactive")
        from flowtide.auth.tokens import TokenStore
        from flowtide.store.postgres import PostgresStore

        with PostgresStore(shard, cluster_dsn=cluster, max_size=2) as store:
            for role in ("admin", "reader", "worker"):
                stack.tokens[role], _ = TokenStore(store).create(role=role, name=f"map-{role}")
        stack.start_server()
        stack.start_worker(concurrency=4)
        yield m
    finally:
        stack.stop()
        nats.stop()
        for name in ("map_cluster", "map_s0", "map_s1"):
            pg_server.drop_database(name)


def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_a_moved_shard_is_used_at_its_new_address_without_a_failed_request(
    mapped: Mapped,
) -> None:
    before = mapped.topology()
    assert before["source"] == "table" and before["shards"] == 1
    assert "127.0.0.1" in before["map"][0]["database"]
    failures: list[str] = []
    stop = threading.Event()
    with mapped.stack.client() as client:
        eid = client.post("/api/execute", json={"playbook": LOOP}).json()["execution_id"]

        def hammer() -> None:
            with mapped.stack.client() as c:
                while not stop.is_set():
                    r = c.get(f"/api/executions/{eid}/status")
                    if r.status_code != 200:
                        failures.append(f"{r.status_code} {r.text[:200]}")
                    time.sleep(0.02)

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            # The same database under another name: what a move looks like to a server.
            mapped.ft("shards", "set", "0", "--host", "localhost")
            _until(
                lambda: "localhost" in mapped.topology()["map"][0]["database"],
                20,
                "the server took the moved shard",
            )
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                doc = client.get(f"/api/executions/{eid}").json()
                if doc["status"] != "running":
                    break
                time.sleep(0.2)
        finally:
            stop.set()
            thread.join()
    assert doc["status"] == "completed", doc
    results = doc["steps"]["work"]["result"]["results"]
    assert sorted(r["i"] for r in results) == list(range(60))
    assert failures == []


def test_a_changed_number_of_shards_is_refused_and_sighup_reads_the_map(mapped: Mapped) -> None:
    mapped.ft("shards", "set", "1", "--active")
    problem = _until(
        lambda: mapped.topology()["map_problem"], 20, "the server refused the second shard"
    )
    assert "now has 2 shards" in problem and "started with 1" in problem
    topo = mapped.topology()
    assert topo["shards"] == 1  # the map it had
    with mapped.stack.client() as client:
        r = client.post("/api/execute", json={"playbook": LOOP.replace("range(60)", "range(2)")})
        assert r.status_code == 201, r.text
    mapped.ft("shards", "set", "1", "--inactive")
    server = mapped.stack.server
    assert server is not None
    server.send_signal(signal.SIGHUP)
    _until(lambda: mapped.topology()["map_problem"] is None, 4, "SIGHUP read the map")
    assert server.poll() is None, "SIGHUP stopped the server"
