"""Faults on the distributed stack: a worker killed mid-loop, concurrent claimers,
cancellation, and bad API input."""

from __future__ import annotations

import concurrent.futures
import signal
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from flowtide.ids import Snowflake
from subplaybooks import PARENT, SLOW_CHILD

from .stack import Stack

LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: kill_loop, path: tests/dist/kill_loop}
workload: {count: 500, pause: 0.25}
workflow:
  - step: work
    loop:
      in: "{{ range(count) | list }}"
      iterator: item
      spec: {mode: parallel, max_in_flight: 16}
    tool:
      kind: python
      input: {index: "{{ item }}", pause: "{{ pause }}"}
      code: |
        import time
        time.sleep(pause)
        result = {"index": index}
"""

ONE_STEP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: one, path: tests/dist/one}
workflow:
  - step: only
    tool: {kind: python, code: "result = {'ok': True}"}
"""


def _wait(client: httpx.Client, eid: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = client.get(f"/api/executions/{eid}").json()
        if doc["status"] != "running":
            return dict(doc)
        time.sleep(0.1)
    raise AssertionError(f"execution {eid} still running after {timeout}s")


def _events(client: httpx.Client, eid: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 10_000}
        if after:
            params["after"] = after
        page = client.get(f"/api/executions/{eid}/events", params=params).json()
        if not page:
            return out
        out.extend(page)
        after = page[-1]["event_id"]


def test_kill_9_worker_mid_loop_loses_and_duplicates_nothing(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        eid = client.post("/api/execute", json={"playbook": LOOP}).json()["execution_id"]
        # Let both workers get going, then kill one without warning while it holds
        # claimed commands.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            events = _events(client, eid)
            done = {e["command_id"] for e in events if e["type"] == "command.completed"}
            held = {
                e["command_id"]
                for e in events
                if e["type"] == "command.claimed" and e["worker_id"] == "w0"
            } - done
            if len(done) >= 100 and held:
                break
            time.sleep(0.02)
        victim = stack.workers[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        doc = _wait(client, eid)
        assert doc["status"] == "completed", doc
        results = doc["steps"]["work"]["result"]["results"]
        assert sorted(r["index"] for r in results) == list(range(500))
        stats = doc["steps"]["work"]["result"]["stats"]
        assert stats == {"total": 500, "success": 500, "failed": 0}
        events = _events(client, eid)
        completed = [e for e in events if e["type"] == "command.completed"]
        indexes = [e["payload"]["loop_index"] for e in completed]
        assert sorted(indexes) == list(range(500)), "each iteration is recorded exactly once"
        # Commands the dead worker held were issued again by the reaper.
        # Each iteration sleeps 0.25 s, so the victim held commands when it died.
        finished_by_w0 = {
            e["command_id"]
            for e in events
            if e["type"] in ("command.completed", "command.failed") and e.get("worker_id") == "w0"
        }
        held_at_death = {
            e["command_id"]
            for e in events
            if e["type"] == "command.claimed" and e["worker_id"] == "w0"
        } - finished_by_w0
        assert held_at_death, "the victim held no commands when it was killed"
        reissued = {
            e["command_id"]
            for e in events
            if e["type"] == "command.issued" and e["payload"].get("reissued")
        }
        assert held_at_death <= reissued, "commands the killed worker held are issued again"
    stack.workers[0] = stack.start_worker()


def test_exactly_one_of_many_claimers_wins(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        # Pool "idle" has no workers: the command waits for our claimers.
        eid, (event,) = _waiting_commands(client, ONE_STEP, 1)
        body = {"execution_id": eid, "command_id": event["command_id"]}
        claimers = stack.worker_client(*(f"c{n}" for n in range(12)), "x", pool="idle")

        def claim(n: int) -> int:
            r = claimers.post(
                f"/api/commands/{event['event_id']}/claim", json={**body, "worker_id": f"c{n}"}
            )
            return r.status_code

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(claim, range(12)))
        assert codes.count(200) == 1 and codes.count(409) == 11, codes
        # A claim for an event that is not the command's latest issue is refused.
        stale = claimers.post(
            f"/api/commands/{int(event['event_id']) + 1}/claim", json={**body, "worker_id": "x"}
        )
        assert stale.status_code == 409
        claimers.close()
        client.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"})


def test_cancel_stops_issuing_and_late_reports_are_rejected(stack: Stack) -> None:
    playbook = LOOP.replace("count: 500, pause: 0.25", "count: 400, pause: 0.05")
    assert playbook != LOOP
    with stack.client(timeout=30) as client:
        eid = client.post("/api/execute", json={"playbook": playbook}).json()["execution_id"]
        time.sleep(1.0)
        r = client.post(f"/api/executions/{eid}/cancel", json={"reason": "enough"})
        assert r.status_code == 200
        doc = _wait(client, eid, timeout=30)
        assert doc["status"] == "cancelled"
        assert client.get(f"/api/executions/{eid}/cancellation-check").json()["cancelled"]
        time.sleep(1.0)
        issued_after = [e for e in _events(client, eid) if e["type"] == "command.issued"]
        count = len(issued_after)
        time.sleep(1.0)
        assert len([e for e in _events(client, eid) if e["type"] == "command.issued"]) == count
        assert count < 400


def test_bad_input_is_a_4xx_naming_the_field(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        r = client.post("/api/execute", json={"playbook": ONE_STEP, "pool": "bad pool!"})
        assert r.status_code == 422 and "pool" in r.json()["error"]["message"]
        r = client.post("/api/execute", json={"payload": {}})
        assert r.status_code == 400 and "exactly one of" in r.json()["error"]["message"]
        r = client.post("/api/execute", json={"playbook": "workflow: [oops"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "playbook"
        r = client.post("/api/execute", json={"path": "no/such/playbook"})
        assert r.status_code == 404 and "no/such/playbook" in r.json()["error"]["message"]
        r = client.post("/api/execute", json={"catalog_id": "x@99999999999"})
        assert r.status_code in (404, 422) and "x" in r.json()["error"]["message"]
        r = client.post("/api/execute", json={"catalog_id": "x@\u00b2"})
        assert r.status_code == 404
        r = client.post("/api/execute", json={"path": "x", "version": 99999999999})
        assert r.status_code == 422 and "version" in r.json()["error"]["message"]
        worker = stack.client("worker")
        r = worker.post("/api/events/batch", json={"execution_id": "x", "events": []})
        assert r.status_code == 422 and "execution_id" in r.json()["error"]["message"]
        r = worker.post("/api/events/batch", json={"execution_id": 1, "events": [{"type": "x"}]})
        assert r.status_code == 422 and "events.0.event_id" in r.json()["error"]["message"]
        r = worker.post("/api/commands/1/claim", json={"worker_id": "w"})
        assert r.status_code == 422 and "execution_id" in r.json()["error"]["message"]
        r = client.get("/api/executions/12345")
        assert r.status_code == 404
        r = client.get("/api/executions", params={"limit": -1})
        assert r.status_code == 422 and "limit" in r.json()["error"]["message"]
        r = worker.post("/api/worker/pool/heartbeat", json={"worker_id": "ghost"})
        assert r.status_code == 404
        worker.close()
        r = client.post(
            "/api/execute", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 422


def test_health_metrics_pools_and_outbox(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz").json()
        assert ready["ready"] and ready["checks"] == {"database": "ok", "nats": "ok", "kv": "ok"}
        pools = {p["pool"]: p["workers"] for p in client.get("/api/worker/pools").json()["pools"]}
        assert len([w for w in pools["default"] if w["status"] == "ready"]) >= 2
        assert client.get("/api/internal/outbox/pending-count").json()["pending"] >= 0
        eid = client.post("/api/execute", json={"playbook": ONE_STEP}).json()["execution_id"]
        assert _wait(client, eid)["status"] == "completed"
        r = client.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(r.text)}
        for name in (
            "flowtide_commands_issued",
            "flowtide_commands_claimed",
            "flowtide_command_claim_latency_seconds",
            "flowtide_executions",
            "flowtide_outbox_pending",
            "flowtide_outbox_oldest_pending_age_seconds",
            "process_resident_memory_bytes",
        ):
            assert name in families, name
        assert families["flowtide_commands_issued"].type == "counter"
        assert families["flowtide_command_claim_latency_seconds"].type == "histogram"
        completed = [
            s.value
            for s in families["flowtide_executions"].samples
            if s.labels == {"status": "completed"}
        ]
        assert completed and completed[0] >= 1


def test_run_by_catalog_path_is_refused_cleanly_when_missing(stack: Stack, tmp_path: Path) -> None:
    proc = stack.run("run", "no/such/thing")
    assert proc.returncode == 2
    assert "no/such/thing" in proc.stderr


def test_a_lost_claim_answer_is_claimed_again_and_unnamed_leases_expire(stack: Stack) -> None:
    with stack.client(timeout=30) as client, stack.worker_client("other", pool="idle") as worker:
        eid, (event,) = _waiting_commands(client, ONE_STEP, 1)
        cid = event["command_id"]
        body = {"execution_id": eid, "command_id": cid, "worker_id": "ghost"}
        worker.post(
            "/api/worker/pool/register",
            json={
                "worker_id": "ghost",
                "pool": "idle",
                "hostname": "h",
                "pid": 1,
                "concurrency": 1,
            },
        ).raise_for_status()
        # The holder asking again (its first answer was lost) gets the same claim back.
        first = worker.post(f"/api/commands/{event['event_id']}/claim", json=body)
        again = worker.post(f"/api/commands/{event['event_id']}/claim", json=body)
        assert first.status_code == again.status_code == 200
        assert first.json()["command"] == again.json()["command"]
        claimed = [e for e in _events(client, eid) if e["type"] == "command.claimed"]
        assert len(claimed) == 1
        other = worker.post(
            f"/api/commands/{event['event_id']}/claim", json={**body, "worker_id": "other"}
        )
        assert other.status_code == 409

        def beat(commands: list[str]) -> None:
            worker.post(
                "/api/worker/pool/heartbeat",
                json={"worker_id": "ghost", "running": len(commands), "commands": commands},
            ).raise_for_status()

        def reissued() -> list[dict[str, Any]]:
            return [
                e
                for e in _events(client, eid)
                if e["type"] == "command.issued" and e["payload"].get("reissued")
            ]

        # Named in the heartbeat: the lease (3 s) is kept past its end.
        end = time.monotonic() + 2 * stack.lease
        while time.monotonic() < end:
            beat([cid])
            time.sleep(0.3)
        assert not reissued()
        # Heartbeats that no longer name it: the reaper issues it again.
        end = time.monotonic() + 20
        while not reissued() and time.monotonic() < end:
            beat([])
            time.sleep(0.3)
        again_issued = reissued()
        assert again_issued and again_issued[0]["payload"]["attempt"] == 2
        client.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"})


def _completed(eid: str, issued: dict[str, Any], worker: str, event_id: int) -> dict[str, Any]:
    """The `command.completed` event a worker would report for an issued loop command."""
    index = issued["payload"]["loop_index"]
    return {
        "event_id": event_id,
        "execution_id": eid,
        "type": "command.completed",
        "step": "work",
        "status": "ok",
        "payload": {
            "attempt": 1,
            "loop_instance": issued["payload"].get("loop_instance"),
            "loop_index": index,
            "status": "ok",
            "result": {"index": index},
            "action": "continue",
        },
        "parent_event_id": issued["event_id"],
        "command_id": issued["command_id"],
        "worker_id": worker,
        "time": time.time(),
    }


def _waiting_commands(
    client: httpx.Client, playbook: str, count: int
) -> tuple[str, list[dict[str, Any]]]:
    """Start `playbook` on a pool without workers: its id and its first `count`
    `command.issued` events (in loop index order), waiting for the test to claim them."""
    eid = client.post("/api/execute", json={"playbook": playbook, "pool": "idle"}).json()[
        "execution_id"
    ]
    deadline = time.monotonic() + 30
    issued: list[dict[str, Any]] = []
    while len(issued) < count and time.monotonic() < deadline:
        issued = [e for e in _events(client, eid) if e["type"] == "command.issued"]
        time.sleep(0.05)
    assert len(issued) == count
    return eid, sorted(issued, key=lambda e: e["payload"].get("loop_index") or 0)


def _three_waiting_commands(client: httpx.Client) -> tuple[str, list[dict[str, Any]]]:
    """A 3-iteration loop's 3 commands, waiting on a pool without workers."""
    playbook = LOOP.replace("max_in_flight: 16", "max_in_flight: 3").replace(
        "count: 500, pause: 0.25", "count: 3, pause: 0"
    )
    return _waiting_commands(client, playbook, 3)


def test_concurrent_reports_of_one_execution_are_each_answered_as_if_alone(
    stack: Stack,
) -> None:
    """Reports that the server takes together (group commit) keep their own verdicts: a
    repeated report is a duplicate, a report by a worker that does not hold the command is
    stale (409), and only the valid ones are written."""
    with (
        stack.client(timeout=30) as client,
        stack.worker_client("t0", "t1", "t2", "someone-else", pool="idle") as worker,
    ):
        eid, issued = _three_waiting_commands(client)
        for n, event in enumerate(issued):
            r = worker.post(
                f"/api/commands/{event['event_id']}/claim",
                json={"execution_id": eid, "command_id": event["command_id"], "worker_id": f"t{n}"},
            )
            assert r.status_code == 200, r.text

        def report(event: dict[str, Any], worker: str, event_id: int) -> dict[str, Any]:
            return {
                "execution_id": eid,
                "worker_id": worker,
                "events": [_completed(eid, event, worker, event_id)],
            }

        gen = Snowflake()
        ids = [gen.next_id() for _ in range(3)]
        bodies = [
            report(issued[0], "t0", ids[0]),
            report(issued[0], "t0", ids[0]),  # the same report again
            report(issued[1], "someone-else", ids[1]),  # not the holder
            report(issued[2], "t2", ids[2]),
        ]

        def post(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            r = worker.post("/api/events/batch", json=body)
            return r.status_code, r.json()

        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(post, bodies))
        first, again, stale, other = answers
        assert {first[1]["accepted"], again[1]["accepted"]} == {0, 1}, answers
        assert first[1]["duplicates"] + again[1]["duplicates"] == 1, answers
        assert stale[0] == 409 and stale[1]["stale"] == 1 and stale[1]["accepted"] == 0
        assert other[0] == 200 and other[1]["accepted"] == 1
        completed = [e for e in _events(client, eid) if e["type"] == "command.completed"]
        assert sorted(int(e["event_id"]) for e in completed) == [ids[0], ids[2]]
        client.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"})


def test_batch_claims_and_reports_answer_each_item_as_if_alone(stack: Stack) -> None:
    """The workers' batch endpoints: one claim request and one report request carry many
    items, each answered as its own request would be, in order."""
    with (
        stack.client(timeout=30) as client,
        stack.worker_client("t0", "t1", "someone-else", pool="idle") as worker,
    ):
        eid, issued = _three_waiting_commands(client)

        def item(event: dict[str, Any], **change: Any) -> dict[str, Any]:
            return {
                "event_id": event["event_id"],
                "execution_id": eid,
                "command_id": event["command_id"],
                **change,
            }

        claims = [
            *(item(e) for e in issued),
            item(issued[0]),  # the same worker again: the same claim
            item(issued[1], event_id=int(issued[1]["event_id"]) + 1),  # not its latest issue
            item(issued[2], command_id=Snowflake().next_id()),  # no such command
        ]
        r = worker.post("/api/commands/claim", json={"worker_id": "t0", "claims": claims})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert [x["code"] for x in doc["results"]] == [200, 200, 200, 200, 409, 404]
        assert "not its latest issue" in doc["results"][4]["error"]["message"]
        for n, got in enumerate(doc["results"][:3]):
            assert got["command"]["command_id"] == issued[n]["command_id"]
            assert (got["iterator"], got["element"]) == ("item", n)
        assert list(doc["executions"]) == [eid]
        shared = doc["executions"][eid]
        assert "kill_loop" in shared["playbook"]["text"] and shared["cancelled"] is False
        assert shared["context"]["workload"]["count"] == 3
        claimed = [e for e in _events(client, eid) if e["type"] == "command.claimed"]
        assert len(claimed) == 3 and {e["worker_id"] for e in claimed} == {"t0"}

        # Another worker gets none of them: each one names its holder.
        r = worker.post(
            "/api/commands/claim", json={"worker_id": "t1", "claims": [item(e) for e in issued]}
        )
        assert [(x["code"], x["error"]["holder"]) for x in r.json()["results"]] == [(409, "t0")] * 3

        gen = Snowflake()
        ids = [gen.next_id() for _ in range(4)]

        def report(event: dict[str, Any], worker: str, event_id: int, **change: Any) -> Any:
            completed = _completed(eid, event, change.get("event_worker", worker), event_id)
            completed["execution_id"] = change.get("event_execution_id", eid)
            return {"execution_id": change.get("execution_id", eid), "events": [completed]}

        missing = str(Snowflake().next_id())
        reports = [
            report(issued[0], "t0", ids[0]),
            report(issued[0], "t0", ids[0]),  # the same report again
            report(issued[1], "t0", ids[1], event_worker="someone-else"),  # not its own
            report(issued[2], "t0", ids[2]),
            report(issued[2], "t0", ids[3], execution_id=missing, event_execution_id=missing),
            report(issued[2], "t0", ids[3], event_execution_id=missing),  # not its execution
        ]
        r = worker.post("/api/events/reports", json={"worker_id": "t0", "reports": reports})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["code"] for x in results] == [200, 200, 422, 200, 404, 422], results
        assert [(x["accepted"], x["duplicates"]) for x in results[:2]] == [(1, 0), (0, 1)]
        assert "is not the reporting worker" in results[2]["error"]["message"]
        assert results[3]["accepted"] == 1
        assert "belongs to execution" in results[5]["error"]["message"]
        # A report by a worker that does not hold the command is stale.
        stale = [report(issued[1], "someone-else", ids[1])]
        r = worker.post("/api/events/reports", json={"worker_id": "someone-else", "reports": stale})
        assert [(x["code"], x["stale"]) for x in r.json()["results"]] == [(409, 1)]
        completed = [e for e in _events(client, eid) if e["type"] == "command.completed"]
        assert sorted(int(e["event_id"]) for e in completed) == sorted([ids[0], ids[2]])

        # Bad bodies are refused whole, naming the field.
        r = worker.post("/api/commands/claim", json={"worker_id": "t0", "claims": []})
        assert r.status_code == 422 and "claims" in r.json()["error"]["message"]
        r = worker.post("/api/events/reports", json={"reports": [{"execution_id": eid}]})
        assert r.status_code == 422 and "reports.0.events" in r.json()["error"]["message"]
        r = worker.post(
            "/api/events/batch", json={"execution_id": eid, "events": reports[5]["events"]}
        )
        assert r.status_code == 422 and "events.0.execution_id" in r.json()["error"]["message"]
        client.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"})


def test_a_worker_is_not_sent_the_context_it_holds_again(stack: Stack) -> None:
    """A claim or a report naming the revision of an execution's share the worker holds
    (`known`) is answered with the revision and the cancelled flag only; a claim naming
    another revision, or none, gets the whole share."""
    playbook = LOOP.replace("max_in_flight: 16", "max_in_flight: 3").replace(
        "count: 500, pause: 0.25", "count: 4, pause: 0"
    )
    with (
        stack.client(timeout=30) as client,
        stack.worker_client("t0", pool="idle") as worker,
    ):
        eid, issued = _waiting_commands(client, playbook, 3)

        def claim(event: dict[str, Any], known: dict[str, str] | None = None) -> Any:
            item = {k: event[k] for k in ("event_id", "command_id")}
            body: dict[str, Any] = {"worker_id": "t0", "claims": [{**item, "execution_id": eid}]}
            if known is not None:
                body["known"] = known
            r = worker.post("/api/commands/claim", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        whole = claim(issued[0])["executions"][eid]
        revision = whole["revision"]
        assert int(revision) > 0 and "kill_loop" in whole["playbook"]["text"]
        held = claim(issued[1], {eid: revision})
        assert held["results"][0]["code"] == 200
        assert held["executions"][eid] == {"revision": revision, "held": True, "cancelled": False}
        other = claim(issued[2], {eid: str(int(revision) + 1)})["executions"][eid]
        assert other["context"] == whole["context"] and other["revision"] == revision

        # A report that takes the next command: its share comes as held too.
        done = _completed(eid, issued[0], "t0", Snowflake().next_id())
        body = {
            "worker_id": "t0",
            "known": {eid: revision},
            "reports": [{"execution_id": eid, "events": [done], "take": True}],
        }
        r = worker.post("/api/events/reports", json=body)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["results"][0]["claimed"]["element"] == 3
        assert doc["executions"][eid] == {"revision": revision, "held": True, "cancelled": False}

        # `known` is checked like any field.
        item = {k: issued[0][k] for k in ("event_id", "command_id")}
        r = worker.post(
            "/api/commands/claim",
            json={
                "worker_id": "t0",
                "claims": [{**item, "execution_id": eid}],
                "known": {"not-an-id": "1"},
            },
        )
        assert r.status_code == 422 and "known" in r.json()["error"]["message"]
        client.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"})


def test_cancel_goes_down_to_sub_playbooks(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        assert client.post("/api/catalog/register", json={"content": SLOW_CHILD}).status_code < 300
        parent = client.post("/api/execute", json={"playbook": PARENT}).json()["execution_id"]
        child = None
        deadline = time.monotonic() + 60
        while child is None and time.monotonic() < deadline:
            for item in client.get("/api/executions", params={"limit": 50}).json()["items"]:
                if item["parent_execution_id"] == parent:
                    child = item["execution_id"]
            time.sleep(0.1)
        assert child is not None, "the sub-playbook never started"
        r = client.post(f"/api/executions/{parent}/cancel", json={"reason": "enough"})
        assert r.status_code == 200
        assert _wait(client, parent, timeout=30)["status"] == "cancelled"
        doc = _wait(client, child, timeout=30)
        assert doc["status"] == "cancelled"
        # It stopped early: a 200-iteration loop at 50 ms each would run for 10 s.
        done = [e for e in _events(client, child) if e["type"] == "command.completed"]
        assert len(done) < 150
        assert client.get(f"/api/executions/{child}/cancellation-check").json()["cancelled"]
        # Nothing new starts under a cancelled parent, and an unknown parent is a 404.
        r = client.post("/api/execute", json={"playbook": ONE_STEP, "parent_execution_id": parent})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["field"] == "parent_execution_id"
        assert "cancelled" in r.json()["error"]["message"]
        r = client.post(
            "/api/execute", json={"playbook": ONE_STEP, "parent_execution_id": "123456789"}
        )
        assert r.status_code == 404 and "123456789" in r.json()["error"]["message"]


def _ready_workers(client: httpx.Client, want: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    workers: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        pools = client.get("/api/worker/pools").json()["pools"]
        workers = [w for p in pools for w in p["workers"] if w["status"] == "ready"]
        if len(workers) >= want:
            break
        time.sleep(0.2)
    return workers


def test_a_worker_the_server_forgot_registers_again(stack: Stack) -> None:
    import psycopg

    with stack.client(timeout=30) as client:
        assert len(_ready_workers(client, 2, timeout=60)) >= 2
        with psycopg.connect(stack.db, autocommit=True) as conn:
            assert conn.execute("DELETE FROM worker").rowcount >= 2
        workers = _ready_workers(client, 2, timeout=20)
        assert len(workers) >= 2, workers
        # And they still run commands.
        eid = client.post("/api/execute", json={"playbook": ONE_STEP}).json()["execution_id"]
        assert _wait(client, eid)["status"] == "completed"


def test_a_held_command_cannot_report_into_another_execution_or_step(stack: Stack) -> None:
    """A worker holding a command of one execution reports its events as another
    execution's, or naming another step: both are stale (409) and nothing is written."""
    with (
        stack.client(timeout=30) as client,
        stack.worker_client("rogue", pool="idle") as worker,
    ):
        mine, (held,) = _waiting_commands(client, ONE_STEP, 1)
        other, _ = _waiting_commands(client, ONE_STEP, 1)
        r = worker.post(
            f"/api/commands/{held['event_id']}/claim",
            json={"execution_id": mine, "command_id": held["command_id"], "worker_id": "rogue"},
        )
        assert r.status_code == 200, r.text
        gen = Snowflake()

        def completed(eid: str, step: str) -> dict[str, Any]:
            return {
                "event_id": gen.next_id(),
                "execution_id": eid,
                "type": "command.completed",
                "step": step,
                "status": "ok",
                "payload": {"attempt": 1, "status": "ok", "result": {"forged": True}},
                "parent_event_id": held["event_id"],
                "command_id": held["command_id"],
                "worker_id": "rogue",
                "time": time.time(),
            }

        for eid, step in ((other, "only"), (mine, "elsewhere")):
            body = {"execution_id": eid, "worker_id": "rogue", "events": [completed(eid, step)]}
            r = worker.post("/api/events/batch", json=body)
            assert r.status_code == 409, (eid, step, r.text)
            assert [e for e in _events(client, eid) if e["type"] == "command.completed"] == []
        # The worker's own report of its own command is still taken.
        body = {"execution_id": mine, "worker_id": "rogue", "events": [completed(mine, "only")]}
        assert worker.post("/api/events/batch", json=body).status_code == 200
        assert _wait(client, mine)["status"] == "completed"
        client.post(f"/api/executions/{other}/cancel", json={"reason": "test over"})
