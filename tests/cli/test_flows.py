"""Big parallel loops, fan-in joins and sub-playbooks, through `flowtide run --json`."""

from __future__ import annotations

import shutil
from pathlib import Path

from .helpers import PLAYBOOKS, Flowtide, position


def test_parallel_loop_of_1000_keeps_index_order(ft: Flowtide) -> None:
    doc = ft.run(PLAYBOOKS / "parallel_big.yaml")
    assert doc["status"] == "completed", doc["error"]
    result = doc["steps"]["start"]["result"]
    assert result["stats"] == {"total": 1000, "success": 1000, "failed": 0}
    assert len(result["results"]) == 1000
    assert result["results"] == [{"index": i, "value": i * 7 + 3} for i in range(1000)]
    assert doc["result"] == result

    # max_in_flight is honoured: never more than 16 commands issued and unfinished (a
    # chunk of iterations is one command, its iterations run one after another; it is
    # finished once each of them completed)
    events = ft.events(doc["execution_id"])
    in_flight = peak = 0
    issued: list[int] = []
    left: dict[str, int] = {}
    for event in events:
        if event["step"] != "start":
            continue
        if event["type"] == "command.issued":
            in_flight += 1
            peak = max(peak, in_flight)
            first, count = event["payload"]["loop_index"], event["payload"].get("loop_count", 1)
            issued.extend(range(first, first + count))
            left[event["command_id"]] = count
        elif event["type"] in ("command.completed", "command.failed"):
            left[event["command_id"]] -= 1
            if not left[event["command_id"]]:
                in_flight -= 1
    assert sorted(issued) == list(range(1000))
    assert in_flight == 0
    assert 1 < peak <= 16


def test_fan_in_join_runs_once_after_all_branches(ft: Flowtide) -> None:
    doc = ft.run(PLAYBOOKS / "fan_in.yaml")
    assert doc["status"] == "completed", doc["error"]
    steps = doc["steps"]
    for name, step in steps.items():
        assert step["status"] == "completed" and step["runs"] == 1, name
    assert steps["join"]["result"] == {
        "branches": ["long", "medium", "short"],
        "values": {"short": 11, "medium": 120, "long": 1301},
    }
    assert doc["result"] == steps["join"]["result"]

    events = ft.events(doc["execution_id"])
    order = [e["step"] for e in events if e["type"] == "step.exit"]
    assert order[-1] == "join"
    assert [e["step"] for e in events if e["type"] == "step.enter"].count("join") == 1
    # the join only starts after the last step of every branch has finished
    join_enter = position(events, "step.enter", "join")
    for tail in ("short", "medium_2", "long_3"):
        assert position(events, "step.exit", tail) < join_enter, tail


def _parent_alone(tmp_path: Path) -> Path:
    """The parent playbook in a folder of its own: the child can only come from the catalog."""
    folder = tmp_path / "parent"
    folder.mkdir()
    return Path(shutil.copy(PLAYBOOKS / "parent.yaml", folder / "parent.yaml"))


def test_sub_playbook_by_catalog_path_in_a_loop(ft: Flowtide, tmp_path: Path) -> None:
    parent = _parent_alone(tmp_path)
    unregistered = ft.run(parent, expect=1)
    assert unregistered["error"]["step"] == "start"
    assert "tests/cli/sub/child" in unregistered["error"]["message"]
    assert "catalog register" in unregistered["error"]["message"]

    reg = ft.ok("catalog", "register", PLAYBOOKS / "sub")
    assert "tests/cli/sub/child v1" in reg.stdout
    doc = ft.run(parent)
    assert doc["status"] == "completed", doc["error"]
    loop = doc["steps"]["start"]["result"]
    # return_step: each iteration's result is the child's `compute` step, not its last step
    assert loop["results"] == [
        {"value": 1, "answer": 3},
        {"value": 2, "answer": 5},
        {"value": 3, "answer": 7},
    ]
    assert loop["stats"] == {"total": 3, "success": 3, "failed": 0}
    assert doc["result"] == {"answers": [3, 5, 7]}
    children = [r for r in ft.executions() if r["playbook"] == "tests/cli/sub/child"]
    assert len(children) == 3 and {r["status"] for r in children} == {"completed"}


def test_failing_sub_playbook_fails_the_parent_step(ft: Flowtide, tmp_path: Path) -> None:
    parent = _parent_alone(tmp_path)
    ft.ok("catalog", "register", PLAYBOOKS / "sub")
    doc = ft.run(parent, "--set", "values=[4, 13, 5]", expect=1)
    assert doc["status"] == "failed"
    assert doc["error"]["step"] == "start"
    assert doc["error"]["kind"] == "playbook_error"
    assert "child refuses unlucky value 13" in doc["error"]["message"]
    step = doc["steps"]["start"]
    assert step["status"] == "failed"
    assert "child refuses unlucky value 13" in step["error"]["message"]
    assert doc["steps"]["summary"]["runs"] == 0

    children = [r for r in ft.executions() if r["playbook"] == "tests/cli/sub/child"]
    # the sequential loop stops at the failing iteration: 4 ran, 13 failed, 5 never started
    assert sorted(r["status"] for r in children) == ["completed", "failed"]
    failed = next(r for r in children if r["status"] == "failed")
    child = ft.status(failed["execution_id"])
    assert child["error"]["step"] == "start"
    assert "child refuses unlucky value 13" in child["error"]["message"]
