"""A playbook's `timeout:` and `sla:` on the distributed stack: the server finds a run
past its timeout and fails it with `deadline_exceeded` within a second or so, the worker
stops its python child; an sla is recorded once and the run completes."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from deadline_playbooks import SLOW, alive

from .stack import Stack


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
    while alive(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(marker), "the worker's python child outlived the run"
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
