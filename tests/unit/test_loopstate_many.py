"""`LoopState.record_many` on the in-process KV: per item exactly what `record` gives
when called for each item in turn (command ids included), in fewer KV calls."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from flowtide.kv import CREATE_MANY_MAX, KeyValue, KVError, connect
from flowtide.loopstate import LoopState, loop_prefix

Record = tuple[int, str, int | None]


async def _bucket() -> KeyValue:
    return await connect("memory://", f"ls_{uuid.uuid4().hex[:12]}", history=1)


def _count(kv: Any, name: str, calls: list[str]) -> None:
    """Count the calls of `kv.<name>` (the handle's attribute shadows the method)."""
    real: Callable[..., Awaitable[Any]] = getattr(kv, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return await real(*args, **kwargs)

    setattr(kv, name, counted)


def _plan(seed: int, size: int) -> list[Record]:
    """Records with repeated indices, with and without command ids, as duplicate and
    re-issued deliveries produce them."""
    rng = random.Random(seed)
    return [
        (rng.randrange(size // 3), rng.choice(["ok", "error"]), rng.choice([None, 1, 2, 3]))
        for _ in range(size)
    ]


async def _stored(kv: KeyValue, eid: int) -> dict[str, bytes]:
    found = await kv.get_last_many(f"{loop_prefix(eid, 'fetch', 0)}.r.*")
    return {key.rsplit(".", 1)[1]: entry.value for key, entry in found.items()}


@pytest.mark.parametrize("seed", range(4))
def test_record_many_gives_what_record_gives_one_by_one(seed: int) -> None:
    async def main() -> None:
        one, many = await _bucket(), await _bucket()
        plan = _plan(seed, 300)
        # A record an earlier process left (written, never logged) for some indices.
        for index in range(0, 100, 7):
            await LoopState(one).record(5, "fetch", 0, index, "ok", 2)
            await LoopState(many).record(5, "fetch", 0, index, "ok", 2)
        expected = [await LoopState(one).record(5, "fetch", 0, *record) for record in plan]
        rng = random.Random(seed)
        got: list[bool] = []
        start = 0
        while start < len(plan):
            size = rng.randrange(1, 60)
            got += await LoopState(many).record_many(5, "fetch", 0, plan[start : start + size])
            start += size
        assert got == expected
        assert True in got and False in got
        assert await _stored(many, 5) == await _stored(one, 5)
        for kv in (one, many):
            await kv.destroy()
            await kv.close()

    asyncio.run(main())


def test_record_many_duplicates_in_one_call() -> None:
    async def main() -> None:
        kv = await _bucket()
        state = LoopState(kv)
        got = await state.record_many(
            9,
            "work",
            0,
            [
                (3, "ok", 111),
                (3, "ok", 111),  # the same command again: counts again
                (3, "ok", 222),  # another command: a duplicate
                (3, "ok", None),
                (4, "ok", None),
                (4, "ok", None),
                (4, "ok", 111),
            ],
        )
        assert got == [True, True, False, False, True, False, False]
        assert await state.finished_count(9, "work", 0) == 2
        await kv.destroy()
        await kv.close()

    asyncio.run(main())


def test_record_many_chunks_and_reads_back_once_per_chunk() -> None:
    async def main() -> None:
        kv = await _bucket()
        state = LoopState(kv)
        calls: list[str] = []
        for name in ("create_many", "get_last_many", "get", "create"):
            _count(kv, name, calls)
        size = 2 * CREATE_MANY_MAX + 500
        records: list[Record] = [(i, "ok", 7) for i in range(size)]
        assert await state.record_many(1, "big", 0, records) == [True] * size
        assert calls == ["create_many"] * 3
        calls.clear()
        # Issued again by the same command: every record counts again, read back in
        # one get_last_many per chunk; another command's records do not count.
        again = records[:10] + [(i, "ok", 8) for i in range(10, 1500)]
        got = await state.record_many(1, "big", 0, again)
        assert got == [True] * 10 + [False] * 1490
        assert calls == ["create_many", "get_last_many", "create_many", "get_last_many"]
        assert await state.finished_count(1, "big", 0) == size
        assert await state.record_many(1, "big", 0, []) == []
        await kv.destroy()
        await kv.close()

    asyncio.run(main())


def test_record_many_fails_as_record_does() -> None:
    async def main() -> None:
        kv = await _bucket()
        state = LoopState(kv)
        await kv.close()
        with pytest.raises(KVError, match="closed"):
            await state.record(1, "s", 0, 0, "ok")
        with pytest.raises(KVError, match="closed"):
            await state.record_many(1, "s", 0, [(0, "ok", None)])
        other = await connect("memory://", kv.bucket)
        assert await other.keys() == []
        await other.destroy()
        await other.close()

    asyncio.run(main())
