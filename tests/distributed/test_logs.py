"""What a step prints on a worker is followed from the server while it runs: the worker
publishes each chunk to the log stream (its NATS user may publish only under its pool's
log prefix), the server reads the stream for `GET /api/executions/{id}/logs?follow=true`
and `flowtide logs --server ID STEP -f`; once the step has ended, its output is read the
same way (the stream keeps the newest messages of each command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .stack import Stack

pytestmark = [pytest.mark.postgres, pytest.mark.nats]

STACK_WORKERS = 1
LINES = 1000

SHELL = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: chatty_shell, path: tests/dist/chatty_shell}
workload: {go: "GO"}
workflow:
  - step: talk
    tool:
      kind: shell
      command: |
        for i in $(seq 0 49); do echo "line $i"; done
        while [ ! -e "{{ workload.go }}" ]; do sleep 0.05; done
        for i in $(seq 50 LAST); do echo "line $i"; done
""".replace("LAST", str(LINES - 1))

# In a child process of the worker (its default isolation).
PYTHON = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: chatty_python, path: tests/dist/chatty_python}
workload: {go: "GO"}
workflow:
  - step: talk
    tool:
      kind: python
      input: {go: "{{ workload.go }}"}
      code: |
        import os, time
        for i in range(LINES):
            print(f"line {i}")
            while i == 49 and not os.path.exists(go):
                time.sleep(0.05)
""".replace("LINES", str(LINES))


def _started(client: object, eid: str) -> bool:
    events = client.get(f"/api/executions/{eid}/events", params={"step": "talk"}).json()  # type: ignore[attr-defined]
    types = [e["type"] for e in events]
    assert "command.completed" not in types
    return "command.started" in types


def _whole() -> str:
    return "".join(f"line {i}\n" for i in range(LINES))


@pytest.mark.parametrize("playbook", [SHELL, PYTHON], ids=["shell", "python"])
def test_a_running_steps_output_is_followed_from_the_server(stack: Stack, playbook: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="flowtide-logs-"))
    folder.chmod(0o755)  # the step may run as the python steps' user
    go = folder / "go"
    with stack.client() as client:
        reply = client.post("/api/execute", json={"playbook": playbook, "payload": {"go": str(go)}})
        assert reply.status_code == 201, reply.text
        eid = reply.json()["execution_id"]
        with client.stream(
            "GET",
            f"/api/executions/{eid}/logs",
            params={"step": "talk", "follow": "true"},
            timeout=60,
        ) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            first = json.loads(next(line for line in lines if line.strip()))
            # The step waits for `go`: this came while it ran, through NATS.
            assert first["running"] is True and first["offset"] == 0
            assert first["text"].startswith("line 0\n")
            assert client.get(f"/api/executions/{eid}").json()["status"] == "running"
            # A command still running after a second says so on its own report: the
            # step is shown running, not merely issued.
            deadline = time.monotonic() + 10
            while not _started(client, eid):
                assert time.monotonic() < deadline, "command.started not reported"
                time.sleep(0.1)
            go.touch()
            rest = "".join(json.loads(line)["text"] for line in lines if line.strip())
        assert first["text"] + rest == _whole()
        deadline = time.monotonic() + 30
        while client.get(f"/api/executions/{eid}").json()["status"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    # The CLI against the server, once the step has ended.
    env = {**os.environ, **stack.env}
    proc = subprocess.run(
        [sys.executable, "-m", "flowtide.cli", "logs", eid, "talk", "--server", stack.url],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == _whole()
