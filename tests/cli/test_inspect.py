"""`flowtide status`, `events`, `list`, `validate` and `resume` of a finished execution."""

from __future__ import annotations

import json

from .helpers import PLAYBOOKS, Flowtide, describe, error_line, position

BASIC = PLAYBOOKS / "basic.yaml"
FAILING = PLAYBOOKS / "failing.yaml"
INVALID = PLAYBOOKS / "invalid"


def test_status_events_and_list_of_a_completed_run(ft: Flowtide) -> None:
    doc = ft.run(BASIC)
    eid = doc["execution_id"]

    # status is rebuilt from the event log and says what run --json said
    assert ft.status(eid) == doc
    text = ft.ok("status", eid).stdout
    assert eid in text and "completed" in text and "start" in text and "finish" in text
    # ... and shows the result, as its help says
    assert "result:" in text and "hello: 12" in text, text

    events = ft.events(eid)
    types = [e["type"] for e in events]
    assert types[0] == "playbook.initialized"
    assert types[-1] == "playbook.completed"
    assert types.count("playbook.initialized") == 1 and types.count("playbook.completed") == 1
    assert all(e["execution_id"] == eid for e in events)
    ids = [int(e["event_id"]) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # each step enters before it exits, `start` before `finish`
    enters = [e["step"] for e in events if e["type"] == "step.enter"]
    exits = [e["step"] for e in events if e["type"] == "step.exit"]
    assert enters == exits == ["start", "finish"]
    for step in ("start", "finish"):
        assert position(events, "step.enter", step) < position(events, "step.exit", step)
    # every command is issued before it completes
    issued = {e["command_id"]: i for i, e in enumerate(events) if e["type"] == "command.issued"}
    completed = {
        e["command_id"]: i for i, e in enumerate(events) if e["type"] == "command.completed"
    }
    assert issued.keys() == completed.keys() and len(issued) == 2
    assert all(issued[c] < completed[c] for c in issued)
    # the python step's printed output is kept in its call.done event
    call = next(e for e in events if e["type"] == "call.done" and e["step"] == "start")
    printed = call["payload"]["stdout"]
    assert "noise from print" in printed and "noise from sys.stdout" in printed
    assert "noise from sys.stderr" in printed

    log = ft.ok("events", eid).stdout.splitlines()
    assert len(log) == len(events)
    assert "playbook.initialized" in log[0] and "playbook.completed" in log[-1]

    rows = ft.executions()
    assert len(rows) == 1
    assert rows[0]["execution_id"] == eid and rows[0]["status"] == "completed"
    assert rows[0]["playbook"] == "tests/cli/basic"
    listing = ft.ok("list").stdout
    assert eid in listing and "completed" in listing


def test_list_newest_first_and_status_filter(ft: Flowtide) -> None:
    first = ft.run(BASIC)["execution_id"]
    second = ft.run(FAILING, expect=1)["execution_id"]
    rows = ft.executions()
    assert [r["execution_id"] for r in rows] == [second, first]
    assert [r["execution_id"] for r in ft.json("list", "--status", "failed")] == [second]
    assert [r["execution_id"] for r in ft.json("list", "--limit", "1")] == [second]
    status = ft.status(second)
    assert status["status"] == "failed" and status["error"]["step"] == "explode"
    events = ft.events(second)
    assert events[-1]["type"] == "playbook.failed"
    assert events[-1]["error"]["kind"] == "python_error"


def test_resume_of_a_finished_execution_reports_it_again(ft: Flowtide) -> None:
    doc = ft.run(BASIC)
    again = ft.json("resume", doc["execution_id"])
    assert again == doc
    count = len(ft.events(doc["execution_id"]))
    failed = ft.run(FAILING, expect=1)
    assert ft.json("resume", failed["execution_id"], expect=1) == failed
    assert len(ft.events(doc["execution_id"])) == count  # nothing ran again


def test_unknown_execution_id(ft: Flowtide) -> None:
    for command in ("status", "events", "resume"):
        proc = ft(command, "12345", "--json")
        assert proc.returncode == 2, describe(proc)
        assert "12345" in proc.stderr and proc.stdout == ""


def test_validate(ft: Flowtide) -> None:
    good = ft.ok("validate", BASIC, PLAYBOOKS / "fan_in.yaml")
    assert "basic.yaml: ok (2 steps, entry 'start')" in good.stdout
    assert "fan_in.yaml: ok (8 steps" in good.stdout

    report = ft.json("validate", BASIC)
    assert report == [
        {"file": str(BASIC), "valid": True, "name": "basic", "steps": 2, "warnings": []}
    ]

    bad = INVALID / "unknown_kind.yaml"
    proc = ft("validate", BASIC, bad)
    assert proc.returncode == 2, describe(proc)
    assert f"{bad}:{error_line(bad)}:" in proc.stderr and "tool.kind" in proc.stderr

    files = sorted(INVALID.glob("*.yaml"))
    report = ft.json("validate", BASIC, *files, expect=2)
    assert [r["file"] for r in report] == [str(BASIC), *map(str, files)]
    assert report[0]["valid"] is True
    for entry, path in zip(report[1:], files, strict=True):
        assert entry["valid"] is False
        assert entry["errors"] and entry["errors"][0]["line"] == error_line(path)
        assert entry["errors"][0]["file"] == str(path)
    fields = {r["file"].rsplit("/", 1)[-1]: r["errors"][0]["field"] for r in report[1:]}
    assert fields["unknown_kind.yaml"] == "tool.kind"
    assert fields["missing_arc.yaml"] == "next.arcs[0].step"
    # validating runs nothing and records nothing
    assert ft.executions() == []
    assert json.loads(ft.ok("catalog", "list", "--json").stdout) == []
