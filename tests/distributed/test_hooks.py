"""Webhooks on a cluster of two shards (a server each, real processes): a hook is its
shard's, and a delivery sent to either server (or to both at once) starts one run, on
that shard, recorded there with its firing; a bad signature is 401 on every server; the
secret is sealed in the cluster database, never in a response, an event or a log; and
`flowtide hook ... --server` manages hooks through the API."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from flowtide.sharding import shard_for
from flowtide.triggers.hooks import sign

from .stack import Stack, sharded
from .test_shards import _wait

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

from natsserver import NatsServer  # noqa: E402

SHARDS = 2
SECRET = "distributed-hook-secret-4b1d"

ECHO = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: dist_hook_echo, path: tests/hooks/dist_echo}
workload: {body: null, delivery: null}
workflow:
  - step: start
    tool:
      kind: python
      input: {body: "{{ body }}", delivery: "{{ delivery }}"}
      code: |
        result = {"got": body, "delivery": delivery}
"""


class HookCluster:
    def __init__(self, stacks: list[Stack], cluster_db: str, shard_dbs: list[str]) -> None:
        self.stacks = stacks
        self.cluster_db = cluster_db
        self.shard_dbs = shard_dbs
        #: A hook owned by each shard: name by shard index.
        self.owned: dict[int, str] = {}


@pytest.fixture(scope="module")
def cluster(pg_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HookCluster]:
    root = tmp_path_factory.mktemp("hooks")
    cluster_db = pg_server.create_database("hooks_cluster")
    shard_dbs = [pg_server.create_database(f"hooks_{i}") for i in range(SHARDS)]
    nats = NatsServer.start_secured(root / "nats", pools=("default",))
    stacks = sharded(cluster_db, shard_dbs, nats=nats.url, root=root, nats_users=nats.users)
    try:
        for s in stacks:
            s.start_server()
        stacks[0].start_worker(concurrency=4)
        found = HookCluster(stacks, cluster_db, shard_dbs)
        with stacks[0].client("operator") as api:
            r = api.post("/api/catalog/register", json={"content": ECHO})
            assert r.status_code in (200, 201), r.text
            # Hooks until each shard owns one (an id's shard is its hash's).
            for k in range(40):
                r = api.post(
                    "/api/hooks",
                    json={"name": f"h{k}", "playbook": "tests/hooks/dist_echo", "secret": SECRET},
                )
                assert r.status_code == 201, r.text
                shard = shard_for(int(r.json()["trigger_id"]), SHARDS)
                found.owned.setdefault(shard, f"h{k}")
                if len(found.owned) == SHARDS:
                    break
        assert len(found.owned) == SHARDS
        yield found
    finally:
        for s in stacks:
            s.stop()
        nats.stop()
        for name in ("hooks_cluster", *(f"hooks_{i}" for i in range(SHARDS))):
            pg_server.drop_database(name)


def _deliver(
    stack: Stack, name: str, body: bytes, delivery: str | None, secret: str = SECRET
) -> httpx.Response:
    headers = {
        "content-type": "application/json",
        "X-Flowtide-Signature": sign(secret.encode(), body),
    }
    if delivery is not None:
        headers["X-Flowtide-Delivery"] = delivery
    return httpx.post(f"{stack.url}/api/hooks/{name}", content=body, headers=headers, timeout=60)


def _firings(db: str, name: str, cluster_db: str) -> list[tuple[str, int]]:
    with psycopg.connect(cluster_db) as conn:
        row = conn.execute(
            "SELECT trigger_id FROM trigger_def WHERE kind = 'hook' AND name = %s", (name,)
        ).fetchone()
    assert row is not None
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT key, execution_id FROM trigger_firing WHERE trigger_id = %s ORDER BY key",
            (row[0],),
        ).fetchall()
    return [(str(k), int(e)) for k, e in rows]


@pytest.mark.parametrize("owner", [0, 1])
def test_one_delivery_sent_to_both_servers_starts_one_run_on_the_hooks_shard(
    cluster: HookCluster, owner: int
) -> None:
    name = cluster.owned[owner]
    other = 1 - owner
    ids = []
    for k in range(5):
        body = json.dumps({"n": k, "owner": owner}).encode()
        delivery = f"dup-{owner}-{k}"
        # The same delivery to both servers at once, twice each (a sender retrying).
        with ThreadPoolExecutor(4) as pool:
            answers = list(
                pool.map(
                    lambda s, b=body, d=delivery: _deliver(s, name, b, d),
                    [cluster.stacks[owner], cluster.stacks[other]] * 2,
                )
            )
        codes = sorted(r.status_code for r in answers)
        assert codes == [200, 200, 200, 202], [r.text for r in answers]
        assert len({r.json()["execution_id"] for r in answers}) == 1
        ids.append(answers[0].json()["execution_id"])
    with cluster.stacks[other].client("reader") as api:
        for k, eid in enumerate(ids):
            assert shard_for(int(eid), SHARDS) == owner
            doc = _wait(api, eid)
            assert doc["status"] == "completed", doc
            assert doc["result"]["got"] == {"n": k, "owner": owner}
            assert doc["trigger"] == {"kind": "hook", "name": name, "delivery": f"dup-{owner}-{k}"}
        page = api.get(f"/api/hooks/{name}").json()
        assert {d["delivery"] for d in page["deliveries"]} == {f"dup-{owner}-{k}" for k in range(5)}
    # The firings and the runs are the owner's shard's, nowhere else.
    firings = _firings(cluster.shard_dbs[owner], name, cluster.cluster_db)
    assert sorted(e for _, e in firings) == sorted(int(e) for e in ids)
    assert _firings(cluster.shard_dbs[other], name, cluster.cluster_db) == []


def test_bad_signatures_are_401_on_every_server_and_start_nothing(cluster: HookCluster) -> None:
    body = b'{"x": 1}'
    for stack in cluster.stacks:
        for name in (*cluster.owned.values(), "no-such-hook"):
            r = _deliver(stack, name, body, "bad-1", secret="not the secret")
            assert r.status_code == 401, r.text
            unsigned = httpx.post(f"{stack.url}/api/hooks/{name}", content=body, timeout=30)
            assert unsigned.status_code == 401
            assert unsigned.json()["error"]["message"] == "delivery refused: no signature"
    for owner, name in cluster.owned.items():
        assert all(
            k != "bad-1" for k, _ in _firings(cluster.shard_dbs[owner], name, cluster.cluster_db)
        )
        # The owner's server kept the refusals, with why.
        with cluster.stacks[1 - owner].client("reader") as api:
            refused = api.get(f"/api/hooks/{name}").json()["refused"]
        assert any(r["why"] == "delivery refused: bad signature" for r in refused)


def test_the_secret_is_sealed_and_never_shown(cluster: HookCluster) -> None:
    name = cluster.owned[1]
    r = _deliver(cluster.stacks[0], name, b'{"s": 1}', "secret-1")
    assert r.status_code in (200, 202), r.text
    eid = r.json()["execution_id"]
    with cluster.stacks[0].client("admin") as api:
        _wait(api, eid)
        texts = [
            api.get("/api/hooks").text,
            api.get(f"/api/hooks/{name}").text,
            api.get(f"/api/executions/{eid}").text,
            api.get(f"/api/executions/{eid}/events").text,
        ]
    for text in texts:
        assert SECRET not in text
    with psycopg.connect(cluster.cluster_db) as conn:
        for (sealed,) in conn.execute("SELECT secret FROM trigger_def"):
            assert SECRET.encode() not in bytes(sealed)
    for db in cluster.shard_dbs:
        with psycopg.connect(db) as conn:
            (hits,) = conn.execute(
                "SELECT count(*) FROM event WHERE payload::text LIKE %s", (f"%{SECRET}%",)
            ).fetchone() or (0,)
            assert hits == 0
    for stack in cluster.stacks:
        assert SECRET not in (stack.root / f"{stack.name}.log").read_text(errors="replace")


def test_the_cli_manages_hooks_through_the_api(cluster: HookCluster, tmp_path: Path) -> None:
    stack = cluster.stacks[1]
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    added = stack.run(
        "hook",
        "add",
        "cli-hook",
        "tests/hooks/dist_echo",
        "--secret-file",
        secret,
        "--rate",
        "20/s",
    )
    assert added.returncode == 0, added.stderr
    listed = stack.run("hook", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    hook = next(h for h in json.loads(listed.stdout) if h["name"] == "cli-hook")
    assert hook["rate"] == 20.0
    r = _deliver(cluster.stacks[0], "cli-hook", b'{"via": "cli"}', "cli-1")
    assert r.status_code == 202, r.text
    with stack.client("reader") as api:
        assert _wait(api, r.json()["execution_id"])["result"]["got"] == {"via": "cli"}
    shown = stack.run("hook", "show", "cli-hook")
    assert shown.returncode == 0 and "cli-1" in shown.stdout, shown.stderr
    # A file is the CLI's machine's: a server takes catalog playbooks only.
    filed = stack.run("hook", "add", "f", str(secret), "--secret-file", secret)
    assert filed.returncode != 0
    deleted = stack.run("hook", "delete", "cli-hook")
    assert deleted.returncode == 0, deleted.stderr
    # The servers reuse what they read of a hook for 2 s at most: then it is gone.
    deadline = time.monotonic() + 10
    k = 0
    while _deliver(cluster.stacks[0], "cli-hook", b"{}", f"cli-gone-{k}").status_code != 401:
        assert time.monotonic() < deadline, "a deleted hook still takes deliveries"
        k += 1
        time.sleep(0.5)
    for out in (added, listed, shown, deleted):
        assert SECRET not in out.stdout + out.stderr
