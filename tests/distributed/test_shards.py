"""A cluster of two shards on real processes: a cluster database and shard 0's on one
PostgreSQL server, shard 1's on a PostgreSQL server of its own (so that it can be
stopped), one `flowtide server` per shard, workers that talk to shard 0's
server only, a nats-server with flowtide's users. What it shows: executions live on
their shard and nowhere else, any server answers for any execution (forwarding, SSE and
cancel included), workers' claims and reports reach the owner, sub-playbooks start on
their parent's shard, the cluster-wide list is whole or says which shard is missing, and
a shard whose database is down stops only its own executions, which go on when it is back.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from flowtide.sharding import shard_for
from subplaybooks import PARENT as PARENT_OF_SLOW
from subplaybooks import SLOW_CHILD

from .stack import Stack, sharded

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

from natsserver import NatsServer  # noqa: E402

SHARDS = 2
#: The per-execution tables: an execution's rows are in its shard's database only.
PER_EXECUTION = ("execution", "event", "command", "outbox", "variable")

LOOPED = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: sharded, path: tests/sharded}
workload: {n: 0}
workflow:
  - step: start
    loop:
      in: "{{ [1, 2, 3] }}"
      iterator: x
    tool:
      kind: python
      input: {x: "{{ x }}", n: "{{ workload.n }}"}
      code: |
        result = {"v": x * 10 + n}
    next:
      - step: total
  - step: total
    tool:
      kind: python
      input: {parts: "{{ start }}"}
      code: |
        result = {"sum": sum(r["v"] for r in parts["results"])}
"""

SLOW = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: slow, path: tests/slow}
workflow:
  - step: work
    loop:
      in: "{{ range(300) | list }}"
      iterator: i
      spec: {mode: sequential}
    tool:
      kind: python
      code: |
        import time
        time.sleep(0.05)
        result = {"ok": True}
"""

CHILD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: child, path: tests/shard_child}
workload: {value: 0}
workflow:
  - step: compute
    tool:
      kind: python
      input: {value: "{{ workload.value }}"}
      code: |
        result = {"answer": value * 2}
"""

PARENT = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: parent, path: tests/shard_parent}
workflow:
  - step: call
    tool:
      kind: playbook
      path: tests/shard_child
      return_step: compute
      input: {value: 21}
"""


class Cluster:
    def __init__(
        self, stacks: list[Stack], cluster_db: str, shard_dbs: list[str], second: Any
    ) -> None:
        self.stacks = stacks
        self.cluster_db = cluster_db
        self.shard_dbs = shard_dbs
        #: Shard 1's PostgreSQL server.
        self.second = second

    def client(self, shard: int, role: str = "admin") -> httpx.Client:
        return self.stacks[shard].client(role)

    def rows(self, db: str, execution_id: int) -> dict[str, int]:
        """The per-execution rows `db` holds for `execution_id`, by table."""
        out = {}
        with psycopg.connect(db) as conn:
            for table in PER_EXECUTION:
                (n,) = conn.execute(
                    f"SELECT count(*) FROM {table} WHERE execution_id = %s",  # noqa: S608
                    (execution_id,),
                ).fetchone() or (0,)
                out[table] = n
        return out


@pytest.fixture(scope="module")
def cluster(pg_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("shards")
    from pgserver import PgServer

    cluster_db = pg_server.create_database("shards_cluster")
    second = PgServer.start()
    shard_dbs = [pg_server.create_database("shards_0"), second.create_database("shards_1")]

    nats = NatsServer.start_secured(root / "nats", pools=("default",))
    stacks = sharded(cluster_db, shard_dbs, nats=nats.url, root=root, nats_users=nats.users)
    try:
        for s in stacks:
            s.start_server()
        # The workers know shard 0's server only: what is another shard's goes through it.
        stacks[0].start_worker(concurrency=8)
        stacks[0].start_worker(concurrency=8)
        yield Cluster(stacks, cluster_db, shard_dbs, second)
    finally:
        for s in stacks:
            s.stop()
        nats.stop()
        second.stop()
        for name in ("shards_cluster", "shards_0"):
            pg_server.drop_database(name)


def _wait(client: httpx.Client, eid: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.get(f"/api/executions/{eid}/status")
        if r.status_code == 503:  # a shard's database coming back
            time.sleep(0.2)
            continue
        assert r.status_code == 200, r.text
        if r.json()["status"] != "running":
            return client.get(f"/api/executions/{eid}").json()  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"execution {eid} did not finish: {r.text}")


def test_executions_run_on_their_shard_and_nowhere_else(cluster: Cluster) -> None:
    started: list[tuple[int, str]] = []
    clients = [cluster.client(i) for i in range(SHARDS)]
    try:
        # Any server takes a new execution for the shard asked for.
        for n in range(24):
            k = n % SHARDS
            r = clients[k].post(
                "/api/execute", json={"playbook": LOOPED, "payload": {"n": n}, "shard": k}
            )
            assert r.status_code == 201, r.text
            eid = r.json()["execution_id"]
            assert shard_for(int(eid), SHARDS) == k
            started.append((n, eid))
        for n, eid in started:
            # Read through the other shard's server: forwarded to the owner.
            other = clients[(shard_for(int(eid), SHARDS) + 1) % SHARDS]
            doc = _wait(other, eid)
            assert doc["status"] == "completed", doc
            assert doc["steps"]["total"]["result"] == {"sum": 60 + 3 * n}
    finally:
        for c in clients:
            c.close()
    for _, eid in started:
        owner = shard_for(int(eid), SHARDS)
        here = cluster.rows(cluster.shard_dbs[owner], int(eid))
        # Three iterations and `total`: at least three commands (a chunk of the loop's
        # iterations is one).
        assert here["execution"] == 1 and here["event"] > 5 and here["command"] >= 3, here
        for i, db in enumerate(cluster.shard_dbs):
            if i != owner:
                assert set(cluster.rows(db, int(eid)).values()) == {0}, (eid, i)
    # The cluster database holds no execution's rows.
    with psycopg.connect(cluster.cluster_db) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        }
    assert not tables & set(PER_EXECUTION), tables


def test_a_request_to_the_wrong_shard_is_forwarded_sse_and_cancel_included(
    cluster: Cluster,
) -> None:
    with cluster.client(1) as one, cluster.client(0) as zero:
        eid = one.post("/api/execute", json={"playbook": SLOW, "shard": 1}).json()["execution_id"]
        assert shard_for(int(eid), SHARDS) == 1
        # The stream, through shard 0's server, arrives while the loop runs.
        seen: list[str] = []
        with zero.stream("GET", f"/api/executions/{eid}/events/stream", timeout=30) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    seen.append(json.loads(line[5:])["type"])
                if seen.count("command.completed") >= 3:
                    break
        assert seen[0] == "playbook.initialized"
        r = zero.post(f"/api/executions/{eid}/cancel", json={"reason": "through shard 0"})
        assert r.status_code == 200, r.text
        doc = _wait(zero, eid)
        assert doc["status"] == "cancelled"
        done = zero.get(f"/api/executions/{eid}/events").json()
        assert sum(e["type"] == "command.completed" for e in done) < 250
        # The forwarding server counts what it sent on.
        metrics = zero.get("/metrics").text
        assert 'flowtide_forwarded_requests_total{outcome="answered",shard="1"}' in metrics
        # A body or a query that names the execution is forwarded by its route.
        issued = next(e for e in done if e["type"] == "command.issued")
        r = zero.get(
            f"/api/commands/{issued['event_id']}",
            params={"execution_id": eid, "command_id": issued["command_id"]},
        )
        assert r.status_code == 200 and r.json()["command_id"] == issued["command_id"], r.text
        # Nothing is forwarded before the caller is authenticated, and the owner
        # authorises the caller again: a reader may not cancel through another shard.
        import httpx as plain

        r = plain.get(f"{cluster.stacks[0].url}/api/executions/{eid}", timeout=10)
        assert r.status_code == 401
        with cluster.client(0, role="reader") as reader:
            r = reader.post(f"/api/executions/{eid}/cancel", json={"reason": "no"})
            assert r.status_code == 403, r.text
            assert reader.get(f"/api/executions/{eid}/status").status_code == 200
        # A request that was forwarded once is not forwarded again: 421.
        r = zero.get(f"/api/executions/{eid}", headers={"X-Flowtide-Forwarded": "x"})
        assert r.status_code == 421 and "shard 1" in r.json()["error"]["message"]
        # A routing header that names no shard is refused, not guessed.
        r = zero.post("/api/commands/claim", headers={"X-Flowtide-Shard": "7"}, json={})
        assert r.status_code == 400 and "no shard 7" in r.text


def test_a_sub_playbook_starts_on_its_parents_shard(cluster: Cluster) -> None:
    with cluster.client(1) as one, cluster.client(0) as zero:
        assert zero.post("/api/catalog/register", json={"content": CHILD}).status_code < 300
        # Parents on both shards; the workers reach shard 0's server only.
        parents = [
            c.post("/api/execute", json={"playbook": PARENT, "shard": i}).json()["execution_id"]
            for i, c in enumerate((zero, one))
        ]
        for parent in parents:
            doc = _wait(zero, parent)
            assert doc["status"] == "completed", doc
            assert doc["steps"]["call"]["result"] == {"answer": 42}
        children = [
            item
            for item in zero.get("/api/executions", params={"limit": 100}).json()["items"]
            if item["parent_execution_id"] in parents
        ]
        assert len(children) == 2
        for child in children:
            assert shard_for(int(child["execution_id"]), SHARDS) == shard_for(
                int(child["parent_execution_id"]), SHARDS
            )


def test_the_list_is_cluster_wide_and_names_a_missing_shard(cluster: Cluster) -> None:
    with cluster.client(0) as zero, cluster.client(1) as one:
        everything = []
        for server in (zero, one):
            before = None
            seen: list[str] = []
            while True:
                params: dict[str, Any] = {"limit": 7}
                if before:
                    params["before"] = before
                page = server.get("/api/executions", params=params).json()
                assert page["unavailable_shards"] == []
                seen.extend(item["execution_id"] for item in page["items"])
                before = page["next_before"]
                if before is None:
                    break
            assert len(seen) == len(set(seen)), "an execution came twice"
            assert seen == sorted(seen, key=int, reverse=True)
            everything.append(seen)
        assert everything[0] == everything[1]
        shards = {shard_for(int(e), SHARDS) for e in everything[0]}
        assert shards == set(range(SHARDS)) and len(everything[0]) >= 24
        # The outbox backlog is the cluster's too, with each shard's own.
        backlog = zero.get("/api/internal/outbox/pending-count").json()
        assert [s["shard"] for s in backlog["shards"]] == [0, 1], backlog
        assert backlog["pending"] == sum(s["pending"] for s in backlog["shards"])
        one_shard = zero.get(
            "/api/internal/outbox/pending-count", headers={"X-Flowtide-Shard": "1"}
        )
        assert set(one_shard.json()) == {"pending", "oldest_age_seconds"}, one_shard.text
        # The topology: both shards answer, each with its own estimate.
        topo = zero.get("/api/internal/shards/topology").json()
        assert [(m["shard"], m["healthy"]) for m in topo["map"]] == [(0, True), (1, True)]
        # Shard 1's server gone: shard 0's own executions still listed, shard 1 named.
        cluster.stacks[1].kill_server()
        try:
            topo = zero.get("/api/internal/shards/topology").json()
            assert [(m["shard"], m["healthy"]) for m in topo["map"]] == [(0, True), (1, False)]
            assert "shard 1" in topo["map"][1]["error"]
            backlog = zero.get("/api/internal/outbox/pending-count").json()
            assert [s["shard"] for s in backlog["unavailable_shards"]] == [1], backlog
            page = zero.get("/api/executions", params={"limit": 500}).json()
            assert [u["shard"] for u in page["unavailable_shards"]] == [1]
            assert {shard_for(int(i["execution_id"]), SHARDS) for i in page["items"]} == {0}
            lost = next(e for e in everything[0] if shard_for(int(e), SHARDS) == 1)
            r = zero.get(f"/api/executions/{lost}")
            assert r.status_code == 503 and "shard 1" in r.json()["error"]["message"]
        finally:
            cluster.stacks[1].start_server()
        page = zero.get("/api/executions", params={"limit": 500}).json()
        assert page["unavailable_shards"] == []


def test_a_shard_whose_database_is_down_stops_only_its_own_executions(cluster: Cluster) -> None:
    from flowtide.dev.postgres import LocalPostgres

    counted = SLOW.replace("range(300)", "range(40)").replace("tests/slow", "tests/slow40")
    with cluster.client(0) as zero, cluster.client(1) as one:
        eid = one.post("/api/execute", json={"playbook": counted, "shard": 1}).json()[
            "execution_id"
        ]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            events = zero.get(f"/api/executions/{eid}/events").json()
            if sum(e["type"] == "command.completed" for e in events) >= 5:
                break
            time.sleep(0.1)
        LocalPostgres.stop(cluster.second)
        try:
            # The topology says which shard is sick, and why.
            topo = zero.get("/api/internal/shards/topology").json()
            assert [(m["shard"], m["healthy"]) for m in topo["map"]] == [(0, True), (1, False)]
            assert topo["map"][1]["error"].startswith("shard 1:"), topo
            # Shard 0 starts, runs and finishes its executions meanwhile, each in well
            # under the pool's 10 s wait (shard 1's steps once held their threads that
            # long on each report, and shard 0's runs took 10 s instead of 0.2).
            for n in range(3):
                began = time.monotonic()
                started = zero.post(
                    "/api/execute", json={"playbook": LOOPED, "payload": {"n": n}}
                ).json()["execution_id"]
                doc = _wait(zero, started, timeout=60)
                assert doc["status"] == "completed", doc
                assert doc["steps"]["total"]["result"] == {"sum": 60 + 3 * n}
                assert time.monotonic() - began < 8.0, f"run {n} of shard 0 was held up"
            # Shard 1's executions: a 503 that names the shard, from either server, and
            # at once (a probe connect, not the 10 s wait for a pooled connection).
            for server in (zero, one):
                began = time.monotonic()
                r = server.get(f"/api/executions/{eid}/status")
                assert r.status_code == 503, r.text
                assert r.json()["error"]["message"].startswith("shard 1:"), r.text
                assert time.monotonic() - began < 5.0
        finally:
            LocalPostgres.start(cluster.second, durable=False)
        # Back: it goes on where it was and ends with every iteration once.
        doc = _wait(zero, eid, timeout=120)
        assert doc["status"] == "completed", doc
        assert doc["steps"]["work"]["result"]["stats"] == {
            "total": 40,
            "success": 40,
            "failed": 0,
        }


def test_kill_9_of_a_shards_server_mid_loop_still_gives_exact_results(cluster: Cluster) -> None:
    loop = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: killed, path: tests/killed}
workflow:
  - step: work
    loop:
      in: "{{ range(120) | list }}"
      iterator: i
      spec: {max_in_flight: 8}
    tool:
      kind: python
      input: {i: "{{ i }}"}
      code: |
        import time
        time.sleep(0.05)
        result = {"index": i}
"""
    with cluster.client(0) as zero, cluster.client(1) as one:
        eid = one.post("/api/execute", json={"playbook": loop, "shard": 1}).json()["execution_id"]
        assert shard_for(int(eid), SHARDS) == 1
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            events = zero.get(f"/api/executions/{eid}/events").json()
            if sum(e["type"] == "command.completed" for e in events) >= 20:
                break
            time.sleep(0.05)
        cluster.stacks[1].kill_server()
        time.sleep(1.0)
        cluster.stacks[1].start_server()
        doc = _wait(zero, eid, timeout=120)
        assert doc["status"] == "completed", doc
        results = doc["steps"]["work"]["result"]["results"]
        assert sorted(r["index"] for r in results) == list(range(120))
        events = zero.get(f"/api/executions/{eid}/events").json()
        indexes = [e["payload"]["loop_index"] for e in events if e["type"] == "command.completed"]
        assert sorted(indexes) == list(range(120)), "each iteration is recorded exactly once"


def test_cancel_through_another_shard_goes_down_to_the_sub_playbook(cluster: Cluster) -> None:
    with cluster.client(0) as zero, cluster.client(1) as one:
        assert zero.post("/api/catalog/register", json={"content": SLOW_CHILD}).status_code < 300
        pid = one.post("/api/execute", json={"playbook": PARENT_OF_SLOW, "shard": 1}).json()[
            "execution_id"
        ]
        child = None
        deadline = time.monotonic() + 60
        while child is None and time.monotonic() < deadline:
            for item in zero.get("/api/executions", params={"limit": 50}).json()["items"]:
                if item["parent_execution_id"] == pid:
                    child = item["execution_id"]
            time.sleep(0.1)
        assert child is not None, "the sub-playbook never started"
        r = zero.post(f"/api/executions/{pid}/cancel", json={"reason": "from shard 0"})
        assert r.status_code == 200, r.text
        assert _wait(zero, pid)["status"] == "cancelled"
        assert _wait(zero, child)["status"] == "cancelled"
        # It stopped early: a 200-iteration loop at 50 ms each would run for 10 s.
        done = zero.get(f"/api/executions/{child}/events").json()
        assert sum(e["type"] == "command.completed" for e in done) < 150


def _forwarded(client: httpx.Client) -> float:
    """What this server forwarded so far (all shards, all outcomes)."""
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("flowtide_forwarded_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_through_a_gateway_requests_and_workers_reach_the_owner_directly(
    cluster: Cluster, tmp_path: Path
) -> None:
    import signal
    import socket
    import subprocess

    from gateway.launch import start

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Each shard's server, named (the registry may still list a server killed earlier in
    # this module for a few seconds: round robin over it would skew the spread).
    backends = [f"--backend={i}={s.url}" for i, s in enumerate(cluster.stacks)]
    gateway = start("haproxy", tmp_path, port, backends)
    stack = cluster.stacks[0]
    old = list(stack.workers)
    for proc in old:
        proc.send_signal(signal.SIGTERM)
    for proc in old:
        proc.wait(timeout=30)
    url = f"http://127.0.0.1:{port}"
    worker = stack.start_worker(concurrency=8, server=url)
    servers = [cluster.client(i) for i in range(SHARDS)]
    try:
        # Give the new worker its first heartbeats, then count from here.
        time.sleep(1.0)
        before = [_forwarded(c) for c in servers]
        with httpx.Client(base_url=url, headers=stack.headers(), timeout=30) as through:
            started = []
            for n in range(40):
                r = through.post("/api/execute", json={"playbook": LOOPED, "payload": {"n": n}})
                assert r.status_code == 201, r.text
                started.append((n, r.json()["execution_id"]))
            on = [shard_for(int(eid), SHARDS) for _, eid in started]
            assert 0.4 <= on.count(0) / len(on) <= 0.6, on  # the shards in turn
            for n, eid in started:
                doc = _wait(through, eid)
                assert doc["status"] == "completed", doc
                assert doc["steps"]["total"]["result"] == {"sum": 60 + 3 * n}
        # Claims, reports and heartbeats went straight to the owner: only creates were
        # forwarded (each placed on the next shard in turn, one hop at most).
        after = [_forwarded(c) for c in servers]
        assert sum(after) - sum(before) <= len(started), (before, after)
    finally:
        for c in servers:
            c.close()
        gateway.terminate()
        gateway.wait(timeout=10)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        stack.workers = [w for w in stack.workers if w not in (*old, worker)]
        stack.start_worker(concurrency=8)
        stack.start_worker(concurrency=8)


def test_executions_spread_over_the_shards_whichever_server_takes_them(cluster: Cluster) -> None:
    """Issue 31: every execution started through one server (a client whose keep-alive
    connection sticks to it) used to land on that server's shard."""
    at_once = "workflow:\n  - step: start\n    set: {ctx.done: true}\n"
    on: list[int] = []
    with cluster.client(0) as zero:
        for _ in range(200):
            r = zero.post("/api/execute", json={"playbook": at_once})
            assert r.status_code == 201, r.text
            on.append(shard_for(int(r.json()["execution_id"]), SHARDS))
        assert on.count(0) == on.count(1) == 100, on  # in turn: exactly even
        # A shard asked for is the shard it runs on; one the cluster lacks is a 400.
        r = zero.post("/api/execute", json={"playbook": at_once, "shard": 1})
        assert shard_for(int(r.json()["execution_id"]), SHARDS) == 1
        r = zero.post("/api/execute", json={"playbook": at_once, "shard": SHARDS})
        assert r.status_code == 400 and "the cluster has" in r.text, r.text
