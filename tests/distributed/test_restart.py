"""The server is killed (SIGKILL) in the middle of a run and started again: the execution
completes with every iteration recorded exactly once.

While it is down, workers keep running what they claimed and retry their reports and
claims; the restarted process rebuilds its state from the event log (and from the KV's
loop state when the KV is NATS), and its relay publishes outbox rows the dead one left.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .stack import Stack
from .test_faults import _events, _wait

_names = itertools.count()

LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: restart_loop, path: tests/dist/restart_loop}
workload: {count: 400, pause: 0.02}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'go': True}"}
    next: [{step: work}]
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
        result = {"index": index, "square": index * index}
    next: [{step: total}]
  - step: total
    tool:
      kind: python
      input: {rows: "{{ work.results }}"}
      code: "result = {'n': len(rows), 'sum': sum(r['square'] for r in rows)}"
"""


@pytest.fixture(scope="module", params=["memory", "nats"])
def restart_stack(  # type: ignore[no-untyped-def]
    request, pg_server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    from natsserver import NatsServer

    root = tmp_path_factory.mktemp(f"restart-{request.param}")
    name = f"restart_{next(_names)}"
    db = pg_server.create_database(name)
    nats = NatsServer.start(root / "nats")
    kv = "memory://" if request.param == "memory" else nats.url
    stack = Stack(db=db, nats=nats.url, root=root, kv=kv)
    try:
        stack.start_server()
        stack.start_worker()
        stack.start_worker()
        yield stack
    finally:
        stack.stop()
        nats.stop()
        pg_server.drop_database(name)


def _completed_indexes(events: list[dict[str, Any]]) -> list[int]:
    return sorted(
        e["payload"]["loop_index"]
        for e in events
        if e["type"] == "command.completed" and e["step"] == "work"
    )


def test_server_killed_and_restarted_mid_loop(restart_stack: Stack, tmp_path: Path) -> None:
    stack = restart_stack
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        eid = client.post("/api/execute", json={"playbook": LOOP}).json()["execution_id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(_completed_indexes(_events(client, eid))) >= 80:
                break
            time.sleep(0.05)
        stack.kill_server()
        # Down long enough for workers to finish what they hold and fail to report it.
        time.sleep(2.0)
        stack.start_server()
        doc = _wait(client, eid, timeout=180)
        assert doc["status"] == "completed", (doc, stack.log("server"))
        assert doc["result"] == {"n": 400, "sum": sum(i * i for i in range(400))}
        assert _completed_indexes(_events(client, eid)) == list(range(400))
    # The log folds to the same document on a fresh read (no cache involved).
    shown = stack.run("status", eid, "--json")
    assert shown.returncode == 0, shown.stderr
