"""Every worker and server process issues ids under a machine id of its own, leased in
the cluster database (flowtide.machines): the event ids in two workers' reports never
collide, whatever their WORKER_ID."""

from __future__ import annotations

import json
from collections import defaultdict

import psycopg

from flowtide.store import pg

from .stack import Stack

LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: machine_ids, path: tests/dist/machine_ids}
workflow:
  - step: fan
    loop:
      in: "{{ range(60) | list }}"
      iterator: item
      spec: {mode: parallel, max_in_flight: 16}
    tool: {kind: python, code: "result = {'n': item}"}
"""


def test_workers_report_under_machine_ids_of_their_own(stack: Stack) -> None:
    path = stack.root / "machine_ids.yaml"
    path.write_text(LOOP)
    # Both workers pulling before the loop starts: 16 in flight is more than one worker's
    # 8 slots, and a worker runs the next iteration in the slot its report frees.
    stack.wait_workers(2)
    proc = stack.run("run", path, "--json")
    doc = json.loads(proc.stdout)
    assert doc["status"] == "completed", doc
    events = json.loads(stack.run("events", doc["execution_id"], "--json").stdout)
    by_worker: dict[str, set[int]] = defaultdict(set)
    for event in events:
        if event.get("worker_id") and event["type"] in ("call.done", "command.completed"):
            by_worker[event["worker_id"]].add((int(event["event_id"]) >> 12) & 0x3FF)
    assert len(by_worker) == 2, by_worker  # both workers took part
    machines = [m for ms in by_worker.values() for m in ms]
    # One machine id per worker, not the same one.
    assert all(len(ms) == 1 for ms in by_worker.values()) and len(set(machines)) == 2
    with psycopg.connect(stack.db) as conn:
        holders = pg.machines.holders(conn)
    for worker_id, (machine,) in ((w, tuple(ms)) for w, ms in by_worker.items()):
        assert holders[machine].startswith(f"worker:{worker_id}:")
    # The server process holds one too, and its ids (the execution's) carry it. Servers
    # and workers draw from ranges of their own: no number of worker registrations can
    # take the ids a server needs to start.
    server_machine = (int(doc["execution_id"]) >> 12) & 0x3FF
    assert holders[server_machine].startswith("server:")
    assert server_machine in pg.machines.SERVER_IDS
    assert all(m in pg.machines.WORKER_IDS for m in machines)
    # The holder (the secret a worker renews its lease with) is in no event.
    assert not any(h in json.dumps(events) for h in holders.values())


def test_registering_again_cannot_hoard_machine_ids(stack: Stack) -> None:
    # A worker token that registers one worker id over and over holds one machine id,
    # not one per registration (1,024 registrations would otherwise starve every
    # process that needs one).
    replies = []
    with stack.client("worker") as client:
        for _ in range(5):
            r = client.post(
                "/api/worker/pool/register",
                json={"worker_id": "hoarder", "pool": "default", "concurrency": 1},
            )
            assert r.status_code == 200, r.text
            replies.append(r.json()["machine"])
        # A heartbeat with the holder of an earlier registration renews nothing: it is
        # given a fresh lease instead of sharing one.
        stale = replies[0]
        r = client.post(
            "/api/worker/pool/heartbeat",
            json={
                "worker_id": "hoarder",
                "machine": {"machine_id": stale["machine_id"], "holder": stale["holder"]},
            },
        )
        assert r.status_code == 200, r.text
        fresh = r.json()["machine"]
        assert fresh["holder"] != stale["holder"]
        # Another worker's holder is not this worker's to renew.
        r = client.post(
            "/api/worker/pool/heartbeat",
            json={
                "worker_id": "hoarder",
                "machine": {"machine_id": 1, "holder": "worker:someone-else:00"},
            },
        )
        assert r.json()["machine"]["holder"].startswith("worker:hoarder:")
    assert len({m["holder"] for m in replies}) == 5
    with psycopg.connect(stack.db) as conn:
        held = [h for h in pg.machines.holders(conn).values() if h.startswith("worker:hoarder:")]
    assert len(held) == 1
