"""Python steps on a worker can be stopped: a cancel frees the slots that sleeping steps
held, and a worker given SIGTERM hands its commands back after its grace period. One
stack of its own: a single worker whose slots the test fills."""

from __future__ import annotations

import itertools
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from natsserver import NatsServer

from .stack import Stack

SLOTS = 4
GRACE = 2.0

SLEEPERS = f"""
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: sleepers, path: tests/dist/sleepers}}
workflow:
  - step: start
    tool: {{kind: python, code: "result = {{'n': {SLOTS}}}"}}
    next: [sleep]
  - step: sleep
    loop:
      in: "{{{{ range(start.n) | list }}}}"
      iterator: item
      spec: {{mode: parallel, max_in_flight: {SLOTS}}}
    tool:
      kind: python
      code: |
        import time
        time.sleep(3600)
"""

QUICK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: quick, path: tests/dist/quick}
workflow:
  - step: only
    tool: {kind: python, code: "result = {'ok': True}"}
"""

# Sleeps the first time it runs (on the worker that is stopped), not the second.
HAND_BACK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: hand_back, path: tests/dist/hand_back}
workload: {flag: ""}
workflow:
  - step: once
    tool:
      kind: python
      input: {flag: "{{ workload.flag }}"}
      code: |
        import os, time
        if not os.path.exists(flag):
            open(flag, "w").close()
            time.sleep(3600)
        result = {"ran": True}
"""

_names = itertools.count()


@pytest.fixture(scope="module")
def stack(pg_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("pystack")
    name = f"pycancel_{os.getpid()}_{next(_names)}"
    db = pg_server.create_database(name)
    nats = NatsServer.start_secured(root / "nats", pools=("default",))
    # A lease well over the hand-back's time (up to 1 s to leave the pull loop, the 2 s
    # grace, the release): under a loaded CI machine a 3 s lease raced it, and the command
    # was issued again as expired rather than as released.
    stack = Stack(db=db, nats=nats.url, root=root, nats_users=nats.users, lease=10.0)
    try:
        stack.start_server()
        stack.start_worker(concurrency=SLOTS, args=("--grace", str(GRACE)))
        yield stack
    finally:
        stack.stop()
        nats.stop()
        pg_server.drop_database(name)


def _wait(client: httpx.Client, eid: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = client.get(f"/api/executions/{eid}").json()
        if doc["status"] != "running":
            return dict(doc)
        time.sleep(0.1)
    raise AssertionError(f"execution {eid} still running after {timeout}s")


def _events(client: httpx.Client, eid: str) -> list[dict[str, Any]]:
    return list(client.get(f"/api/executions/{eid}/events", params={"limit": 10_000}).json())


def _running(client: httpx.Client, worker_id: str) -> int:
    for pool in client.get("/api/worker/pools").json()["pools"]:
        for worker in pool["workers"]:
            if worker["worker_id"] == worker_id:
                return int(worker["running"])
    return -1


def test_cancel_frees_the_slots_of_sleeping_python_steps(stack: Stack) -> None:
    with stack.client() as client:
        eid = client.post("/api/execute", json={"playbook": SLEEPERS}).json()["execution_id"]
        deadline = time.monotonic() + 30
        while _running(client, "w0") < SLOTS:
            assert time.monotonic() < deadline, stack.log("worker0")
            time.sleep(0.2)
        cancelled_at = time.monotonic()
        assert client.post(f"/api/executions/{eid}/cancel").status_code == 200

        # Every slot was asleep: a new execution gets one only once the cancel freed it.
        quick = client.post("/api/execute", json={"playbook": QUICK}).json()["execution_id"]
        assert _wait(client, quick, timeout=10)["status"] == "completed"
        assert time.monotonic() - cancelled_at < 10
        deadline = time.monotonic() + 10
        while _running(client, "w0") != 0:
            assert time.monotonic() < deadline, "slots still busy after the cancel"
            time.sleep(0.2)

        doc = client.get(f"/api/executions/{eid}").json()
        assert doc["status"] == "cancelled"
        # README: a cancelled execution's result is null; finished steps keep theirs.
        assert doc["result"] is None
        assert doc["steps"]["start"] == {
            "status": "completed",
            "runs": 1,
            "attempts": 1,
            "retries": 0,
            "result": {"n": SLOTS},
            "error": None,
        }
        assert doc["steps"]["sleep"]["status"] == "cancelled"
        assert "running" not in {s["status"] for s in doc["steps"].values()}

    shown = stack.run("status", eid)
    assert shown.returncode == 0, shown.stderr
    assert "running" not in shown.stdout and "cancelled" in shown.stdout


def test_sigterm_hands_running_commands_back_after_the_grace_period(stack: Stack) -> None:
    # A directory every user may write to: the step may run as nobody.
    scratch = Path(tempfile.mkdtemp(prefix="flowtide-handback-"))
    scratch.chmod(0o777)
    flag = scratch / "started"
    victim = stack.workers[0]
    with stack.client() as client:
        eid = client.post(
            "/api/execute", json={"playbook": HAND_BACK, "payload": {"flag": str(flag)}}
        ).json()["execution_id"]
        deadline = time.monotonic() + 30
        while not flag.exists():
            assert time.monotonic() < deadline, stack.log("worker0")
            time.sleep(0.1)
        stack.start_worker(concurrency=1)
        stopped_at = time.monotonic()
        victim.send_signal(signal.SIGTERM)
        victim.wait(timeout=GRACE + 8)
        assert time.monotonic() - stopped_at < GRACE + 5, stack.log("worker0")
        assert victim.returncode == 0, stack.log("worker0")
        assert "handing them back" in stack.log("worker0")

        doc = _wait(client, eid, timeout=30)
        assert doc["status"] == "completed", doc
        assert doc["result"] == {"ran": True}
        events = _events(client, eid)
        reissued = [
            e for e in events if e["type"] == "command.issued" and e["payload"].get("reissued")
        ]
        assert [e["payload"]["reason"] for e in reissued] == ["released by its worker"]
        done = [e for e in events if e["type"] == "command.completed"]
        assert [e["worker_id"] for e in done] == ["w1"]
