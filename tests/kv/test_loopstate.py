"""Loop state on a real NATS JetStream bucket (DESIGN.md "Loop state"), at scale.

The point of the per-iteration keys: a result delivered twice, by different server
processes, counts once; completion fires once; no value grows with the loop; and the
state is gone when the execution ends (the bucket TTL catches executions that never do).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

from flowtide.kv import KeyValue, connect
from flowtide.loopstate import LoopState, loop_prefix

from .natsserver import NatsServer

pytestmark = [pytest.mark.nats, pytest.mark.timeout(300)]

BUCKET = "flowtide_state"


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with NatsServer.start(tmp_path_factory.mktemp("nats")) as server:
        yield server.url


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def open_bucket(url: str, name: str, **config: Any) -> KeyValue:
    return await connect(url, name, ttl=config.pop("ttl", 3600), **config)


def _deliver(args: tuple[str, str, int, list[int]]) -> tuple[int, int]:
    """One 'server process': records the iterations delivered to it, then claims done."""
    url, bucket, eid, indices = args

    async def main() -> tuple[int, int]:
        kv = await connect(url, bucket)
        state = LoopState(kv)
        counted = 0
        for index in indices:
            counted += await state.record(eid, "fetch/all", 0, index, "ok")
        won = await state.claim_done(eid, "fetch/all", 0)
        await kv.close()
        return counted, int(won)

    return asyncio.run(main())


def test_duplicate_deliveries_by_concurrent_processes_count_once(nats_url: str) -> None:
    size, processes, eid = 2000, 4, 7001
    bucket = f"dup_{int(time.time())}"
    run(open_bucket(nats_url, bucket))
    rng = random.Random(4)
    plan: list[list[int]] = [[] for _ in range(processes)]
    for index in range(size):  # every iteration is delivered to two different processes
        first = rng.randrange(processes)
        second = (first + 1 + rng.randrange(processes - 1)) % processes
        plan[first].append(index)
        plan[second].append(index)
    for indices in plan:
        rng.shuffle(indices)
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        outcomes = pool.map(_deliver, [(nats_url, bucket, eid, p) for p in plan])
    assert sum(len(p) for p in plan) == 2 * size
    assert sum(counted for counted, _ in outcomes) == size  # each result counted once
    assert sum(won for _, won in outcomes) == 1  # the loop's continuation fires once

    async def check() -> None:
        kv = await connect(nats_url, bucket)
        state = LoopState(kv)
        assert await state.finished_count(eid, "fetch/all", 0) == size
        results = await kv.get_last_many(f"{loop_prefix(eid, 'fetch/all', 0)}.r.*")
        assert sorted(int(k.rsplit(".", 1)[1]) for k in results) == list(range(size))
        await kv.destroy()
        await kv.close()

    run(check())


def test_a_100000_iteration_loop(nats_url: str) -> None:
    size, eid = 100_000, 7002

    async def main() -> None:
        kv = await open_bucket(nats_url, f"big_{int(time.time())}")
        state = LoopState(kv)
        await state.start(eid, "fetch", 0, {"size": size, "iterator": "x", "mode": "parallel"})
        limit = asyncio.Semaphore(256)

        async def record(index: int) -> bool:
            async with limit:
                return await state.record(eid, "fetch", 0, index, "ok")

        t0 = time.monotonic()
        recorded = await asyncio.gather(*(record(i) for i in range(size)))
        elapsed = time.monotonic() - t0
        assert all(recorded)
        assert await state.claim_done(eid, "fetch", 0)
        assert await state.finished_count(eid, "fetch", 0) == size
        status = await kv.status()
        assert status.values == size + 2  # meta, 100,000 results, done
        # No value grows with the loop: the largest is the meta record, far from 1 MB.
        assert status.bytes / status.values < 200
        meta = await kv.get(f"{loop_prefix(eid, 'fetch', 0)}.meta")
        assert len(meta.value) < 200
        t1 = time.monotonic()
        await state.cleanup(eid)
        cleaned = time.monotonic() - t1
        assert await kv.keys("exec.>") == []
        assert (await kv.status()).values == 0
        # One purge request per filter, not one per key: seconds, not minutes.
        assert cleaned < 10, f"cleanup of {size} keys took {cleaned:.1f} s"
        print(f"recorded {size} in {elapsed:.1f} s, cleaned up in {cleaned:.2f} s")
        await kv.destroy()
        await kv.close()

    run(main())


def test_ttl_removes_state_of_an_execution_that_never_ends(nats_url: str) -> None:
    async def main() -> None:
        kv = await open_bucket(nats_url, f"ttl_{int(time.time())}", ttl=1.0)
        state = LoopState(kv)
        await state.start(7003, "fetch", 0, {"size": 3})
        for index in range(3):
            await state.record(7003, "fetch", 0, index, "ok")
        assert len(await kv.keys("exec.7003.>")) == 4
        deadline = time.monotonic() + 10
        while await kv.keys("exec.7003.>") and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await kv.keys("exec.7003.>") == []
        await kv.destroy()
        await kv.close()

    run(main())


PLAYBOOK = dedent(
    """\
    apiVersion: noetl.io/v2
    kind: Playbook
    metadata: {name: kv_loop, path: tests/kv_loop}
    workload: {fail: false}
    workflow:
      - step: start
        loop: {in: "{{ range(40) | list }}", iterator: x, spec: {mode: parallel, max_in_flight: 8}}
        tool: {kind: python, code: "result = {'sq': x * x}"}
        next: [end]
      - step: end
        tool:
          kind: python
          input: {n: "{{ start.stats.total }}", fail: "{{ fail }}"}
          code: |
            if fail:
                raise RuntimeError("failing on purpose")
            result = {"n": n}
    """
)


@pytest.mark.parametrize("fail", [False, True])
def test_state_is_removed_when_the_execution_ends(
    nats_url: str, tmp_path: Path, fail: bool
) -> None:
    from flowtide.playbook.loader import parse_playbook
    from flowtide.runtime.local import LocalRuntime
    from flowtide.store.sqlite import SQLiteStore

    playbook = parse_playbook(PLAYBOOK, str(tmp_path / "pb.yaml"))
    store = SQLiteStore(tmp_path / "flowtide.db")
    seen: list[int] = []

    async def main() -> tuple[str, list[str]]:
        kv = await open_bucket(nats_url, BUCKET)

        def listener(events: Any, states: Any) -> None:
            seen.extend(1 for e in events if e.type == "loop.item")

        async with LocalRuntime(store, kv=kv, listener=listener) as runtime:
            state = await runtime.run(playbook, workload={"fail": fail})
            left = await kv.keys(f"exec.{state.execution_id}.>")
        await kv.close()
        return state.status, left

    try:
        status, left = run(main())
    finally:
        store.close()
    assert status == ("failed" if fail else "completed")
    assert len(seen) == 40
    assert left == []


@pytest.mark.parametrize("where", ["memory", "nats"])
def test_a_record_the_log_never_got_counts_for_the_same_command(nats_url: str, where: str) -> None:
    """A server that died between the KV write and the log commit left a record; the
    command, issued again with the same id, still finishes the iteration. A report of
    another command for the same iteration stays a duplicate."""

    async def main() -> None:
        url = "memory://" if where == "memory" else nats_url
        kv = await open_bucket(url, f"orphan_{where}")
        state = LoopState(kv)
        assert await state.record(9, "work", 0, 3, "ok", 111) is True
        assert await state.record(9, "work", 0, 3, "ok", 111) is True
        assert await state.record(9, "work", 0, 3, "ok", 222) is False
        assert await state.record(9, "work", 0, 3, "ok") is False
        assert await state.record(9, "work", 0, 4, "ok") is True
        assert await state.record(9, "work", 0, 4, "ok", 111) is False
        assert await state.finished_count(9, "work", 0) == 2
        await kv.close()

    run(main())


def test_record_many_on_nats_counts_each_iteration_once(nats_url: str) -> None:
    """Two handles on their own connections record overlapping batches for different
    commands: every iteration counts once. Re-issued, the first command's records count
    again exactly where it won (read back in one multi-key read of 1,000 keys); a third
    command's do not count."""

    def deliver(indices: list[int], command: int) -> list[bool]:
        async def main() -> list[bool]:
            kv = await connect(nats_url, bucket)
            out = await LoopState(kv).record_many(
                eid, "fetch", 0, [(i, "ok", command + i) for i in indices]
            )
            await kv.close()
            return out

        return asyncio.run(main())

    bucket, eid, size = f"many_{int(time.time())}", 7004, 1500
    run(open_bucket(nats_url, bucket))
    rng = random.Random(5)
    first = rng.sample(range(size), 1000)
    second = sorted(set(range(size)) - set(first)) + rng.sample(first, 500)
    with ThreadPoolExecutor(2) as pool:
        got1, got2 = pool.map(deliver, [first, second], [0, 100_000])
    assert sum(got1) + sum(got2) == size
    assert all(got2[:500]) and sum(got1) >= 500
    assert deliver(first, 0) == got1
    assert deliver(second, 1_000_000) == [False] * 1000

    async def check() -> None:
        kv = await connect(nats_url, bucket)
        assert await LoopState(kv).finished_count(eid, "fetch", 0) == size
        await kv.destroy()
        await kv.close()

    run(check())
