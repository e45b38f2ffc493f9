"""The command line against a server: execute, status, events (--follow), cancel, list,
catalog register/list, and run by catalog path; errors name what was wrong."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .stack import Stack

SLOW = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: slow, path: tests/cli/slow}
workload: {count: 200}
workflow:
  - step: work
    loop:
      in: "{{ range(count) | list }}"
      iterator: item
      spec: {mode: parallel, max_in_flight: 2}
    tool:
      kind: python
      input: {i: "{{ item }}"}
      code: |
        import time
        time.sleep(0.1)
        result = {"i": i}
"""

TWO_STEPS = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: two, path: tests/cli/two}
workload: {n: 2}
workflow:
  - step: first
    tool: {kind: python, input: {n: "{{ n }}"}, code: "result = {'double': n * 2}"}
    next: [{step: second}]
  - step: second
    tool: {kind: python, input: {d: "{{ first.double }}"}, code: "result = {'plus': d + 1}"}
"""


def test_execute_status_events_and_list(stack: Stack, tmp_path: Path) -> None:
    playbook = tmp_path / "two.yaml"
    playbook.write_text(TWO_STEPS)
    started = stack.run("execute", playbook, "--set", "n=5")
    assert started.returncode == 0, started.stderr
    eid = started.stdout.strip()
    assert eid.isdigit()
    # events --follow returns once the run has ended, with the whole log.
    follow = stack.run("events", eid, "--follow")
    assert follow.returncode == 0, follow.stderr
    lines = follow.stdout.splitlines()
    assert "playbook.initialized" in lines[0] and "playbook.completed" in lines[-1]
    status = stack.run("status", eid, "--json")
    doc = json.loads(status.stdout)
    assert doc["status"] == "completed"
    assert doc["steps"]["second"]["result"] == {"plus": 11}
    as_json = json.loads(stack.run("events", eid, "--json").stdout)
    assert [e["type"] for e in as_json] == [line.split()[1] for line in lines]
    listing = json.loads(stack.run("list", "--json").stdout)
    assert any(item["execution_id"] == eid for item in listing)
    table = stack.run("status", eid)
    assert "completed" in table.stdout and "second" in table.stdout


def test_cancel_from_the_command_line(stack: Stack, tmp_path: Path) -> None:
    playbook = tmp_path / "slow.yaml"
    playbook.write_text(SLOW)
    eid = stack.run("execute", playbook).stdout.strip()
    time.sleep(1.0)
    cancelled = stack.run("cancel", eid, "--reason", "enough of this")
    assert cancelled.returncode == 0, cancelled.stderr
    deadline = time.monotonic() + 30
    doc: dict[str, object] = {}
    while time.monotonic() < deadline:
        doc = json.loads(stack.run("status", eid, "--json").stdout)
        if doc["status"] != "running":
            break
        time.sleep(0.2)
    assert doc["status"] == "cancelled"
    # `run` reports the cancelled execution's document and exits 1.
    events = json.loads(stack.run("events", eid, "--json").stdout)
    assert any(e["type"] == "execution.cancelled" for e in events)


def test_catalog_register_then_run_by_path(stack: Stack, tmp_path: Path) -> None:
    playbook = tmp_path / "two.yaml"
    playbook.write_text(TWO_STEPS)
    reg = stack.run("catalog", "register", playbook)
    assert reg.returncode == 0, reg.stderr
    assert "tests/cli/two v" in reg.stdout
    listing = json.loads(stack.run("catalog", "list", "--json").stdout)
    assert any(item["path"] == "tests/cli/two" for item in listing)
    run = stack.run("run", "tests/cli/two", "--set", "n=1", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["result"] == {"plus": 3}


def test_remote_errors_are_clear(stack: Stack, tmp_path: Path) -> None:
    missing = stack.run("status", "12345")
    assert missing.returncode == 2 and "12345" in missing.stderr
    unknown = stack.run("run", "no/such/playbook")
    assert unknown.returncode == 2 and "no/such/playbook" in unknown.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nworkflow:\n"
        "  - step: x\n    tool: {kind: python, code: 'result = 1'}\n"
        "    next: [{step: nowhere}]\n"
    )
    refused = stack.run("execute", bad)
    assert refused.returncode == 2 and "nowhere" in refused.stderr
    import subprocess
    import sys

    down = subprocess.run(
        [sys.executable, "-m", "flowtide.cli", "status", "1", "--server", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        env=stack.env,
        timeout=60,
    )
    assert down.returncode == 1 and "cannot reach the server" in down.stderr
