"""The outbox relay's direct publish on a real nats-server.

`Coordinator._after` hands a committed step's notifications to `OutboxRelay.publish` and
gives the event loop two turns before the step's HTTP reply is written: that must be
enough for the notifications to leave the process, or the claim they set off waits behind
the reply. Checked from outside: the loop is blocked right after the two turns and a
second NATS connection, on its own thread, must see the messages while it is blocked.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flowtide.server.outbox import STREAM, OutboxRelay, OutboxRow

from .conftest import NatsServer

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]

BLOCK = 0.5


class _Marks:
    """Stands in for the outbox table: records what the relay marks published."""

    def __init__(self) -> None:
        self.published: list[int] = []
        self.failed: list[int] = []

    def claim(self, limit: int = 256, lease: float = 10.0) -> list[OutboxRow]:
        return []  # the relay's backstop poll finds nothing left behind

    def mark_published(self, ids: list[int]) -> int:
        self.published += ids
        return len(ids)

    def mark_failed(self, ids: list[int], error: str) -> int:
        self.failed += ids
        return len(ids)


def _watch(url: str, subject: str, n: int, seen: list[float], ready: threading.Event) -> None:
    """Core NATS subscriber on its own loop and thread: arrival times of n messages."""

    async def main() -> None:
        import nats

        nc = await nats.connect(url)
        done = asyncio.Event()

        async def got(_msg: Any) -> None:
            seen.append(time.monotonic())
            if len(seen) >= n:
                done.set()

        await nc.subscribe(subject, cb=got)
        await nc.flush()
        ready.set()
        await asyncio.wait_for(done.wait(), 30)
        await nc.close()

    asyncio.run(main())


def test_notifications_leave_within_two_loop_turns(tmp_path: Path) -> None:
    rows = [
        OutboxRow(i, 7, 100 + i, "flowtide.commands.default.7", f'{{"n": {i}}}', 1)
        for i in range(1, 4)
    ]
    with NatsServer.start(tmp_path / "nats") as server:
        seen: list[float] = []
        ready = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(server.url, "flowtide.commands.>", len(rows), seen, ready)
        )
        watcher.start()
        assert ready.wait(30)

        async def main() -> tuple[float, list[int], int]:
            import nats

            nc = await nats.connect(server.url)
            relay = OutboxRelay(None, nc)  # type: ignore[arg-type]  # no table: see _Marks
            marks = _Marks()
            relay.rows = marks  # type: ignore[assignment]
            await relay.start()
            relay.publish(rows)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            # What the step's HTTP reply would do next, made long enough to tell apart.
            time.sleep(BLOCK)
            unblocked = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*relay._sending), 10)
            await relay.stop()
            await nc.close()
            return unblocked, marks.published, relay.published

        unblocked, marked, published = asyncio.run(main())
        watcher.join(30)
    assert len(seen) == len(rows)
    # Every notification arrived while the publishing loop was still blocked.
    assert max(seen) < unblocked - BLOCK / 2, (seen, unblocked)
    # And each was acked by the stream, counted and marked published.
    assert published == len(rows)
    assert sorted(marked) == [r.id for r in rows]


def test_publish_without_a_stream_reports_each_row_failed(tmp_path: Path) -> None:
    """No stream listens on the subject: every row comes back as failed (unlocked for
    the relay to try again), none marked published."""
    rows = [OutboxRow(i, 9, 200 + i, "nowhere.9", "{}", 1) for i in range(1, 3)]
    with NatsServer.start(tmp_path / "nats") as server:

        async def main() -> tuple[list[int], list[int], int]:
            import nats

            nc = await nats.connect(server.url)
            relay = OutboxRelay(None, nc)  # type: ignore[arg-type]
            marks = _Marks()
            relay.rows = marks  # type: ignore[assignment]
            await relay.start()
            info = await relay.js.stream_info(STREAM)
            assert info.config.name == STREAM
            relay.publish(rows)
            await asyncio.wait_for(asyncio.gather(*relay._sending), 20)
            await relay.stop()
            await nc.close()
            return marks.published, marks.failed, relay.failures

        marked, failed, failures = asyncio.run(main())
    assert marked == []
    assert sorted(failed) == [r.id for r in rows]
    assert failures == len(rows)


@pytest.mark.parametrize("duplicate", [False, True])
def test_the_duplicate_fault_puts_every_command_in_the_stream_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, duplicate: bool
) -> None:
    """FLOWTIDE_FAULT_DUPLICATE_COMMANDS (bench/faults.py): each row reaches the stream a
    second time under another message id (JetStream's duplicate window would drop a
    copy under the same one); off, each is there once. Marked published once either way."""
    monkeypatch.setenv("FLOWTIDE_FAULT_DUPLICATE_COMMANDS", "1" if duplicate else "0")
    rows = [
        OutboxRow(i, 5, 300 + i, "flowtide.commands.default.5", f'{{"n": {i}}}', 1)
        for i in range(1, 4)
    ]
    with NatsServer.start(tmp_path / "nats") as server:

        async def main() -> tuple[int, list[int]]:
            import nats

            nc = await nats.connect(server.url)
            relay = OutboxRelay(None, nc)  # type: ignore[arg-type]
            marks = _Marks()
            relay.rows = marks  # type: ignore[assignment]
            await relay.start()
            relay.publish(rows)
            await asyncio.wait_for(asyncio.gather(*relay._sending), 20)
            await relay.stop()
            info = await relay.js.stream_info(STREAM)
            await nc.close()
            return info.state.messages, marks.published

        messages, marked = asyncio.run(main())
    assert messages == len(rows) * (2 if duplicate else 1)
    assert sorted(marked) == [r.id for r in rows]
