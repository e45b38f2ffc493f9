"""The command line against a server: execute, status, events (--follow), cancel, list,
catalog register/list, run by catalog path, and `run` following a long loop on its event
stream; errors name what was wrong."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

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
    # An ended run's log is closed: cancel refuses it (exit 2) and writes nothing.
    refused = stack.run("cancel", eid)
    assert refused.returncode == 2 and f"execution {eid} is already completed" in refused.stderr
    assert json.loads(stack.run("events", eid, "--json").stdout) == as_json


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


LONG_LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: long, path: tests/cli/long}
workload: {count: 400}
workflow:
  - step: work
    loop:
      in: "{{ range(count) | list }}"
      iterator: item
      spec: {mode: parallel, max_in_flight: 8}
    tool:
      kind: python
      input: {i: "{{ item }}"}
      code: |
        import time
        time.sleep(0.03)  # 400 x 30 ms / 8 in flight: never under 1.5 s, however fast
        result = {"i": i, "pad": "x" * 200}
    next: [{step: total}]
  - step: total
    tool:
      kind: python
      input: {rows: "{{ work.results }}"}
      code: "result = {'n': len(rows), 'sum': sum(r['i'] for r in rows)}"
"""


def test_run_follows_the_event_stream_and_fetches_the_document_once(
    stack: Stack, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """`run --server --json` of a loop that runs for seconds: the execution's document
    (every result so far) is asked for once, at the end, not on every poll; the run is
    followed on one event stream."""
    import httpx

    from flowtide.cli import run as run_cli

    playbook = tmp_path / "long.yaml"
    playbook.write_text(LONG_LOOP)
    for key in ("FLOWTIDE_HOME", "FLOWTIDE_TOKEN", "FLOWTIDE_NO_PROGRESS"):
        monkeypatch.setenv(key, stack.env[key])
    sent: list[tuple[str, str]] = []
    send = httpx.Client.send

    def counting(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        sent.append((request.method, request.url.path))
        return send(self, request, **kwargs)

    monkeypatch.setattr(httpx.Client, "send", counting)
    started = time.monotonic()
    code = run_cli._run_remote(stack.url, str(playbook), {}, as_json=True, pool=None)
    took = time.monotonic() - started
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    assert doc["result"] == {"n": 400, "sum": sum(range(400))}
    eid = doc["execution_id"]
    documents = sent.count(("GET", f"/api/executions/{eid}"))
    streams = sent.count(("GET", f"/api/executions/{eid}/events/stream"))
    # Polling would have fetched it a dozen times or more in the time the run took.
    assert took > 1.5, f"the run took {took:.1f}s: too short to tell following from polling"
    assert documents == 1, sent
    assert streams == 1, sent
    assert len(sent) == 3, sent  # execute, the stream, the document
