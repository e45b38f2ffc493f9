"""Live logs of a command (`flowtide.logs`, `flowtide.logfiles`, `flowtide.logread`): the
ring keeps memory and disk bounded, whatever a step prints; writes are forwarded as whole
lines, masked; a reader that falls behind is told how much it missed."""

from __future__ import annotations

import asyncio
from collections.abc import Set
from pathlib import Path
from typing import Any

from flowtide.logfiles import FileSpool, LiveLog, read_live
from flowtide.logread import read_logs
from flowtide.logs import CHUNK_BYTES, RING_BYTES, CommandLog, LogKey

KEY = LogKey(execution_id=7, command_id=11, step="talk")


class _Spool:
    """Records what a command log forwards."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed: tuple[int, int] | None = None

    def append(self, key: LogKey, data: bytes, total: int, lines: int) -> None:
        self.chunks.append(data)

    def close(self, key: LogKey, total: int, lines: int) -> None:
        self.closed = (total, lines)


def test_whole_lines_are_forwarded_masked_and_the_rest_at_close() -> None:
    spool = _Spool()
    log = CommandLog(KEY, spool, secrets=lambda: {"hunter2-secret"})
    log.write("the password is hunter2-")
    log.flush()
    assert spool.chunks == []  # half a line (and half a secret) waits
    log.write("secret\npartial")
    log.flush()
    assert spool.chunks == [b"the password is ***\n"]
    log.add_secrets(["partial"])
    log.close()
    assert spool.chunks[-1] == b"***"
    assert spool.closed == (len(b"the password is ***\n***"), 1)
    log.write("after the end\n")  # an abandoned thread still printing: dropped
    assert len(spool.chunks) == 2


def test_a_command_log_holds_at_most_one_chunk() -> None:
    spool = _Spool()
    log = CommandLog(KEY, spool)
    for i in range(20_000):
        log.write(f"line {i}\n")
        assert log._size < CHUNK_BYTES
    log.close()
    assert b"".join(spool.chunks) == "".join(f"line {i}\n" for i in range(20_000)).encode()
    assert max(len(c) for c in spool.chunks) <= CHUNK_BYTES + 32
    assert log.lines == 20_000


SECRET = "s3cr3t-Tok3n-0f-th3-run"
PEM = (
    "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEF\nAASCBKcwggSjAgEAAoIBAQC7\n-----END KEY-----"
)


def test_a_secret_is_not_split_between_two_chunks() -> None:
    # A line longer than a chunk was forwarded at CHUNK_BYTES wherever that fell, and a
    # multi-line secret (a PEM key) at a line's end: each part masked alone, both shown.
    spool = _Spool()
    log = CommandLog(KEY, spool, secrets=lambda: {SECRET, PEM})
    log.write("x" * (CHUNK_BYTES - 10) + SECRET[:12])  # the chunk is full mid-secret
    log.write(SECRET[12:] + " and more\n")
    log.write("key:\n" + PEM[:40])
    log.flush()  # the flusher's tick while the key is half printed
    log.write(PEM[40:] + "\nbye\n")
    log.close()
    assert len(spool.chunks) >= 3
    out = b"".join(spool.chunks).decode()
    assert out == "x" * (CHUNK_BYTES - 10) + "*** and more\nkey:\n***\nbye\n"
    # What a chunk holds back is bounded too.
    assert log._size == 0


def test_what_may_start_a_secret_is_held_back_at_most_half_a_chunk() -> None:
    spool = _Spool()
    log = CommandLog(KEY, spool, secrets=lambda: {"y" * 20_000})  # a secret over HOLD_BYTES
    for _ in range(40):
        log.write("y" * 1000)
        assert log._size < CHUNK_BYTES
    assert spool.chunks, "a line without end is forwarded once a chunk is full"


def test_program_output_split_inside_a_character_stays_whole() -> None:
    spool = _Spool()
    log = CommandLog(KEY, spool)
    data = "héllo ✓\n".encode()
    log.write_bytes(data[:2], "stdout")
    log.write_bytes(data[2:], "stdout")
    log.close()
    assert b"".join(spool.chunks) == data


def test_the_ring_file_stays_bounded_and_keeps_the_newest_output(tmp_path: Path) -> None:
    spool = FileSpool(tmp_path)
    log = CommandLog(KEY, spool)
    whole = "".join(f"line {i:06d} {'x' * 40}\n" for i in range(40_000)).encode()
    path = tmp_path / "7" / "11.log"
    biggest = 0
    for start in range(0, len(whole), 997):
        log.write(whole[start : start + 997].decode())
        if path.exists():
            biggest = max(biggest, path.stat().st_size)
    log.close()
    assert len(whole) > 20 * RING_BYTES
    assert biggest <= 2 * RING_BYTES + CHUNK_BYTES + 200
    ring = read_live(tmp_path, 7)[11]
    assert ring.step == "talk" and ring.end == len(whole)
    assert RING_BYTES - 1024 <= len(ring.data) <= 2 * RING_BYTES
    assert whole.endswith(ring.data) and ring.data.startswith(b"line ")
    assert read_live(tmp_path, 7, skip={11}) == {}


class _NoEvents:
    def events(self, execution_id: int, **kwargs: Any) -> list[Any]:
        return []


def test_a_reader_behind_the_ring_is_told_what_it_missed() -> None:
    rings = [
        {11: LiveLog(11, "talk", None, 0, b"a\nb\n")},
        {11: LiveLog(11, "talk", None, 100, b"z\n")},  # 96 bytes went out of the ring
    ]
    statuses = ["running", "running", "completed"]

    async def live(skip: Set[int]) -> dict[int, LiveLog]:
        return rings.pop(0) if rings else {11: LiveLog(11, "talk", None, 100, b"z\n")}

    async def status() -> str:
        return statuses.pop(0)

    async def secrets() -> frozenset[str]:
        return frozenset({"b"})

    async def read() -> list[Any]:
        return [
            p
            async for p in read_logs(
                _NoEvents(),  # type: ignore[arg-type]
                7,
                live=live,
                status=status,
                secrets=secrets,
                follow=True,
                poll=0,
            )
        ]

    pieces = asyncio.run(read())
    assert [(p["offset"], p["dropped"], p["text"]) for p in pieces] == [
        (0, 0, "a\nb\n".replace("b", "***")),
        (100, 96, "z\n"),
    ]
    assert all(p["running"] for p in pieces)


class _Reads:
    """What the logs route asks before its stream starts (an execution of step `talk`)."""

    class _State:
        class playbook:  # noqa: N801 - the attribute path the route reads
            steps = {"talk": None}

    async def check(self, who: Any, execution_id: int) -> None:
        pass

    async def state(self, execution_id: int) -> Any:
        return self._State()


def test_follow_streams_are_counted_when_answered_and_given_back_when_dropped() -> None:
    # The count went up when a stream's body started: requests in flight together all
    # passed the check first, so one reader could hold any number of followers. And a
    # stream whose body never ran (its client gone) must not keep its slot.
    import gc

    from flowtide.auth.principal import ANONYMOUS
    from flowtide.web import executions
    from flowtide.web.problems import RequestError

    async def answer() -> Any:
        return await executions.execution_logs(7, ANONYMOUS, _Reads(), follow=True)  # type: ignore[arg-type]

    async def run() -> None:
        held = [await answer() for _ in range(executions.MAX_LOG_STREAMS)]
        try:
            await answer()
        except RequestError as exc:
            assert exc.status == 503
        else:
            raise AssertionError("one stream over the limit was answered")
        await executions.execution_logs(7, ANONYMOUS, _Reads(), follow=False)  # type: ignore[arg-type]
        held.clear()
        gc.collect()
        assert executions._log_streams.held == 0
        await answer()  # a slot again

    asyncio.run(run())
    gc.collect()
    assert executions._log_streams.held == 0
