"""A finished command's report that the server does not settle frees its worker slot
after REPORT_HOLDS_SLOT: a shard whose database is down once kept every slot of every
worker for its finished commands, and no command of another shard ran."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flowtide.worker import _worker
from flowtide.worker._worker import Worker


class _Unsettled:
    """Settles a report only when `answer` is set, handing over `handed` then."""

    def __init__(self, handed: Any = None) -> None:
        self.answer = asyncio.Event()
        self.handed = handed
        self.takes: list[bool] = []

    async def send(
        self, execution_id: int, events: list[Any], command_id: int = 0, **kw: Any
    ) -> Any:
        self.takes.append(bool(kw.get("take")))
        await self.answer.wait()
        return self.handed


def _claimed(command_id: int, execution_id: int = 11) -> Any:
    return SimpleNamespace(
        command=SimpleNamespace(command_id=command_id, execution_id=execution_id)
    )


def _worker_with(reports: _Unsettled, tmp_path: Path) -> Worker:
    worker = Worker("http://127.0.0.1:9", "nats://127.0.0.1:9", home=tmp_path, concurrency=2)
    worker._reports = reports  # type: ignore[assignment]
    worker._run = lambda *args: []  # type: ignore[method-assign]
    return worker


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker, "REPORT_HOLDS_SLOT", 0.05)
    monkeypatch.setattr(_worker, "STARTED_AFTER", 60.0)


def test_an_unsettled_report_frees_its_slot_and_still_settles(tmp_path: Path) -> None:
    async def main() -> None:
        reports = _Unsettled()
        worker = _worker_with(reports, tmp_path)
        worker._taken = 1  # the claim took the slot
        task = asyncio.create_task(worker._handle(_claimed(7), None))  # type: ignore[arg-type]
        await asyncio.sleep(0.3)
        assert worker._taken == 0, "the slot stayed with a report nobody settled"
        assert not task.done() and 7 in worker.held  # its lease is still extended
        reports.answer.set()
        await task
        assert worker._taken == 0 and worker.completed == 1 and 7 not in worker.held
        assert reports.takes == [True]

    asyncio.run(main())


def test_a_command_handed_over_late_takes_a_slot_again(tmp_path: Path) -> None:
    async def main() -> None:
        reports = _Unsettled()
        worker = _worker_with(reports, tmp_path)
        worker._taken = 1
        calls = 0

        async def send(*args: Any, **kw: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:  # the first report: settled late, with a command handed over
                await reports.answer.wait()
                return (_claimed(8), None)
            return None

        reports.send = send  # type: ignore[method-assign]
        task = asyncio.create_task(worker._handle(_claimed(7), None))  # type: ignore[arg-type]
        await asyncio.sleep(0.3)
        assert worker._taken == 0
        reports.answer.set()
        await task
        # The handed command took a slot again, ran, and gave it back when reported.
        for _ in range(100):
            if not worker._tasks:
                break
            await asyncio.sleep(0.01)
        assert calls == 2 and worker._taken == 0 and worker.completed == 2

    asyncio.run(main())


def test_a_report_settled_in_time_keeps_its_slot_for_the_handed_command(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        reports = _Unsettled(handed=(_claimed(8), None))
        reports.answer.set()
        worker = _worker_with(reports, tmp_path)
        worker._taken = 1
        first = True

        async def send(*args: Any, **kw: Any) -> Any:
            nonlocal first
            reports.takes.append(bool(kw.get("take")))
            handed = (_claimed(8), None) if first else None
            first = False
            return handed

        reports.send = send  # type: ignore[method-assign]
        await worker._handle(_claimed(7), None)  # type: ignore[arg-type]
        assert worker._taken == 1, "the handed command runs in the slot it was given"
        for _ in range(100):
            if not worker._tasks:
                break
            await asyncio.sleep(0.01)
        assert worker._taken == 0 and worker.completed == 2

    asyncio.run(main())
