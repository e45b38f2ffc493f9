"""The server's live logs: a worker of the execution's pool may publish under any
command id of it; only the execution's running commands are shown live, under the step
and loop index of their records, not of what was published."""

from __future__ import annotations

import asyncio
from collections.abc import Set
from types import SimpleNamespace
from typing import Any

from flowtide.engine.state import CommandRecord
from flowtide.logfiles import LiveLog
from flowtide.logread import read_logs
from flowtide.server.logs import own_rings


class _NoEvents:
    def events(self, execution_id: int, **kwargs: Any) -> list[Any]:
        return []


def _read(rings: dict[int, LiveLog], step: str | None = None) -> list[Any]:
    async def live(skip: Set[int]) -> dict[int, LiveLog]:
        return rings

    async def status() -> str:
        return "running"

    async def secrets() -> frozenset[str]:
        return frozenset()

    async def read() -> list[Any]:
        return [
            p
            async for p in read_logs(
                _NoEvents(),  # type: ignore[arg-type]
                7,
                live=live,
                status=status,
                secrets=secrets,
                step=step,
            )
        ]

    return asyncio.run(read())


def test_a_ring_of_no_running_command_is_not_shown() -> None:
    running = {11: CommandRecord(11, "load", 1, 1, 3, 500)}
    published = {
        11: LiveLog(11, "pay", None, 0, b"real output\n"),  # the step header lies
        99: LiveLog(99, "load", None, 0, b"forged: transfer approved\n"),
    }
    pieces = _read(own_rings(published, running))
    assert [(p["command_id"], p["step"], p["loop_index"], p["text"]) for p in pieces] == [
        ("11", "load", 3, "real output\n")
    ]
    assert _read(own_rings(published, running), step="pay") == []


def test_reads_without_follow_are_counted_too() -> None:
    # Each read may hold megabytes of rings: many at once must not be answered.
    import gc

    from flowtide.auth.principal import ANONYMOUS
    from flowtide.web import executions
    from flowtide.web.problems import RequestError

    from .test_logs import _Reads

    async def answer(follow: bool = False) -> Any:
        return await executions.execution_logs(7, ANONYMOUS, _Reads(), follow=follow)  # type: ignore[arg-type]

    async def run() -> None:
        held = [await answer() for _ in range(executions.MAX_LOG_READS)]
        try:
            await answer()
        except RequestError as exc:
            assert exc.status == 503
        else:
            raise AssertionError("one read over the limit was answered")
        following = await answer(follow=True)  # the streams have their own slots
        del following
        held.clear()
        gc.collect()
        assert executions._log_reads.held == 0
        await answer()

    asyncio.run(run())
    gc.collect()
    assert executions._log_reads.held == 0 and executions._log_streams.held == 0


class _Msg:
    def __init__(self, subject: str, data: bytes, start: int) -> None:
        self.subject = subject
        self.data = data
        self.headers = {"Flowtide-Start": str(start), "Flowtide-Step": "talk"}


class _Stream:
    """The log stream as `read_rings` reads it: one command's two chunks."""

    def __init__(self) -> None:
        self.reads = 0

    async def stream_info(self, name: str, subjects_filter: str) -> Any:
        state = SimpleNamespace(subjects={"flowtide.logs.default.7.11": 2})
        return SimpleNamespace(state=state)

    async def subscribe(self, subject: str, ordered_consumer: bool) -> Any:
        self.reads += 1
        msgs = [_Msg("flowtide.logs.default.7.11", b"a\n", 0), _Msg("x.11", b"b\n", 2)]

        class _Sub:
            async def next_msg(self, timeout: float) -> _Msg:
                await asyncio.sleep(0)
                return msgs.pop(0)

            async def unsubscribe(self) -> None:
                pass

        return _Sub()


def test_followers_of_one_execution_share_a_read_of_the_stream() -> None:
    from flowtide.server.logs import read_rings

    stream = _Stream()

    async def run() -> list[dict[int, LiveLog]]:
        return list(
            await asyncio.gather(*(read_rings(stream, 7, set(), pool="default") for _ in range(50)))
        )

    got = asyncio.run(run())
    assert stream.reads == 1
    assert all(g == {11: LiveLog(11, "talk", None, 0, b"a\nb\n")} for g in got)
