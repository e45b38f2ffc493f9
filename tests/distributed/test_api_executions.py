"""Execution-scoped endpoints on the distributed stack: the event stream (SSE), finalize,
and execution variables."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg

from .stack import Stack
from .test_faults import ONE_STEP, _events, _wait

STEPS = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: steps, path: tests/dist/steps}
workload: {pause: 0.0}
workflow:
  - step: start
    tool:
      kind: python
      input: {pause: "{{ pause }}"}
      code: |
        import time
        time.sleep(pause)
        result = {"n": 1}
    next: [middle]
  - step: middle
    loop: {in: "{{ range(4) | list }}", iterator: item, spec: {mode: parallel}}
    tool:
      kind: python
      input: {i: "{{ item }}", pause: "{{ pause }}"}
      code: |
        import time
        time.sleep(pause)
        result = {"i": i}
    next: [finish]
  - step: finish
    tool: {kind: python, code: "result = {'done': True}"}
"""

# Step `wait` sleeps, so a variable set meanwhile is there when `use` starts.
VARS = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: vars, path: tests/dist/vars}
workflow:
  - step: wait
    tool:
      kind: python
      code: |
        import time
        time.sleep(3)
        result = {"slept": True}
    set: {ctx.from_playbook: 7}
    next: [use]
  - step: use
    tool:
      kind: python
      input: {greeting: "{{ vars.greeting }}", n: "{{ ctx.from_playbook }}"}
      code: "result = {'greeting': greeting, 'n': n}"
"""

SLEEPER = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: sleeper, path: tests/dist/sleeper}
workflow:
  - step: nap
    tool:
      kind: python
      code: |
        import time
        time.sleep(3)
        result = {"woke": True}
"""


@dataclass
class Message:
    id: str | None
    event: str
    data: Any


def _stream(
    client: httpx.Client,
    eid: str,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
    stop_after: int | None = None,
) -> list[Message]:
    """SSE messages until `end` (or the first `stop_after` event messages)."""
    out: list[Message] = []
    with client.stream(
        "GET", f"/api/executions/{eid}/events/stream", headers=headers, params=params
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in r.iter_lines():
            if line.startswith(":"):
                continue  # a comment (keep-alive)
            if line:
                key, _, value = line.partition(": ")
                fields[key] = value
                continue
            if "data" in fields:
                out.append(
                    Message(fields.get("id"), fields.get("event", ""), json.loads(fields["data"]))
                )
            fields = {}
            if out and out[-1].event == "end":
                return out
            if stop_after is not None and len(out) >= stop_after:
                return out
    raise AssertionError(f"the stream closed without `end` after {len(out)} messages")


def _log_order(stack: Stack, eid: str) -> list[str]:
    with psycopg.connect(stack.db) as conn:
        rows = conn.execute(
            "SELECT event_id FROM event WHERE execution_id = %s ORDER BY xact, seq", (int(eid),)
        ).fetchall()
    return [str(r[0]) for r in rows]


def _start(client: httpx.Client, playbook: str, **extra: Any) -> str:
    r = client.post("/api/execute", json={"playbook": playbook, **extra})
    assert r.status_code == 201, r.text
    return str(r.json()["execution_id"])


def test_stream_yields_every_event_once_in_order_then_end(stack: Stack) -> None:
    with stack.client(timeout=60) as client:
        eid = _start(client, STEPS, payload={"pause": 0.2})
        messages = _stream(client, eid)
        end = messages.pop()
        assert end.event == "end" and end.id is None
        assert end.data == {"execution_id": eid, "status": "completed", "error": None}
        ids = [m.id for m in messages]
        assert len(ids) == len(set(ids)), "no event twice"
        assert ids == _log_order(stack, eid)
        assert sorted(ids) == sorted(e["event_id"] for e in _events(client, eid))
        for m in messages:
            assert m.id == m.data["event_id"] and m.event == m.data["type"]
            assert m.data["execution_id"] == eid
        types = [m.event for m in messages]
        assert types[0] == "playbook.initialized" and types[-1] == "playbook.completed"
        entered = [m.data["step"] for m in messages if m.event == "step.enter"]
        assert entered == ["start", "middle", "finish"]
        assert types.count("command.completed") == 6


def test_stream_resumes_after_last_event_id_without_gaps_or_repeats(stack: Stack) -> None:
    with stack.client(timeout=60) as client:
        eid = _start(client, STEPS, payload={"pause": 0.3})
        # Drop the connection mid-run, then reconnect as an EventSource does.
        first = _stream(client, eid, stop_after=3)
        assert [m.event for m in first][:1] == ["playbook.initialized"]
        rest = _stream(client, eid, headers={"Last-Event-ID": str(first[-1].id)})
        assert rest[-1].event == "end" and rest[-1].data["status"] == "completed"
        ids = [m.id for m in first + rest[:-1]]
        assert ids == _log_order(stack, eid)
        # After the end: `after` (or the header) gives only what follows that event.
        whole = _stream(client, eid)
        k = len(whole) // 2
        tail = _stream(client, eid, params={"after": whole[k].id})
        assert [m.id for m in tail] == [m.id for m in whole[k + 1 :]]
        last = _stream(client, eid, headers={"Last-Event-ID": str(whole[-2].id)})
        assert [m.event for m in last] == ["end"]
        # The header wins over the query (the URL an EventSource reconnects to).
        both = _stream(
            client, eid, params={"after": whole[0].id}, headers={"Last-Event-ID": whole[k].id}
        )
        assert [m.id for m in both] == [m.id for m in whole[k + 1 :]]


def test_stream_bad_input(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        r = client.get("/api/executions/12345/events/stream")
        assert r.status_code == 404 and "12345" in r.json()["error"]["message"]
        eid = _start(client, ONE_STEP)
        _wait(client, eid)
        r = client.get(f"/api/executions/{eid}/events/stream", params={"after": "x"})
        assert r.status_code == 422 and "after" in r.json()["error"]["message"]
        r = client.get(f"/api/executions/{eid}/events/stream", params={"after": 99})
        assert r.status_code == 422
        assert r.json()["error"]["fields"] == [
            {"field": "after", "message": f"event 99 is not in execution {eid}"}
        ]
        r = client.get(f"/api/executions/{eid}/events/stream", headers={"Last-Event-ID": "12"})
        assert r.status_code == 422 and "Last-Event-ID" in r.json()["error"]["message"]
        r = client.get(f"/api/executions/{eid}/events/stream", headers={"Last-Event-ID": "nope"})
        assert r.status_code == 422 and "last-event-id" in r.json()["error"]["message"]


def test_finalize_makes_a_stuck_execution_terminal_once(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        # Pool "idle" has no workers: the execution waits forever for its command.
        eid = _start(client, ONE_STEP, pool="idle")
        deadline = time.monotonic() + 30
        issued: list[dict[str, Any]] = []
        while not issued and time.monotonic() < deadline:
            issued = [e for e in _events(client, eid) if e["type"] == "command.issued"]
            time.sleep(0.05)
        command = issued[0]
        r = client.post(f"/api/executions/{eid}/finalize", json={"reason": "pool idle is gone"})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "execution_id": eid,
            "status": "failed",
            "previous_status": "running",
            "changed": True,
            "reason": "pool idle is gone",
        }
        doc = client.get(f"/api/executions/{eid}").json()
        assert doc["status"] == "failed"
        events = _events(client, eid)
        terminal = [e for e in events if e["type"] == "playbook.failed"]
        assert len(terminal) == 1 and terminal[0]["error"] == {
            "kind": "finalized",
            "message": "pool idle is gone",
        }
        assert terminal[0]["payload"]["reason"] == "pool idle is gone"
        assert [e["type"] for e in events][-2:] == ["workflow.failed", "playbook.failed"]
        # The open command is closed: it cannot be claimed, its reports are stale.
        got = client.get(
            f"/api/commands/{command['event_id']}",
            params={"execution_id": eid, "command_id": command["command_id"]},
        ).json()
        assert got["status"] == "cancelled"
        late = stack.worker_client("late", pool="idle")
        claim = late.post(
            f"/api/commands/{command['event_id']}/claim",
            json={"worker_id": "late", "execution_id": eid, "command_id": command["command_id"]},
        )
        assert claim.status_code == 409
        report = {
            "event_id": str(int(events[-1]["event_id"]) + 1000),
            "execution_id": eid,
            "type": "command.completed",
            "step": "only",
            "status": "ok",
            "payload": {"status": "ok", "result": {"ok": True}, "attempt": 1},
            "command_id": command["command_id"],
            "worker_id": "late",
        }
        assert late.post("/api/events", json=report).status_code == 409
        late.close()
        assert client.get(f"/api/executions/{eid}/cancellation-check").json()["cancelled"]
        # Again: nothing changes.
        again = client.post(
            f"/api/executions/{eid}/finalize", json={"status": "completed", "reason": "twice"}
        )
        assert again.status_code == 200
        assert again.json()["changed"] is False and again.json()["status"] == "failed"
        assert _events(client, eid) == events
        # Its stream ends with the forced status.
        assert _stream(client, eid)[-1].data["status"] == "failed"


def test_finalize_a_running_step_to_cancelled_or_completed(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        eid = _start(client, SLEEPER)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(e["type"] == "command.claimed" for e in _events(client, eid)):
                break
            time.sleep(0.05)
        r = client.post(
            f"/api/executions/{eid}/finalize", json={"status": "cancelled", "reason": "stuck"}
        )
        assert r.json()["status"] == "cancelled" and r.json()["changed"] is True
        before = _events(client, eid)
        assert before[-1]["type"] == "playbook.cancelled"
        assert before[-1]["error"]["message"] == "stuck"
        # The worker's report, once its 3 s nap is over, is rejected: nothing is added.
        time.sleep(4.0)
        assert client.get(f"/api/executions/{eid}").json()["status"] == "cancelled"
        assert _events(client, eid) == before
        # Completed, with the reason in the payload.
        other = _start(client, ONE_STEP, pool="idle")
        r = client.post(
            f"/api/executions/{other}/finalize", json={"status": "completed", "reason": "skip"}
        )
        assert r.json()["status"] == "completed"
        last = _events(client, other)[-1]
        assert last["type"] == "playbook.completed"
        assert last["payload"]["reason"] == "skip" and last["payload"]["finalized"] is True


def test_finalize_bad_input(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        r = client.post("/api/executions/12345/finalize", json={"reason": "x"})
        assert r.status_code == 404
        eid = _start(client, ONE_STEP, pool="idle")
        r = client.post(f"/api/executions/{eid}/finalize", json={"status": "done", "reason": "x"})
        assert r.status_code == 422 and "status" in r.json()["error"]["message"]
        r = client.post(f"/api/executions/{eid}/finalize", json={"status": "failed"})
        assert r.status_code == 422 and "reason" in r.json()["error"]["message"]
        r = client.post(f"/api/executions/{eid}/finalize", json={"reason": "x", "force": True})
        assert r.status_code == 422 and "force" in r.json()["error"]["message"]
        assert client.get(f"/api/executions/{eid}").json()["status"] == "running"
        client.post(f"/api/executions/{eid}/finalize", json={"reason": "test over"})


def test_vars_round_trip(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        eid = _start(client, ONE_STEP, pool="idle")
        base = f"/api/vars/{eid}"
        assert client.get(base).json() == {
            "execution_id": eid,
            "status": "running",
            "variables": {},
        }
        r = client.put(f"{base}/x", json={"value": 1})
        assert r.status_code == 200, r.text
        assert r.json()["value"] == 1 and r.json()["source"] == "api" and r.json()["name"] == "x"
        r = client.post(base, json={"variables": {"a": {"k": [1, 2]}, "b": "s", "nothing": None}})
        assert r.status_code == 200, r.text
        variables = r.json()["variables"]
        assert {k: v["value"] for k, v in variables.items()} == {
            "x": 1,
            "a": {"k": [1, 2]},
            "b": "s",
            "nothing": None,
        }
        assert all(v["updated"] and v["event_id"] for v in variables.values())
        assert client.get(f"{base}/a").json()["value"] == {"k": [1, 2]}
        # Every change is an event of the log.
        changes = [e for e in _events(client, eid) if e["type"] == "ctx.updated"]
        assert len(changes) == 2 and changes[1]["payload"]["set"]["b"] == "s"
        assert client.delete(f"{base}/x").json() == {"execution_id": eid, "deleted": ["x"]}
        assert client.get(f"{base}/x").status_code == 404
        assert client.delete(f"{base}/x").status_code == 404
        r = client.delete(base)
        assert r.json() == {"execution_id": eid, "deleted": ["a", "b", "nothing"]}
        assert client.get(base).json()["variables"] == {}
        # Terminal: readable, not writable.
        client.put(f"{base}/kept", json={"value": True})
        client.post(f"/api/executions/{eid}/finalize", json={"reason": "test over"})
        assert client.get(f"{base}/kept").json()["value"] is True
        r = client.put(f"{base}/kept", json={"value": False})
        assert r.status_code == 409 and r.json()["error"]["execution_status"] == "failed"
        assert client.delete(base).status_code == 409


def test_vars_bad_input(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        for method, path, body in [
            ("GET", "/api/vars/12345", None),
            ("POST", "/api/vars/12345", {"variables": {"a": 1}}),
            ("DELETE", "/api/vars/12345", None),
            ("GET", "/api/vars/12345/a", None),
            ("PUT", "/api/vars/12345/a", {"value": 1}),
            ("DELETE", "/api/vars/12345/a", None),
        ]:
            r = client.request(method, path, json=body)
            assert r.status_code == 404, (method, path, r.text)
            assert "12345" in r.json()["error"]["message"]
        eid = _start(client, ONE_STEP, pool="idle")
        base = f"/api/vars/{eid}"
        for bad in ["1abc", "a-b", "a.b", "x" * 129, "%C3%A9"]:
            r = client.put(f"{base}/{bad}", json={"value": 1})
            assert r.status_code == 422, (bad, r.text)
            error = r.json()["error"]
            assert error["fields"][0]["field"] == "path.name", error
            assert "variable name" in error["message"]
            assert client.get(f"{base}/{bad}").status_code == 422
        r = client.post(base, json={"variables": {"ok": 1, "bad name": 2}})
        assert r.status_code == 422 and "bad name" in r.json()["error"]["message"]
        r = client.post(base, json={"variables": {}})
        assert r.status_code == 422 and "variables" in r.json()["error"]["message"]
        r = client.put(f"{base}/a", json={})
        assert r.status_code == 422 and "value" in r.json()["error"]["message"]
        r = client.put(f"{base}/a", json={"value": "x" * 300_000})
        assert r.status_code == 422 and "value" in r.json()["error"]["message"]
        r = client.put(
            f"{base}/a", content=b'{"value": NaN}', headers={"content-type": "application/json"}
        )
        assert r.status_code == 422
        assert client.get(base).json()["variables"] == {}
        client.post(f"/api/executions/{eid}/finalize", json={"reason": "test over"})


def test_steps_read_variables_set_through_the_api(stack: Stack) -> None:
    with stack.client(timeout=30) as client:
        eid = _start(client, VARS)
        r = client.put(f"/api/vars/{eid}/greeting", json={"value": "hello"})
        assert r.status_code == 200, r.text
        doc = _wait(client, eid, timeout=60)
        assert doc["status"] == "completed", doc
        assert doc["steps"]["use"]["result"] == {"greeting": "hello", "n": 7}
        variables = client.get(f"/api/vars/{eid}").json()["variables"]
        assert variables["greeting"]["source"] == "api"
        assert variables["from_playbook"] == {
            "value": 7,
            "updated": variables["from_playbook"]["updated"],
            "event_id": variables["from_playbook"]["event_id"],
            "source": "wait",
        }


def test_summary_gives_each_step_its_status_loop_counts_and_the_graph(stack: Stack) -> None:
    """`GET /api/executions/{id}/summary` (the UI's execution page): per step status,
    runs, times and loop counts, the arcs taken and the playbook's layered graph, without
    step results; a reader may read it, an unauthenticated caller may not."""
    with stack.client(timeout=60) as client:
        eid = _start(client, STEPS)
        _wait(client, eid)
        with stack.client("reader", timeout=30) as reader:
            r = reader.get(f"/api/executions/{eid}/summary")
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["execution_id"] == eid and doc["status"] == "completed"
        assert doc["playbook"]["path"] == "tests/dist/steps"
        assert doc["progress"] == {
            "steps": 3,
            "steps_finished": 3,
            "iterations": 4,
            "iterations_done": 4,
            "iterations_failed": 0,
        }
        middle = doc["steps"]["middle"]
        assert middle["loop"]["total"] == 4 and middle["loop"]["succeeded"] == 4
        assert middle["started"] <= middle["ended"] and middle["duration"] >= 0
        assert {(t["from"], t["to"]) for t in doc["taken"]} == {
            ("start", "middle"),
            ("middle", "finish"),
        }
        layers = {n["name"]: n["layer"] for n in doc["graph"]["nodes"]}
        assert layers == {"start": 0, "middle": 1, "finish": 2}
        assert '"i": 3' not in r.text and "done" not in json.dumps(doc["steps"]["finish"])

        # The timeline: each step's runs and, for so few, each command.
        with stack.client("reader", timeout=30) as reader:
            timeline = reader.get(f"/api/executions/{eid}/timeline").json()
            assert reader.get(f"/api/executions/{eid}/timeline?buckets=0").status_code == 422
        lanes = {s["step"]: s for s in timeline["steps"]}
        assert list(lanes) == ["start", "middle", "finish"]
        assert timeline["start"] <= timeline["end"]
        assert [r["status"] for r in lanes["middle"]["runs"]] == ["completed"]
        bars = lanes["middle"]["commands"]
        assert sorted(b["loop_index"] for b in bars) == [0, 1, 2, 3]
        assert {b["status"] for b in bars} == {"completed"} and lanes["middle"]["density"] is None

        missing = client.get("/api/executions/12345/summary")
        assert missing.status_code == 404
    anonymous = httpx.get(f"{stack.url}/api/executions/{eid}/summary", timeout=10)
    assert anonymous.status_code == 401
