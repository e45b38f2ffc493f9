"""Chunks of loop iterations on the distributed runtime (issue 34): a worker runs a
chunk's iterations one after another in one slot and reports what finished while the
chunk runs, so a worker killed mid-chunk loses only what it had not reported, and the
chunk issued again runs only that."""

from __future__ import annotations

import signal
import time
from typing import Any

from .stack import Stack
from .test_faults import _events, _wait

LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: chunks, path: tests/chunks}
workflow:
  - step: work
    loop:
      in: "{{ range(%d) | list }}"
      iterator: i
      spec: {mode: parallel, max_in_flight: 2, batch: %d}
    tool:
      kind: python
      input: {i: "{{ i }}"}
      code: |
        import time
        time.sleep(%s)
        result = {"index": i, "sq": i * i}
"""


def _exact(doc: dict[str, Any], events: list[dict[str, Any]], n: int) -> None:
    assert doc["status"] == "completed", doc
    result = doc["steps"]["work"]["result"]
    assert [r["sq"] for r in result["results"]] == [i * i for i in range(n)]
    assert result["stats"] == {"total": n, "success": n, "failed": 0}
    done = [e["payload"]["loop_index"] for e in events if e["type"] == "command.completed"]
    assert sorted(done) == list(range(n)), "each iteration is recorded exactly once"


def test_a_chunk_reports_its_iterations_while_it_runs(stack: Stack) -> None:
    n, batch = 40, 20
    with stack.client(timeout=30) as client:
        playbook = LOOP % (n, batch, "0.02")
        eid = client.post("/api/execute", json={"playbook": playbook}).json()["execution_id"]
        doc = _wait(client, eid)
        events = _events(client, eid)
    _exact(doc, events, n)
    issued = [e for e in events if e["type"] == "command.issued" and e["step"] == "work"]
    assert [e["payload"].get("loop_count") for e in issued] == [batch, batch]
    # One claim per chunk, one command.started per chunk, every iteration its own
    # call.done, command.completed and loop.item.
    claimed = [e for e in events if e["type"] == "command.claimed" and e["step"] == "work"]
    assert len(claimed) == 2
    assert sum(1 for e in events if e["type"] == "command.started") == 2
    for kind in ("call.done", "loop.item"):
        assert sum(1 for e in events if e["type"] == kind and e["step"] == "work") == n
    # A chunk runs 0.4 s: its iterations reach the server in several reports, each
    # taken by its own server step (the `loop.item` times are the steps' clocks).
    for chunk in issued:
        steps = {
            e["time"]
            for e in events
            if e["type"] == "loop.item" and e["command_id"] == chunk["command_id"]
        }
        assert len(steps) >= 3, f"chunk {chunk['command_id']} reported in {len(steps)} steps"


def test_a_worker_killed_mid_chunk_loses_only_what_it_had_not_reported(stack: Stack) -> None:
    n, batch = 120, 60
    with stack.client(timeout=30) as client:
        playbook = LOOP % (n, batch, "0.03")  # a chunk runs 1.8 s
        eid = client.post("/api/execute", json={"playbook": playbook}).json()["execution_id"]
        deadline = time.monotonic() + 60
        victim_chunk = None
        while time.monotonic() < deadline and victim_chunk is None:
            events = _events(client, eid)
            held = {
                e["command_id"]
                for e in events
                if e["type"] == "command.claimed" and e["worker_id"] == "w0"
            }
            for cid in held:
                reported = [
                    e for e in events if e["type"] == "loop.item" and e["command_id"] == cid
                ]
                if 5 <= len(reported) < batch - 10:
                    victim_chunk = cid
            time.sleep(0.02)
        assert victim_chunk is not None, "w0 never ran a chunk partway"
        victim = stack.workers[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        doc = _wait(client, eid)
        events = _events(client, eid)
    stack.workers[0] = stack.start_worker()
    _exact(doc, events, n)
    mine = [e for e in events if e["command_id"] == victim_chunk]
    again = [e for e in mine if e["type"] == "command.issued" and e["payload"].get("reissued")]
    assert again and again[0]["payload"]["loop_count"] == batch
    first = {
        e["payload"]["loop_index"]
        for e in mine
        if e["type"] == "command.completed" and e["payload"]["attempt"] == 1
    }
    later = {
        e["payload"]["loop_index"]
        for e in mine
        if e["type"] == "command.completed" and e["payload"]["attempt"] > 1
    }
    # What w0 reported before it died stands; the chunk issued again ran the rest only.
    assert len(first) >= 5 and first.isdisjoint(later)
    assert len(first) + len(later) == batch
