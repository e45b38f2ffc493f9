"""Kill `flowtide run` mid-loop (SIGKILL, Ctrl-C), then `flowtide resume` it.

Each loop iteration appends its index to a file before it sleeps, so the file tells how
many times every iteration really ran. An iteration the event log already recorded as
finished (`loop.item`) must never run again; only the ones in flight at the kill may.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .helpers import PLAYBOOKS, Flowtide, wait_until


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split() if path.exists() else []


def interrupt_mid_loop(
    ft: Flowtide, tmp_path: Path, playbook: str, sig: int, after_lines: int
) -> tuple[str, Path, int, str]:
    """Start a run, wait for `after_lines` iterations, send `sig`.

    Returns (execution_id, out_file, exit code, stderr of the run)."""
    out_file = tmp_path / "iterations.txt"
    stdout_path, stderr_path = tmp_path / "run.out", tmp_path / "run.err"
    with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
        proc = ft.popen(
            "run", PLAYBOOKS / playbook, "--json", "--set", f"out_file={out_file}",
            stdout=stdout, stderr=stderr,
        )  # fmt: skip
        try:
            wait_until(
                lambda: len(lines(out_file)) >= after_lines,
                timeout=30,
                what=f"{after_lines} iterations",
                proc=proc,
            )
            os.kill(proc.pid, sig)
            code = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert stdout_path.read_text(encoding="utf-8") == ""  # no document for a stopped run
    rows = ft.executions()
    assert len(rows) == 1, rows
    # Nobody runs it any more: `interrupted` (its row is not written so), its duration
    # stopped at its last event.
    assert rows[0]["status"] == "interrupted"
    assert rows[0]["ended"] is None
    events = ft.events(rows[0]["execution_id"])
    last = max(e["time"] for e in events)
    assert rows[0]["duration"] == pytest.approx(last - rows[0]["created"])
    assert ft.executions() == rows
    assert ft.json("list", "--json", "--status", "interrupted") == rows
    assert ft.json("list", "--json", "--status", "running") == []
    assert "interrupted" in ft.ok("list").stdout
    return rows[0]["execution_id"], out_file, code, stderr_path.read_text(encoding="utf-8")


def recorded_items(events: list[dict[str, Any]], step: str) -> set[int]:
    return {
        int(e["payload"]["index"]) for e in events if e["type"] == "loop.item" and e["step"] == step
    }


def resume_and_check(
    ft: Flowtide, eid: str, out_file: Path, *, total: int, max_in_flight: int, value: Any
) -> None:
    before = ft.events(eid)
    done_before = recorded_items(before, "work")
    assert 0 < len(done_before) < total, "the kill did not land mid-loop"
    assert [e["type"] for e in before].count("playbook.completed") == 0
    status = ft.status(eid)
    assert status["status"] == "interrupted"
    assert status["steps"]["work"]["status"] == "interrupted"
    assert status["steps"]["finish"]["status"] == "pending"
    table = ft.ok("status", eid).stdout
    assert f"flowtide resume {eid}" in table and "running" not in table
    assert ft.events(eid) == before  # reading it wrote nothing

    doc = ft.json("resume", eid)
    assert doc["execution_id"] == eid
    assert doc["status"] == "completed", doc["error"]
    work = doc["steps"]["work"]
    assert work["runs"] == 1
    assert work["result"]["stats"] == {"total": total, "success": total, "failed": 0}
    results = work["result"]["results"]
    assert len(results) == total
    assert results == [value(i) for i in range(total)]
    assert doc["result"] == {"done": total}
    assert doc["steps"]["finish"]["runs"] == 1

    counts = Counter(int(x) for x in lines(out_file))
    assert set(counts) == set(range(total))
    for index in sorted(done_before):
        assert counts[index] == 1, f"iteration {index} finished before the kill but ran again"
    again = sorted(i for i, c in counts.items() if c > 1)
    assert len(again) <= max_in_flight, again
    assert all(counts[i] == 2 for i in again)

    after = ft.events(eid)
    types = [e["type"] for e in after]
    assert after[: len(before)] == before  # the log is only appended to
    assert types.count("playbook.initialized") == 1
    assert types[-1] == "playbook.completed" and types.count("playbook.completed") == 1
    assert sorted(recorded_items(after, "work")) == list(range(total))
    assert ft.status(eid) == doc
    assert ft.executions()[0]["status"] == "completed"


def test_resume_after_sigkill_sequential(ft: Flowtide, tmp_path: Path) -> None:
    eid, out_file, code, _ = interrupt_mid_loop(
        ft, tmp_path, "slow_sequential.yaml", signal.SIGKILL, after_lines=10
    )
    assert code == -signal.SIGKILL
    resume_and_check(
        ft, eid, out_file, total=30, max_in_flight=1,
        value=lambda i: {"index": i, "square": i * i},
    )  # fmt: skip


def test_resume_after_ctrl_c_sequential(ft: Flowtide, tmp_path: Path) -> None:
    eid, out_file, code, stderr = interrupt_mid_loop(
        ft, tmp_path, "slow_sequential.yaml", signal.SIGINT, after_lines=10
    )
    assert code == 130, stderr
    assert f"flowtide resume {eid}" in stderr
    resume_and_check(
        ft, eid, out_file, total=30, max_in_flight=1,
        value=lambda i: {"index": i, "square": i * i},
    )  # fmt: skip


def test_resume_after_sigkill_parallel(ft: Flowtide, tmp_path: Path) -> None:
    eid, out_file, code, _ = interrupt_mid_loop(
        ft, tmp_path, "slow_parallel.yaml", signal.SIGKILL, after_lines=60
    )
    assert code == -signal.SIGKILL
    resume_and_check(
        ft, eid, out_file, total=200, max_in_flight=8,
        value=lambda i: {"index": i, "cube": i**3},
    )  # fmt: skip


def test_resume_closes_sub_playbook_runs_the_kill_abandoned(ft: Flowtide, tmp_path: Path) -> None:
    out_file = tmp_path / "children.txt"
    with (tmp_path / "run.out").open("wb") as stdout, (tmp_path / "run.err").open("wb") as stderr:
        proc = ft.popen(
            "run", PLAYBOOKS / "slow_parent.yaml", "--json", "--set", f"out_file={out_file}",
            stdout=stdout, stderr=stderr,
        )  # fmt: skip
        try:
            wait_until(lambda: len(lines(out_file)) >= 2, timeout=30, what="2 children", proc=proc)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    rows = ft.executions()
    parent = next(r for r in rows if r["playbook"] == "tests/cli/slow_parent")
    orphans = [r["execution_id"] for r in rows if r["status"] == "interrupted" and r is not parent]
    assert orphans, "the kill did not land while a child was running"

    doc = ft.json("resume", parent["execution_id"])
    assert doc["status"] == "completed", doc["error"]
    assert [r["value"] for r in doc["steps"]["start"]["result"]["results"]] == [0, 1, 2, 3]
    after = {r["execution_id"]: r["status"] for r in ft.executions()}
    for orphan in orphans:
        assert after[orphan] == "cancelled"
        assert ft.status(orphan)["status"] == "cancelled"
    assert not {"running", "interrupted"} & set(after.values())
