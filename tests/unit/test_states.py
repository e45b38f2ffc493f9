"""States that tell the truth: a run no process runs any more is `interrupted` when read
(run locks, `flowtide.runlock.stopped_runs`), in the list item, the execution document,
the summary, the step and the timeline, its clock stopped at its last event; a step's
task calls are counted as attempts and retries, and the timeline draws each try."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from flowtide.documents.execution import as_interrupted, shown
from flowtide.documents.listing import execution_item
from flowtide.documents.step import step_document
from flowtide.documents.summary import SummaryDocument, execution_summary
from flowtide.documents.summary import as_interrupted as summary_interrupted
from flowtide.documents.timeline import execution_timeline
from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.runlock import RunLocks, stopped_runs
from flowtide.store.sqlite import SQLiteStore

from .driver import EXECUTION_ID, NOW, Driver

PLAYBOOK = """
workflow:
  - step: start
    tool: {kind: noop}
    next: [{step: end}]
  - step: end
    tool: {kind: noop}
"""


def _call(driver: Driver, cid: int, attempt: int, at: float, ok: bool) -> Event:
    return Event(
        event_id=driver.new_id(),
        execution_id=EXECUTION_ID,
        type=ev.CALL_DONE if ok else ev.CALL_ERROR,
        step="start",
        status="ok" if ok else "error",
        payload={"task": "start", "attempt": attempt, "duration_ms": 100.0},
        error=None if ok else {"kind": "error", "message": f"try {attempt}"},
        command_id=cid,
        time=at,
    )


def _retried(driver: Driver) -> list[Event]:
    """The `start` step's command, started, tried three times (two failing) 0.5 s apart."""
    (command,) = driver.outstanding
    cid = command.command_id
    started = Event(
        event_id=driver.new_id(),
        execution_id=EXECUTION_ID,
        type=ev.COMMAND_STARTED,
        step="start",
        status="running",
        payload={"attempt": 1},
        command_id=cid,
        time=NOW + 1,
    )
    return [
        started,
        _call(driver, cid, 1, NOW + 1.0, ok=False),
        _call(driver, cid, 2, NOW + 1.6, ok=False),
        _call(driver, cid, 3, NOW + 2.2, ok=True),
    ]


@pytest.fixture
def store(tmp_path: Path) -> Any:
    store = SQLiteStore(tmp_path / "flowtide.db")
    store.create_execution(
        EXECUTION_ID,
        playbook_path="t/states",
        playbook_version=None,
        playbook_file=None,
        playbook_text=PLAYBOOK,
        workload={},
        created=NOW,
    )
    yield store
    store.close()


def test_a_run_nobody_holds_is_stopped_at_its_last_event(store: Any, tmp_path: Path) -> None:
    driver = Driver(PLAYBOOK).start()
    calls = _retried(driver)
    store.append(driver.log + calls)
    mine, theirs = RunLocks(tmp_path / "runs"), RunLocks(tmp_path / "runs")
    assert stopped_runs(store, mine, [EXECUTION_ID]) == {EXECUTION_ID: NOW + 2.2}
    theirs.acquire(EXECUTION_ID)  # another live process runs it
    assert stopped_runs(store, mine, [EXECUTION_ID]) == {}
    assert stopped_runs(store, theirs, [EXECUTION_ID]) == {}  # this process runs it
    theirs.release(EXECUTION_ID)
    assert stopped_runs(store, mine, [EXECUTION_ID, 12345]) == {EXECUTION_ID: NOW + 2.2}
    row = store.get_execution(EXECUTION_ID)
    item = execution_item(row, now=NOW + 100, stopped=NOW + 2.2)
    assert (item["status"], item["ended"]) == ("interrupted", None)
    assert item["duration"] == pytest.approx(2.2)
    assert execution_item(row, now=NOW + 100)["duration"] == 100  # running: counting
    store.update_execution(EXECUTION_ID, status="completed", updated=NOW + 3)
    assert stopped_runs(store, mine, [EXECUTION_ID]) == {}  # ended: not interrupted
    done = execution_item(store.get_execution(EXECUTION_ID), stopped=NOW + 2.2)
    assert done["status"] == "completed"


def test_the_documents_of_an_interrupted_run(store: Any) -> None:
    driver = Driver(PLAYBOOK).start()
    calls = _retried(driver)
    for event in calls:
        driver.state.apply(event)
    state = driver.state
    assert state.steps["start"].status == "running"
    doc = as_interrupted(shown(state))
    assert doc["status"] == "interrupted"
    assert doc["steps"]["start"]["status"] == "interrupted"
    assert doc["steps"]["end"]["status"] == "pending"
    assert (doc["steps"]["start"]["attempts"], doc["steps"]["start"]["retries"]) == (3, 2)
    assert shown(state)["status"] == "running"  # the state itself is left as it is
    part = cast(SummaryDocument, {**execution_summary(state), "updated": NOW})
    summary = summary_interrupted(part, NOW + 2.2)
    assert summary["status"] == "interrupted" and summary["updated"] == NOW + 2.2
    assert summary["steps"]["start"]["status"] == "interrupted"
    assert summary["steps"]["start"]["attempts"] == 3
    step = step_document(state, "start", [], interrupted=True)
    assert (step["status"], step["attempts"], step["retries"]) == ("interrupted", 3, 2)
    assert step_document(state, "start", [])["status"] == "running"

    store.append(driver.log + calls)
    line = execution_timeline(store, state.playbook, EXECUTION_ID, "interrupted")
    assert line["status"] == "interrupted" and line["end"] == NOW + 2.2  # not now
    lane = next(s for s in line["steps"] if s["step"] == "start")
    assert [r["status"] for r in lane["runs"]] == ["interrupted"]
    (command,) = lane["commands"] or []
    assert command["status"] == "interrupted"
    tries = command["tries"]
    assert [(t["attempt"], t["status"]) for t in tries] == [
        (1, "failed"),
        (2, "failed"),
        (3, "completed"),
    ]
    # Each try lasted 0.1 s; the 0.5 s before the next is its backoff.
    assert [
        round(b["started"] - a["ended"], 6) for a, b in zip(tries, tries[1:], strict=False)
    ] == [0.5, 0.5]
    ended = execution_timeline(store, state.playbook, EXECUTION_ID, "cancelled")
    lane = next(s for s in ended["steps"] if s["step"] == "start")
    assert [r["status"] for r in lane["runs"]] == ["cancelled"]
