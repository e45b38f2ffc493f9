"""A playbook's `timeout:` and `sla:` on the embedded runtime, as a user meets them: a
run past its timeout fails with `deadline_exceeded` within a second of it, its python
child killed; a run past its sla records it once and goes on; a bad duration is refused
with its line."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from deadline_playbooks import SLOW, alive

from .helpers import Flowtide, describe


def test_a_run_past_its_timeout_fails_at_once_and_its_child_is_killed(
    ft: Flowtide, tmp_path: Path
) -> None:
    marker = f"deadline-{uuid.uuid4().hex}"
    playbook = tmp_path / "slow.yaml"
    playbook.write_text(SLOW.format(limits="timeout: 1s", marker=marker, sleep=30))
    began = time.monotonic()
    doc = ft.run(playbook, expect=1)
    took = time.monotonic() - began
    assert doc["status"] == "failed"
    assert doc["error"]["kind"] == "deadline_exceeded", doc
    assert "timeout of 1s" in doc["error"]["message"]
    assert took < 1.0 + 2.5, took  # process start and exit included
    assert not alive(marker), "the python step's child outlived its run"
    events = ft.events(doc["execution_id"])
    missed = [e for e in events if e["type"] == "execution.deadline_missed"]
    assert [e["payload"]["kind"] for e in missed] == ["timeout"]
    assert events[-1]["type"] == "playbook.failed"
    human = ft("run", playbook)
    # Off a terminal the status and the error go to stderr, the result (null) to stdout.
    assert human.returncode == 1 and "deadline_exceeded" in human.stderr, describe(human)
    assert human.stdout.strip() == "null"


def test_a_run_past_its_sla_records_it_once_and_completes(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "slow.yaml"
    playbook.write_text(SLOW.format(limits="sla: 300ms", marker="sla", sleep=1))
    doc = ft.run(playbook)
    assert doc["status"] == "completed"
    missed = [e for e in ft.events(doc["execution_id"]) if e["type"] == "execution.deadline_missed"]
    assert len(missed) == 1 and missed[0]["payload"]["kind"] == "sla"
    assert missed[0]["payload"]["limit"] == 0.3


def test_a_bad_duration_is_refused_with_its_line(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "slow.yaml"
    playbook.write_text(SLOW.format(limits="timeout: soon", marker="x", sleep=0))
    proc = ft("validate", playbook)
    assert proc.returncode == 2, describe(proc)
    assert "slow.yaml:4:1" in proc.stderr and "timeout" in proc.stderr
