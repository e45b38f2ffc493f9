"""`flowtide ui`'s folded states (`flowtide.ui.local.FoldCache`): caught up from the
local store as the log grows, a late-written event with an older id included, and folded
again in order once the execution ends."""

from __future__ import annotations

import itertools
from pathlib import Path

from flowtide.engine.state import fold
from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.local import FoldCache

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
