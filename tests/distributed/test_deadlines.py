"""A playbook's `timeout:` and `sla:` on the distributed stack: the server finds a run
past its timeout and fails it with `deadline_exceeded` within a second or so, the worker
stops its python child; an sla is recorded once and the run completes."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

from .stack import Stack

SLOW = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: slow, path: tests/dist/deadline}}
{limits}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        import time
        marker = "{marker}"
        time.sleep({sleep})
        result = {{"done": True}}
"""


def _alive(marker: str) -> bool:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return bool(found.stdout.strip())


def _run(stack: Stack, path: Path) -> dict:  # type: ignore[type-arg]
    proc = stack.run("run", path, "--json", timeout=120)
    assert proc.stdout, proc.stderr + stack.log("server")
    return dict(json.loads(proc.stdout))


def test_a_run_past_its_timeout_fails_and_its_child_stops(stack: Stack, tmp_path: Path) -> None:
    marker = f"dist-deadline-{uuid.uuid4().hex}"
    path = tmp_path / "slow.yaml"
    path.write_text(SLOW.format(limits="timeout: 1s", marker=marker, sleep=30))
    began = time.monotonic()
    doc = _run(stack, path)
    assert doc["status"] == "failed" and doc["error"]["kind"] == "deadline_exceeded", doc
    assert time.monotonic() - began < 6.0
    deadline = time.monotonic() + 10
    while _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(marker), "the worker's python child outlived the run"
    with stack.client("reader") as api:
        events = api.get(f"/api/executions/{doc['execution_id']}/events").json()
    kinds = [e["payload"]["kind"] for e in events if e["type"] == "execution.deadline_missed"]
    assert kinds == ["timeout"]


def test_an_sla_is_recorded_once_and_the_run_completes(stack: Stack, tmp_path: Path) -> None:
    path = tmp_path / "sla.yaml"
    path.write_text(SLOW.format(limits="sla: 300ms", marker="sla", sleep=1.5))
    doc = _run(stack, path)
    assert doc["status"] == "completed", doc
    with stack.client("reader") as api:
        events = api.get(f"/api/executions/{doc['execution_id']}/events").json()
    missed = [e for e in events if e["type"] == "execution.deadline_missed"]
    assert len(missed) == 1 and missed[0]["payload"]["kind"] == "sla"
