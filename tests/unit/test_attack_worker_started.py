"""A worker's early `command.started` that the server did not take goes with the
command's final report (else the run's timeline never shows the command started)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from flowtide.worker import _worker
from flowtide.worker._worker import Worker, _Start


class _Failing:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, execution_id: int, events: list[Any], command_id: int) -> None:
        self.sent.append(events)
        raise ConnectionError("server away")


def test_a_started_report_that_failed_is_sent_again_with_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_worker, "STARTED_AFTER", 0.0)
    reports = _Failing()
    start = _Start()
    start.events.append(SimpleNamespace(to_dict=lambda: {"type": "command.started"}))
    fake = SimpleNamespace(_reports=reports)
    asyncio.run(Worker._report_started(fake, 1, 2, start))  # type: ignore[arg-type]
    assert reports.sent == [[{"type": "command.started"}]]
    # `_handle` puts start.events in front of the final report when this is False.
    assert start.sent is False
