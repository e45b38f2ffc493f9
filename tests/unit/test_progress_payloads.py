"""`command.progress` as a worker may send it: whatever its payload holds, the state
keeps counts a reader can trust (whole numbers, done within total, failed within done,
a finite rate) and the documents built from it are JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from flowtide.documents.summary import execution_summary
from flowtide.engine import events as ev
from flowtide.engine.events import Event

from .driver import EXECUTION_ID, NOW, Driver

PLAYBOOK = """
workflow:
  - step: start
    tool: {kind: noop}
"""

HOSTILE: list[dict[str, Any]] = [
    {"done": "12", "total": "x", "per_second": "fast"},
    {"done": [1], "total": {"a": 1}, "per_second": [2.0]},
    {"done": float("nan"), "total": float("inf"), "per_second": float("nan")},
    {"done": 1e300, "total": 1e400, "per_second": float("inf"), "failed": float("-inf")},
    {"done": 10**40, "total": 5, "per_second": -3.0, "failed": 10**40},
    {"done": 10**400, "total": 10**400, "per_second": 10**400},
    {"done": -5, "total": -10, "per_second": 1e308, "failed": -1},
    {"done": True, "total": True, "per_second": True, "failed": True},
    {"done": 7, "total": 5, "per_second": 2.5, "failed": 9},
]


def _progress(driver: Driver, payload: dict[str, Any]) -> Event:
    (command,) = driver.outstanding
    return Event(
        event_id=driver.new_id(),
        execution_id=EXECUTION_ID,
        type=ev.COMMAND_PROGRESS,
        step=command.step,
        status="running",
        payload={"attempt": 1, **payload},
        parent_event_id=command.issued_event_id,
        command_id=command.command_id,
        worker_id="test-worker",
        time=NOW,
    )


@pytest.mark.parametrize("payload", HOSTILE)
def test_a_progress_payload_of_any_shape_gives_counts_a_reader_can_trust(
    payload: dict[str, Any],
) -> None:
    driver = Driver(PLAYBOOK).start()
    driver.state.apply(_progress(driver, payload))
    items = driver.state.steps["start"].items
    assert items is not None
    done, total = items["done"], items["total"]
    assert all(
        type(items[k]) is int for k in ("done", "total") + (("failed",) * ("failed" in items))
    )
    assert 0 <= done <= total <= 2**53
    assert 0 <= items.get("failed", 0) <= done
    assert type(items["per_second"]) is float
    assert math.isfinite(items["per_second"]) and items["per_second"] >= 0
    json.dumps(execution_summary(driver.state), allow_nan=False)


def test_a_progress_payload_keeps_the_counts_it_says() -> None:
    driver = Driver(PLAYBOOK).start()
    payload = {"done": 3, "total": 10, "per_second": 1.5, "failed": 1, "junk": "x" * 1000}
    driver.state.apply(_progress(driver, payload))
    assert driver.state.steps["start"].items == {
        "done": 3,
        "total": 10,
        "per_second": 1.5,
        "failed": 1,
    }
