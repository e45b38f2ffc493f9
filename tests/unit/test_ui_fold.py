"""`flowtide ui`'s folded states (`flowtide.ui.local.FoldCache`): caught up from the
local store as the log grows, a late-written event with an older id included, and folded
again in order once the execution ends; the timeline the UI draws
(`flowtide.documents.timeline`) from the same store."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from flowtide.documents import timeline
from flowtide.documents.timeline import execution_timeline
from flowtide.engine.state import fold
from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.fold import FoldCache

from .driver import EXECUTION_ID, NOW, Driver, snapshot

LOOP = """
workflow:
  - step: start
    tool: {kind: noop}
    next: [{step: each}]
  - step: each
    loop: {in: "{{ range(12) | list }}", iterator: n, spec: {mode: parallel, max_in_flight: 3}}
    tool: {kind: noop}
    next: [{step: end}]
  - step: end
    tool: {kind: noop}
"""


def _run() -> Driver:
    driver = Driver(LOOP)
    # Snowflake-like ids, a quarter of a millisecond apart.
    ids = itertools.count(1 << 50, 1 << 20)
    driver.new_id = lambda: next(ids)  # type: ignore[method-assign]
    return driver.run()


def test_a_running_execution_is_caught_up_and_an_ended_one_folded_exactly(
    tmp_path: Path,
) -> None:
    driver = _run()
    store = SQLiteStore(tmp_path / "flowtide.db")
    store.create_execution(
        EXECUTION_ID,
        playbook_path="t/loop",
        playbook_version=None,
        playbook_file=None,
        playbook_text=LOOP,
        workload={},
        created=NOW,
    )
    log = list(driver.log)
    # One event is written late, after newer ones (as a worker thread's event can be).
    late = next(i for i, e in enumerate(log) if e.type == "command.completed")
    held = log.pop(late)
    cache = FoldCache(store)
    written: list = []
    for start in range(0, len(log), 7):
        store.append(log[start : start + 7])
        written += log[start : start + 7]
        if start == 14:
            store.append([held])
            written.append(held)
        _, state = cache.state(EXECUTION_ID)
        # What was written so far, folded in order, the late event included.
        in_order = fold(driver.playbook, EXECUTION_ID, sorted(written, key=lambda e: e.event_id))
        assert snapshot(state) == snapshot(in_order)
    _, running = cache.state(EXECUTION_ID)
    assert running.loops[("each", 1)].completed == 12
    # Ended: folded again from the whole log, in order.
    store.update_execution(EXECUTION_ID, status="completed", updated=NOW)
    _, ended = cache.state(EXECUTION_ID)
    assert ended is not running
    assert snapshot(ended) == snapshot(fold(driver.playbook, EXECUTION_ID, driver.log))
    assert cache.state(EXECUTION_ID)[1] is ended  # not folded again
    store.close()


def _stored(tmp_path: Path, driver: Driver) -> SQLiteStore:
    store = SQLiteStore(tmp_path / "flowtide.db")
    store.create_execution(
        EXECUTION_ID,
        playbook_path="t/loop",
        playbook_version=None,
        playbook_file=None,
        playbook_text=LOOP,
        workload={},
        created=NOW,
    )
    # Times a millisecond apart, in log order, so spans and buckets mean something.
    store.append([replace(e, time=NOW + i / 1000) for i, e in enumerate(driver.log)])
    return store


def test_the_timeline_shows_runs_and_each_command_of_a_small_loop(tmp_path: Path) -> None:
    driver = _run()
    store = _stored(tmp_path, driver)
    doc = execution_timeline(store, driver.playbook, EXECUTION_ID, "completed")
    assert [s["step"] for s in doc["steps"]] == ["start", "each", "end"]
    assert doc["start"] == NOW and doc["end"] == NOW + (len(driver.log) - 1) / 1000
    each = doc["steps"][1]
    assert each["total_commands"] == 12 and each["density"] is None
    assert [r["status"] for r in each["runs"]] == ["completed"]
    assert each["runs"][0]["started"] <= each["runs"][0]["ended"]
    bars = each["commands"]
    assert sorted(b["loop_index"] for b in bars) == list(range(12))
    assert all(b["issued"] <= b["ended"] and b["status"] == "completed" for b in bars)
    store.close()


def test_a_big_loop_is_a_density_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "COMMANDS_SHOWN", 5)
    driver = _run()
    store = _stored(tmp_path, driver)
    doc = execution_timeline(store, driver.playbook, EXECUTION_ID, "completed", buckets=10)
    each = doc["steps"][1]
    assert each["commands"] is None
    lane = each["density"]
    assert len(lane["completed"]) == 10 and sum(lane["completed"]) == 12
    assert sum(lane["failed"]) == 0
    assert lane["width"] == pytest.approx((doc["end"] - doc["start"]) / 10)
    # The one-command steps keep their bars.
    assert len(doc["steps"][0]["commands"]) == 1
    store.close()
