"""The KV port's conformance suite: every adapter's test module subclasses `KVConformance`.

A subclass sets `__test__ = True`, implements `make_kv` (open a handle on a bucket,
creating it with the given configuration) and adjusts the capability flags. Tests open
buckets through `open_kv`, which picks a fresh bucket name, and every bucket a test
touched is destroyed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from flowtide.kv import (
    CREATE_MANY_MAX,
    BucketFullError,
    BucketNotFoundError,
    Entry,
    InvalidKeyError,
    KeyExistsError,
    KeyNotFoundError,
    KeyValue,
    KeyWatcher,
    KVError,
    Operation,
    ValueTooLargeError,
    WrongRevisionError,
    connect,
)

BAD_KEYS = [
    "",
    ".a",
    "a.",
    "a..b",
    "a b",
    "a:b",
    "a*",
    "a.*",
    "a.>",
    "*",
    ">",
    "_kv.x",
    "ключ",
    "a\n",
]
GOOD_KEYS = ["a", "a/b", "a-b_c=d.e", "A.9.z", "exec.1.loop.fetch=2Eall.0.r.12"]
BAD_FILTERS = ["a..b", ".a", "a.", "a.>.b", "a*", "a b", ">.a", "a.*x"]


async def race_to_create(
    kv: KeyValue, key: str, value: bytes, contenders: int
) -> tuple[list[int], list[KeyExistsError]]:
    """`contenders` concurrent `kv.create(key, value)`: the revisions the winners got and
    the errors the losers got."""
    winners: list[int] = []
    losers: list[KeyExistsError] = []

    async def claim() -> None:
        try:
            winners.append(await kv.create(key, value))
        except KeyExistsError as exc:
            losers.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(contenders):
            tg.start_soon(claim)
    return winners, losers


async def increment_from_threads(
    url: str, bucket: str, key: str, *, threads: int, tasks: int, rounds: int
) -> int:
    """Add 1 to the number stored under `key`, `rounds` times in each of `tasks` tasks in
    each of `threads` threads; every thread runs its own event loop with its own handle.
    Each increment is a get and an update, retried on WrongRevisionError.

    Returns:
        How many updates lost a race. Asserts that no thread failed.
    """
    lost: list[int] = []
    errors: list[BaseException] = []

    async def thread_main() -> None:
        handle = await connect(url, bucket)
        conflicts = 0

        async def increment() -> None:
            nonlocal conflicts
            for _ in range(rounds):
                while True:
                    entry = await handle.get(key)
                    # Let the other tasks of this loop in between (memory never waits).
                    await asyncio.sleep(0)
                    try:
                        await handle.update(key, b"%d" % (int(entry.value) + 1), entry.revision)
                        break
                    except WrongRevisionError:
                        conflicts += 1

        await asyncio.gather(*(increment() for _ in range(tasks)))
        lost.append(conflicts)
        await handle.close()

    def run() -> None:
        try:
            asyncio.run(thread_main())
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    await anyio.to_thread.run_sync(lambda: [w.join() for w in workers])
    assert errors == []
    return sum(lost)


class KVConformance:
    """Behaviour every `KeyValue` adapter must show (ADR-8, ADR-31 multi-last)."""

    __test__ = False
    pytestmark = [pytest.mark.anyio]

    # Capability flags and timing knobs an adapter may override.
    ttl: float = 0.3
    #: The replicas `make_kv` gives a bucket unless told (3 on a cluster).
    replicas: int = 1
    ttl_slack: float = 0.3
    supports_point_in_time: bool = True
    # A per-value TTL is at least 1 s; expiry may lag that much more (polled, not slept).
    value_ttl_slack: float = 3.0
    # Only ever waited for what must come: a long bound costs nothing when all is well,
    # and 2 s was exceeded on a 2-core CI machine under load (test_watch_marker_only_once).
    watch_timeout: float = 10.0

    async def make_kv(self, bucket: str, **config: Any) -> KeyValue:
        """Open bucket `bucket` (creating it with `config`: history, ttl, ...)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ plumbing

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture(autouse=True)
    async def _kv_cleanup(self) -> AsyncIterator[None]:
        self._buckets: list[str] = []
        self._handles: list[KeyValue] = []
        yield
        for handle in self._handles:
            await handle.close()
        # Reopen by name: a test may have closed or destroyed its own handles.
        for name in dict.fromkeys(self._buckets):
            kv = await self.make_kv(name)
            with contextlib.suppress(BucketNotFoundError):
                await kv.destroy()
            await kv.close()

    def bucket_name(self) -> str:
        return f"conf_{uuid.uuid4().hex[:12]}"

    async def open_kv(self, bucket: str | None = None, **config: Any) -> KeyValue:
        """A handle on `bucket` (a fresh bucket by default), destroyed after the test."""
        name = bucket or self.bucket_name()
        self._buckets.append(name)
        kv = await self.make_kv(name, **config)
        self._handles.append(kv)
        return kv

    async def next_item(self, watcher: KeyWatcher) -> Entry | None:
        with anyio.fail_after(self.watch_timeout):
            return await anext(watcher)

    async def initial_data(self, watcher: KeyWatcher) -> list[Entry]:
        """Everything up to the end-of-initial-data marker."""
        items: list[Entry] = []
        while (item := await self.next_item(watcher)) is not None:
            items.append(item)
        return items

    async def next_entry(self, watcher: KeyWatcher) -> Entry:
        item = await self.next_item(watcher)
        assert item is not None, "end-of-initial-data marker delivered twice"
        return item

    # ------------------------------------------------------------------ get / put

    async def test_put_then_get(self) -> None:
        kv = await self.open_kv()
        before = time.time()
        rev = await kv.put("user.name", b"Bob")
        entry = await kv.get("user.name")
        assert isinstance(rev, int) and rev >= 1
        assert entry.bucket == kv.bucket
        assert entry.key == "user.name"
        assert entry.value == b"Bob"
        assert entry.revision == rev
        assert entry.operation is Operation.PUT
        assert entry.delta == 0
        assert before - 5 <= entry.created <= time.time() + 5

    async def test_empty_value_round_trips(self) -> None:
        kv = await self.open_kv()
        await kv.put("k", b"")
        assert (await kv.get("k")).value == b""

    async def test_revisions_increase_across_the_bucket(self) -> None:
        kv = await self.open_kv()
        revs = [await kv.put(key, b"v") for key in ("a", "b", "a", "c")]
        assert revs == sorted(revs) and len(set(revs)) == 4
        assert revs == list(range(revs[0], revs[0] + 4))
        assert (await kv.get("a")).revision == revs[2]

    async def test_put_overwrites(self) -> None:
        kv = await self.open_kv()
        await kv.put("k", b"1")
        rev = await kv.put("k", b"2")
        entry = await kv.get("k")
        assert (entry.value, entry.revision) == (b"2", rev)

    async def test_get_missing_key(self) -> None:
        kv = await self.open_kv()
        with pytest.raises(KeyNotFoundError) as info:
            await kv.get("nope")
        assert info.value.key == "nope"
        assert info.value.bucket == kv.bucket
        assert isinstance(info.value, KVError)

    async def test_get_by_revision(self) -> None:
        kv = await self.open_kv(history=5)
        r1 = await kv.put("k", b"one")
        other = await kv.put("other", b"x")
        r2 = await kv.put("k", b"two")
        old = await kv.get("k", revision=r1)
        assert (old.value, old.revision, old.delta) == (b"one", r1, 1)
        assert (await kv.get("k", revision=r2)).delta == 0
        with pytest.raises(KeyNotFoundError) as info:
            await kv.get("k", revision=other)
        assert info.value.revision == other
        with pytest.raises(KeyNotFoundError):
            await kv.get("k", revision=r2 + 100)

    async def test_get_revision_dropped_by_history_limit(self) -> None:
        kv = await self.open_kv(history=1)
        r1 = await kv.put("k", b"one")
        await kv.put("k", b"two")
        with pytest.raises(KeyNotFoundError):
            await kv.get("k", revision=r1)

    # ------------------------------------------------------------------ create / update

    async def test_create_new_key(self) -> None:
        kv = await self.open_kv()
        rev = await kv.create("k", b"v")
        assert (await kv.get("k")).revision == rev

    async def test_create_existing_key_fails(self) -> None:
        kv = await self.open_kv()
        rev = await kv.put("k", b"v")
        with pytest.raises(KeyExistsError) as info:
            await kv.create("k", b"w")
        assert info.value.key == "k"
        assert info.value.revision == rev
        assert (await kv.get("k")).value == b"v"

    async def test_create_after_delete_and_after_purge(self) -> None:
        kv = await self.open_kv(history=5)
        await kv.create("k", b"1")
        await kv.delete("k")
        rev = await kv.create("k", b"2")
        assert (await kv.get("k")).revision == rev
        await kv.purge("k")
        rev = await kv.create("k", b"3")
        entry = await kv.get("k")
        assert (entry.value, entry.revision) == (b"3", rev)
        with pytest.raises(KeyExistsError):
            await kv.create("k", b"4")

    async def test_concurrent_creates_have_one_winner(self) -> None:
        kv = await self.open_kv()
        winners, losers = await race_to_create(kv, "done", b"1", 16)
        assert len(winners) == 1 and len(losers) == 15
        assert all(exc.revision == winners[0] for exc in losers)

    # ------------------------------------------------------------------ create_many

    async def test_create_many_new_keys(self) -> None:
        kv = await self.open_kv()
        items = [(f"k.{i}", b"v%d" % i) for i in range(20)]
        revs = await kv.create_many(items)
        assert all(isinstance(r, int) for r in revs)
        first = revs[0]
        assert isinstance(first, int)
        assert revs == list(range(first, first + 20))
        for (key, value), rev in zip(items, revs, strict=True):
            entry = await kv.get(key)
            assert (entry.value, entry.revision) == (value, rev)

    async def test_create_many_skips_existing_keys_and_writes_the_others(self) -> None:
        kv = await self.open_kv()
        old = await kv.put("b", b"old")
        revs = await kv.create_many([("a", b"1"), ("b", b"2"), ("c", b"3")])
        assert revs[1] is None
        assert isinstance(revs[0], int) and isinstance(revs[2], int) and revs[0] < revs[2]
        assert (await kv.get("a")).value == b"1"
        assert (await kv.get("c")).value == b"3"
        entry = await kv.get("b")
        assert (entry.value, entry.revision) == (b"old", old)
        assert await kv.create_many([("a", b"x"), ("c", b"y")]) == [None, None]
        assert (await kv.status()).values == 3

    async def test_create_many_after_delete_and_after_purge(self) -> None:
        kv = await self.open_kv(history=5)
        await kv.put("deleted", b"1")
        await kv.put("purged", b"1")
        await kv.put("alive", b"1")
        await kv.delete("deleted")
        await kv.purge("purged")
        revs = await kv.create_many(
            [("deleted", b"2"), ("alive", b"2"), ("purged", b"2"), ("new", b"2")]
        )
        assert revs[1] is None
        for key, rev in (("deleted", revs[0]), ("purged", revs[2]), ("new", revs[3])):
            entry = await kv.get(key)
            assert (entry.value, entry.revision) == (b"2", rev)
        assert (await kv.get("alive")).value == b"1"
        assert await kv.create_many([("deleted", b"3"), ("purged", b"3")]) == [None, None]

    async def test_create_many_duplicate_keys_first_wins(self) -> None:
        kv = await self.open_kv(history=5)
        await kv.put("old", b"0")
        revs = await kv.create_many(
            [("k", b"1"), ("k", b"2"), ("j", b"3"), ("old", b"4"), ("k", b"5"), ("old", b"6")]
        )
        assert revs[1:] == [None, revs[2], None, None, None]
        assert isinstance(revs[0], int) and isinstance(revs[2], int)
        assert (await kv.get("k")).value == b"1"
        assert len(await kv.history("k")) == 1
        assert (await kv.get("old")).value == b"0"

    async def test_create_many_validates_everything_before_writing(self) -> None:
        kv = await self.open_kv(max_value_size=8)
        for bad in ("a..b", "a.*", "_kv.x", ""):
            with pytest.raises(InvalidKeyError) as info:
                await kv.create_many([("good", b"1"), (bad, b"2"), ("other", b"3")])
            assert info.value.key == bad
        with pytest.raises(ValueTooLargeError) as too_large:
            await kv.create_many([("good", b"1"), ("big", b"123456789")])
        assert (too_large.value.key, too_large.value.size, too_large.value.max_size) == (
            "big",
            9,
            8,
        )
        assert (await kv.status()).values == 0
        assert await kv.keys() == []

    async def test_create_many_of_nothing(self) -> None:
        kv = await self.open_kv()
        assert await kv.create_many([]) == []
        assert (await kv.status()).values == 0

    async def test_create_many_on_a_closed_handle(self) -> None:
        kv = await self.open_kv()
        other = await self.make_kv(kv.bucket)
        await other.close()
        for items in ([("k", b"v")], []):
            with pytest.raises(KVError, match="closed"):
                await other.create_many(items)
        assert await kv.keys() == []

    async def test_create_many_limit(self) -> None:
        kv = await self.open_kv()
        too_many = [(f"k.{i}", b"v") for i in range(CREATE_MANY_MAX + 1)]
        with pytest.raises(KVError, match=f"at most {CREATE_MANY_MAX} items"):
            await kv.create_many(too_many)
        assert (await kv.status()).values == 0
        revs = await kv.create_many(too_many[:CREATE_MANY_MAX])
        assert len(revs) == CREATE_MANY_MAX and None not in revs
        assert len(set(revs)) == CREATE_MANY_MAX
        assert len(await kv.keys("k.*")) == CREATE_MANY_MAX

    async def test_concurrent_create_many_gives_each_key_to_one_caller(self) -> None:
        kv1 = await self.open_kv(history=3)
        kv2 = await self.open_kv(kv1.bucket)
        keys = [f"r.{i}" for i in range(300)]
        # A third of the keys were deleted, a third purged: re-creating them races too.
        for key in keys[:200]:
            await kv1.put(key, b"before")
        for key in keys[:100]:
            await kv1.delete(key)
        for key in keys[100:200]:
            await kv1.purge(key)
        order2 = keys[::-1]
        got1, got2 = await asyncio.gather(
            kv1.create_many([(k, b"one") for k in keys]),
            kv2.create_many([(k, b"two") for k in order2]),
        )
        won1 = {k for k, rev in zip(keys, got1, strict=True) if rev is not None}
        won2 = {k for k, rev in zip(order2, got2, strict=True) if rev is not None}
        assert won1 | won2 == set(keys)
        assert won1 & won2 == set()
        stored = await kv1.get_last_many("r.*")
        assert {k for k, e in stored.items() if e.value == b"one"} == won1
        assert {k for k, e in stored.items() if e.value == b"two"} == won2

    async def test_update_with_current_revision(self) -> None:
        kv = await self.open_kv()
        r1 = await kv.put("k", b"1")
        r2 = await kv.update("k", b"2", r1)
        assert r2 > r1
        entry = await kv.get("k")
        assert (entry.value, entry.revision) == (b"2", r2)

    async def test_update_with_stale_revision(self) -> None:
        kv = await self.open_kv()
        r1 = await kv.put("k", b"1")
        r2 = await kv.update("k", b"2", r1)
        with pytest.raises(WrongRevisionError) as info:
            await kv.update("k", b"3", r1)
        assert (info.value.key, info.value.expected, info.value.current) == ("k", r1, r2)
        assert (await kv.get("k")).value == b"2"

    async def test_update_missing_key(self) -> None:
        kv = await self.open_kv()
        with pytest.raises(WrongRevisionError) as info:
            await kv.update("k", b"1", 5)
        assert info.value.current == 0
        # Revision 0 means "no message yet", as JetStream's expected last sequence.
        rev = await kv.update("k", b"1", 0)
        assert (await kv.get("k")).revision == rev
        with pytest.raises(WrongRevisionError):
            await kv.update("k", b"2", 0)

    async def test_update_after_delete_uses_marker_revision(self) -> None:
        kv = await self.open_kv(history=5)
        await kv.put("k", b"1")
        await kv.delete("k")
        marker = (await kv.history("k"))[-1]
        assert marker.operation is Operation.DEL
        rev = await kv.update("k", b"2", marker.revision)
        assert (await kv.get("k")).revision == rev

    async def test_concurrent_cas_increments(self) -> None:
        kv = await self.open_kv()
        await kv.put("counter", b"0")
        workers, rounds = 16, 10

        async def increment() -> None:
            for _ in range(rounds):
                while True:
                    entry = await kv.get("counter")
                    # Let the other tasks read the same revision, so updates collide.
                    await anyio.sleep(0)
                    try:
                        await kv.update("counter", b"%d" % (int(entry.value) + 1), entry.revision)
                        break
                    except WrongRevisionError:
                        continue

        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(increment)
        assert int((await kv.get("counter")).value) == workers * rounds

    # ------------------------------------------------------------------ delete / purge

    async def test_delete_hides_key_and_keeps_history(self) -> None:
        kv = await self.open_kv(history=5)
        r1 = await kv.put("k", b"1")
        await kv.delete("k")
        with pytest.raises(KeyNotFoundError) as info:
            await kv.get("k")
        assert info.value.operation is Operation.DEL
        history = await kv.history("k")
        assert [(e.operation, e.value) for e in history] == [
            (Operation.PUT, b"1"),
            (Operation.DEL, b""),
        ]
        assert history[0].revision == r1 and history[1].revision > r1
        assert (await kv.get("k", revision=r1)).value == b"1"
        assert await kv.keys() == []

    async def test_delete_with_last_revision(self) -> None:
        kv = await self.open_kv()
        r1 = await kv.put("k", b"1")
        r2 = await kv.put("k", b"2")
        with pytest.raises(WrongRevisionError) as info:
            await kv.delete("k", last=r1)
        assert (info.value.expected, info.value.current) == (r1, r2)
        assert (await kv.get("k")).value == b"2"
        await kv.delete("k", last=r2)
        with pytest.raises(KeyNotFoundError):
            await kv.get("k")

    async def test_delete_missing_key_writes_marker(self) -> None:
        kv = await self.open_kv()
        await kv.delete("ghost")
        assert [e.operation for e in await kv.history("ghost")] == [Operation.DEL]
        with pytest.raises(KeyNotFoundError):
            await kv.get("ghost")

    async def test_purge_drops_history(self) -> None:
        kv = await self.open_kv(history=10)
        for i in range(4):
            await kv.put("k", b"%d" % i)
        await kv.put("other", b"x")
        await kv.purge("k")
        history = await kv.history("k")
        assert [(e.operation, e.value, e.delta) for e in history] == [(Operation.PURGE, b"", 0)]
        with pytest.raises(KeyNotFoundError) as info:
            await kv.get("k")
        assert info.value.operation is Operation.PURGE
        assert await kv.keys() == ["other"]
        assert (await kv.status()).values == 2

    # ------------------------------------------------------------------ purge_all

    async def test_purge_all_removes_keys_and_history(self) -> None:
        kv = await self.open_kv(history=5)
        for key in ("exec.1.a", "exec.1.b.c", "exec.2.a"):
            await kv.put(key, b"1")
            await kv.put(key, b"2")
        await kv.delete("exec.1.a")
        assert await kv.purge_all("exec.1.>") == 5
        assert await kv.keys() == ["exec.2.a"]
        for key in ("exec.1.a", "exec.1.b.c"):
            with pytest.raises(KeyNotFoundError) as info:
                await kv.get(key)
            # No marker is left behind, unlike purge().
            assert info.value.operation is None
            with pytest.raises(KeyNotFoundError):
                await kv.history(key)
        assert [e.value for e in await kv.history("exec.2.a")] == [b"1", b"2"]
        assert list(await kv.get_last_many("exec.>")) == ["exec.2.a"]
        assert (await kv.status()).values == 2

    async def test_purge_all_with_several_filters(self) -> None:
        kv = await self.open_kv()
        for key in ("a.1", "a.2", "a.2.x", "b", "c"):
            await kv.put(key, b"v")
        assert await kv.purge_all(["a.*", "b", "a.1"]) == 3
        assert await kv.keys() == ["a.2.x", "c"]
        assert await kv.purge_all(("nothing.>",)) == 0
        assert await kv.purge_all(">") == 2
        assert await kv.keys() == []
        assert (await kv.status()).values == 0

    async def test_create_and_update_after_purge_all(self) -> None:
        kv = await self.open_kv(history=5)
        before = await kv.put("k", b"1")
        await kv.put("k", b"2")
        await kv.purge_all("k")
        rev = await kv.create("k", b"3")
        # Revisions keep counting up: only messages went, not the bucket's sequence.
        assert rev > before + 1
        assert [e.value for e in await kv.history("k")] == [b"3"]
        await kv.purge_all("k")
        rev = await kv.update("k", b"4", 0)
        assert (await kv.get("k")).revision == rev

    async def test_purge_all_is_invisible_to_watchers(self) -> None:
        kv = await self.open_kv()
        await kv.put("gone.1", b"v")
        async with kv.watch() as watcher:
            assert [e.key for e in await self.initial_data(watcher)] == ["gone.1"]
            assert await kv.purge_all("gone.>") == 1
            rev = await kv.put("kept", b"v")
            entry = await self.next_entry(watcher)
            assert (entry.key, entry.revision, entry.operation) == ("kept", rev, Operation.PUT)

    async def test_purge_all_rejects_bad_filters(self) -> None:
        kv = await self.open_kv()
        await kv.put("a", b"v")
        for bad in ("a..b", ["a", "b.>.c"], []):
            with pytest.raises(InvalidKeyError):
                await kv.purge_all(bad)
        assert await kv.keys() == ["a"]

    async def test_purge_all_on_destroyed_bucket(self) -> None:
        kv = await self.open_kv()
        other = await self.open_kv(kv.bucket)
        await kv.destroy()
        with pytest.raises(BucketNotFoundError):
            await other.purge_all(">")

    async def test_purge_all_many_keys(self) -> None:
        kv = await self.open_kv()
        count, writers = 10_000, 50

        async def write(start: int) -> None:
            for i in range(start, count, writers):
                await kv.put(f"big.{i}", b"x")

        async with anyio.create_task_group() as tg:
            for start in range(writers):
                tg.start_soon(write, start)
        await kv.put("small", b"y")
        # One purge for the whole filter: the count says every key went in one go.
        assert await kv.purge_all("big.>") == count
        assert await kv.keys("big.>") == []
        assert await kv.keys() == ["small"]
        assert (await kv.status()).values == 1

    # ------------------------------------------------------------------ history

    async def test_history_order_and_delta(self) -> None:
        kv = await self.open_kv(history=10)
        revs = [await kv.put("k", b"%d" % i) for i in range(3)]
        await kv.put("other", b"x")
        history = await kv.history("k")
        assert [e.revision for e in history] == revs
        assert [e.value for e in history] == [b"0", b"1", b"2"]
        assert [e.delta for e in history] == [2, 1, 0]
        assert all(e.key == "k" and e.bucket == kv.bucket for e in history)

    async def test_history_missing_key(self) -> None:
        kv = await self.open_kv()
        with pytest.raises(KeyNotFoundError):
            await kv.history("nope")

    async def test_history_limit(self) -> None:
        kv = await self.open_kv(history=3)
        revs = [await kv.put("k", b"%d" % i) for i in range(5)]
        assert [e.revision for e in await kv.history("k")] == revs[-3:]
        await kv.delete("k")
        history = await kv.history("k")
        assert [e.operation for e in history] == [Operation.PUT, Operation.PUT, Operation.DEL]
        assert (await kv.status()).values == 3

    async def test_default_history_is_one(self) -> None:
        kv = await self.open_kv()
        await kv.put("k", b"1")
        await kv.put("k", b"2")
        assert [e.value for e in await kv.history("k")] == [b"2"]
        assert (await kv.status()).history == 1

    async def test_max_history_is_64(self) -> None:
        kv = await self.open_kv(history=64)
        for i in range(70):
            await kv.put("k", b"%d" % i)
        history = await kv.history("k")
        assert len(history) == 64 and history[0].value == b"6"

    @pytest.mark.parametrize("history", [0, -1, 65, 1000])
    async def test_history_out_of_range(self, history: int) -> None:
        with pytest.raises(KVError):
            await self.open_kv(history=history)

    # ------------------------------------------------------------------ keys

    async def test_keys_with_wildcards(self) -> None:
        kv = await self.open_kv()
        for key in ("a", "a.b.c", "a.b.d", "a.x", "b.y", "b.y.z"):
            await kv.put(key, b"v")
        assert await kv.keys() == ["a", "a.b.c", "a.b.d", "a.x", "b.y", "b.y.z"]
        assert await kv.keys(">") == await kv.keys()
        assert await kv.keys("") == await kv.keys()
        assert await kv.keys("a.>") == ["a.b.c", "a.b.d", "a.x"]
        assert await kv.keys("a.*") == ["a.x"]
        assert await kv.keys("a.*.c") == ["a.b.c"]
        assert await kv.keys("*.y") == ["b.y"]
        assert await kv.keys("*") == ["a"]
        assert await kv.keys("*.*.*") == ["a.b.c", "a.b.d", "b.y.z"]
        assert await kv.keys("a") == ["a"]
        assert await kv.keys("zzz.>") == []
        assert await kv.keys(["a.x", "b.>"]) == ["a.x", "b.y", "b.y.z"]
        assert await kv.keys(("a.b.*", "a.b.c")) == ["a.b.c", "a.b.d"]

    async def test_keys_excludes_deleted_and_purged(self) -> None:
        kv = await self.open_kv(history=5)
        for key in ("k1", "k2", "k3"):
            await kv.put(key, b"v")
        await kv.delete("k1")
        await kv.purge("k2")
        assert await kv.keys() == ["k3"]
        await kv.put("k1", b"again")
        assert await kv.keys() == ["k1", "k3"]

    async def test_keys_of_empty_bucket(self) -> None:
        kv = await self.open_kv()
        assert await kv.keys() == []

    # ------------------------------------------------------------------ validation

    @pytest.mark.parametrize("key", BAD_KEYS)
    async def test_invalid_keys_rejected(self, key: str) -> None:
        kv = await self.open_kv()
        calls = [
            lambda: kv.put(key, b"v"),
            lambda: kv.get(key),
            lambda: kv.create(key, b"v"),
            lambda: kv.update(key, b"v", 1),
            lambda: kv.delete(key),
            lambda: kv.purge(key),
            lambda: kv.history(key),
        ]
        for call in calls:
            with pytest.raises(InvalidKeyError) as info:
                await call()
            assert info.value.key == key
        assert (await kv.status()).values == 0

    async def test_valid_keys_accepted(self) -> None:
        kv = await self.open_kv()
        for key in GOOD_KEYS:
            await kv.put(key, key.encode())
            assert (await kv.get(key)).value == key.encode()
        assert await kv.keys() == sorted(GOOD_KEYS)

    @pytest.mark.parametrize("pattern", BAD_FILTERS)
    async def test_invalid_filters_rejected(self, pattern: str) -> None:
        kv = await self.open_kv()
        with pytest.raises(InvalidKeyError):
            await kv.keys(pattern)
        with pytest.raises(InvalidKeyError):
            await kv.keys(["a", pattern])
        with pytest.raises(InvalidKeyError):
            await kv.get_last_many([pattern])
        with pytest.raises(InvalidKeyError):
            kv.watch(pattern)

    async def test_empty_filter_list_rejected(self) -> None:
        kv = await self.open_kv()
        with pytest.raises(InvalidKeyError):
            await kv.keys([])
        with pytest.raises(InvalidKeyError):
            await kv.get_last_many([])

    @pytest.mark.parametrize("name", ["", "a.b", "a b", "a/b", "a*", ">", "ведро"])
    async def test_invalid_bucket_names(self, name: str) -> None:
        with pytest.raises(InvalidKeyError) as info:
            await self.make_kv(name)
        assert info.value.kind == "bucket"
        assert info.value.bucket == name

    async def test_valid_bucket_name_characters(self) -> None:
        name = f"Conf-OK_{uuid.uuid4().hex[:8]}"
        kv = await self.open_kv(name)
        await kv.put("k", b"v")
        assert (await kv.status()).bucket == name

    @pytest.mark.parametrize(
        "config", [{"ttl": -1.0}, {"ttl": 0}, {"max_value_size": 0}, {"storage": "tape"}]
    )
    async def test_invalid_bucket_config(self, config: dict[str, Any]) -> None:
        with pytest.raises(KVError):
            await self.open_kv(**config)

    async def test_value_too_large(self) -> None:
        kv = await self.open_kv(max_value_size=8)
        await kv.put("k", b"12345678")
        for call in (
            lambda: kv.put("k", b"123456789"),
            lambda: kv.create("n", b"123456789"),
            lambda: kv.update("k", b"123456789", 1),
        ):
            with pytest.raises(ValueTooLargeError) as info:
                await call()
            assert (info.value.size, info.value.max_size) == (9, 8)
        assert (await kv.get("k")).value == b"12345678"
        assert (await kv.status()).values == 1

    # ------------------------------------------------------------------ TTL

    async def test_ttl_expires_entries(self) -> None:
        kv = await self.open_kv(ttl=self.ttl, history=5)
        await kv.put("k", b"1")
        await kv.put("k", b"2")
        await kv.put("gone", b"x")
        await kv.delete("gone")
        assert (await kv.get("k")).value == b"2"
        await anyio.sleep(self.ttl + self.ttl_slack)
        with pytest.raises(KeyNotFoundError):
            await kv.get("k")
        with pytest.raises(KeyNotFoundError):
            await kv.history("k")
        assert await kv.keys() == []
        assert await kv.get_last_many(">") == {}
        async with kv.watch(include_history=True) as watcher:
            assert await self.initial_data(watcher) == []
        assert (await kv.status()).values == 0
        # An expired key counts as missing for create.
        await kv.create("k", b"3")
        assert (await kv.get("k")).value == b"3"

    async def test_ttl_keeps_fresh_entries(self) -> None:
        kv = await self.open_kv(ttl=self.ttl)
        await kv.put("old", b"1")
        await anyio.sleep(self.ttl * 0.7)
        await kv.put("new", b"2")
        # "old" is 1.2 ttl old, "new" 0.5 ttl: a late wake-up has room either way.
        await anyio.sleep(self.ttl * 0.5)
        assert await kv.keys() == ["new"]
        assert (await kv.status()).ttl == pytest.approx(self.ttl)

    # ------------------------------------------------------------------ watch

    async def test_watch_empty_bucket_sends_marker(self) -> None:
        kv = await self.open_kv()
        async with kv.watch() as watcher:
            assert await self.next_item(watcher) is None
            rev = await kv.put("k", b"v")
            entry = await self.next_entry(watcher)
            assert (entry.key, entry.value, entry.revision) == ("k", b"v", rev)
            assert entry.operation is Operation.PUT and entry.delta == 0

    async def test_watch_initial_data_is_last_per_key(self) -> None:
        kv = await self.open_kv(history=5)
        await kv.put("a", b"1")
        await kv.put("b", b"1")
        await kv.put("a", b"2")
        await kv.delete("b")
        async with kv.watch() as watcher:
            initial = await self.initial_data(watcher)
            assert [(e.key, e.value, e.operation) for e in initial] == [
                ("a", b"2", Operation.PUT),
                ("b", b"", Operation.DEL),
            ]
            assert [e.delta for e in initial] == [1, 0]
            await kv.put("c", b"live")
            await kv.delete("a")
            await kv.purge("c")
            live = [await self.next_entry(watcher) for _ in range(3)]
            assert [(e.key, e.operation) for e in live] == [
                ("c", Operation.PUT),
                ("a", Operation.DEL),
                ("c", Operation.PURGE),
            ]
            assert [e.revision for e in live] == sorted(e.revision for e in live)

    async def test_watch_include_history(self) -> None:
        kv = await self.open_kv(history=5)
        await kv.put("a", b"1")
        await kv.put("b", b"x")
        await kv.put("a", b"2")
        await kv.delete("a")
        async with kv.watch("a", include_history=True) as watcher:
            initial = await self.initial_data(watcher)
            assert [(e.value, e.operation) for e in initial] == [
                (b"1", Operation.PUT),
                (b"2", Operation.PUT),
                (b"", Operation.DEL),
            ]
            assert [e.delta for e in initial] == [2, 1, 0]

    async def test_watch_ignore_deletes(self) -> None:
        kv = await self.open_kv()
        await kv.put("a", b"1")
        await kv.put("b", b"1")
        await kv.delete("b")
        async with kv.watch(ignore_deletes=True) as watcher:
            assert [e.key for e in await self.initial_data(watcher)] == ["a"]
            await kv.delete("a")
            await kv.purge("b")
            await kv.put("c", b"1")
            entry = await self.next_entry(watcher)
            assert (entry.key, entry.operation) == ("c", Operation.PUT)

    async def test_watch_meta_only(self) -> None:
        kv = await self.open_kv()
        rev = await kv.put("a", b"payload")
        async with kv.watch(meta_only=True) as watcher:
            (entry,) = await self.initial_data(watcher)
            assert (entry.key, entry.revision, entry.value) == ("a", rev, b"")
            rev = await kv.put("a", b"more")
            entry = await self.next_entry(watcher)
            assert (entry.key, entry.revision, entry.value) == ("a", rev, b"")

    async def test_watch_updates_only(self) -> None:
        kv = await self.open_kv()
        await kv.put("a", b"old")
        async with kv.watch(updates_only=True) as watcher:
            assert await self.next_item(watcher) is None
            await kv.put("a", b"new")
            entry = await self.next_entry(watcher)
            assert entry.value == b"new"

    async def test_watch_filters(self) -> None:
        kv = await self.open_kv()
        for key in ("job.1.state", "job.2.state", "job.1.log", "other"):
            await kv.put(key, b"v")
        async with kv.watch("job.*.state") as watcher:
            assert [e.key for e in await self.initial_data(watcher)] == [
                "job.1.state",
                "job.2.state",
            ]
            await kv.put("job.3.log", b"v")
            await kv.put("other", b"v")
            await kv.put("job.3.state", b"v")
            assert (await self.next_entry(watcher)).key == "job.3.state"
        async with kv.watch(["other", "job.1.>"]) as watcher:
            assert [e.key for e in await self.initial_data(watcher)] == [
                "job.1.state",
                "job.1.log",
                "other",
            ]
            await kv.put("job.2.log", b"v")
            await kv.put("job.1.x.y", b"v")
            assert (await self.next_entry(watcher)).key == "job.1.x.y"

    async def test_watch_with_async_for_and_stop(self) -> None:
        kv = await self.open_kv()
        await kv.put("a", b"1")
        watcher = kv.watch()
        seen: list[Entry | None] = []
        with anyio.fail_after(self.watch_timeout):
            async for item in watcher:
                seen.append(item)
                if item is None:
                    await kv.put("b", b"2")
                elif item.key == "b":
                    break
        assert [None if e is None else e.key for e in seen] == ["a", None, "b"]
        await watcher.stop()
        with pytest.raises(StopAsyncIteration):
            await anext(watcher)

    async def test_watch_marker_only_once(self) -> None:
        kv = await self.open_kv()
        await kv.put("a", b"1")
        async with kv.watch() as watcher:
            assert len(await self.initial_data(watcher)) == 1
            for i in range(5):
                await kv.put("a", b"%d" % i)
            # With history 1 a revision replaced before the consumer reached it is gone
            # from the stream, so updates may be skipped; the newest one always arrives.
            for _ in range(5):
                item = await self.next_item(watcher)
                assert item is not None, "end-of-initial-data marker delivered twice"
                if item.value == b"4":
                    break
            else:
                raise AssertionError("the newest revision never arrived")

    async def test_two_watchers_see_same_updates(self) -> None:
        kv = await self.open_kv()
        async with kv.watch() as w1, kv.watch("k") as w2:
            assert await self.initial_data(w1) == []
            assert await self.initial_data(w2) == []
            rev = await kv.put("k", b"v")
            assert (await self.next_entry(w1)).revision == rev
            assert (await self.next_entry(w2)).revision == rev

    # ------------------------------------------------------------------ multi-last (ADR-31)

    async def test_get_last_many(self) -> None:
        kv = await self.open_kv(history=5)
        await kv.put("1234.name", b"Bob")
        await kv.put("1234.surname", b"Smith")
        await kv.put("1234.address", b"1 Main Street")
        await kv.put("1234.address", b"10 Oak Lane")
        await kv.put("5678.name", b"Ann")
        got = await kv.get_last_many("1234.>")
        assert list(got) == ["1234.address", "1234.name", "1234.surname"]
        assert got["1234.address"].value == b"10 Oak Lane"
        assert all(isinstance(e, Entry) and e.operation is Operation.PUT for e in got.values())
        got = await kv.get_last_many(["1234.name", "5678.name", "9999.name"])
        assert {k: e.value for k, e in got.items()} == {"1234.name": b"Bob", "5678.name": b"Ann"}

    async def test_get_last_many_point_in_time(self) -> None:
        if not self.supports_point_in_time:
            pytest.skip("adapter cannot read at a past revision")
        kv = await self.open_kv(history=5)
        r1 = await kv.put("1234.name", b"Bob")
        await kv.put("1234.surname", b"Smith")
        r3 = await kv.put("1234.address", b"1 Main Street")
        await kv.put("1234.address", b"10 Oak Lane")
        got = await kv.get_last_many(["1234.>"], up_to_revision=r3)
        assert got["1234.address"].value == b"1 Main Street"
        assert got["1234.address"].revision == r3
        assert set(got) == {"1234.name", "1234.surname", "1234.address"}
        got = await kv.get_last_many("1234.>", up_to_revision=r1)
        assert {k: e.value for k, e in got.items()} == {"1234.name": b"Bob"}
        assert await kv.get_last_many("1234.>", up_to_revision=0) == {}

    async def test_get_last_many_excludes_deleted(self) -> None:
        kv = await self.open_kv(history=5)
        await kv.put("r.1", b"a")
        r2 = await kv.put("r.2", b"b")
        await kv.delete("r.2")
        await kv.put("r.3", b"c")
        await kv.purge("r.3")
        assert list(await kv.get_last_many("r.*")) == ["r.1"]
        if self.supports_point_in_time:
            got = await kv.get_last_many("r.*", up_to_revision=r2)
            assert {k: e.value for k, e in got.items()} == {"r.1": b"a", "r.2": b"b"}

    # ------------------------------------------------------------------ status / destroy

    async def test_status(self) -> None:
        kv = await self.open_kv(history=5, ttl=60.0, max_value_size=1024, storage="memory")
        status = await kv.status()
        assert (status.bucket, status.values, status.history) == (kv.bucket, 0, 5)
        assert status.ttl == pytest.approx(60.0)
        assert status.max_value_size == 1024
        assert status.storage == "memory"
        assert status.replicas == self.replicas
        assert status.compression is False
        await kv.put("a", b"1")
        await kv.put("a", b"2")
        await kv.put("b", b"3")
        await kv.delete("b")
        status = await kv.status()
        assert status.values == 4
        assert status.bytes > 0
        await kv.purge("a")
        assert (await kv.status()).values == 3

    async def test_status_defaults(self) -> None:
        kv = await self.open_kv()
        status = await kv.status()
        assert (status.history, status.ttl, status.max_value_size) == (1, None, None)
        assert (status.storage, status.replicas, status.compression) == (
            "file",
            self.replicas,
            False,
        )

    async def test_handles_share_a_bucket(self) -> None:
        kv1 = await self.open_kv()
        kv2 = await self.open_kv(kv1.bucket)
        rev = await kv1.put("k", b"v")
        assert (await kv2.get("k")).revision == rev
        with pytest.raises(KeyExistsError):
            await kv2.create("k", b"w")

    async def test_bind_only_open(self) -> None:
        name = self.bucket_name()
        with pytest.raises(BucketNotFoundError):
            await self.make_kv(name, create=False)
        kv = await self.open_kv()  # creates it
        await kv.put("a", b"1")
        bound = await self.make_kv(kv.bucket, create=False)
        self._handles.append(bound)
        assert (await bound.get("a")).value == b"1"

    async def test_destroy(self) -> None:
        kv = await self.open_kv()
        other = await self.open_kv(kv.bucket)
        await kv.put("k", b"v")
        await kv.destroy()
        for call in (
            lambda: kv.get("k"),
            lambda: kv.put("k", b"v"),
            lambda: kv.keys(),
            lambda: kv.status(),
            lambda: other.get("k"),
            lambda: other.destroy(),
        ):
            with pytest.raises(BucketNotFoundError) as info:
                await call()
            assert info.value.bucket == kv.bucket
        fresh = await self.open_kv(kv.bucket)
        assert await fresh.keys() == []
        assert await fresh.put("k", b"again") == 1

    # ------------------------------------------ ADR-8 settings: size limit, per-value TTL

    async def read_own(self, kv: KeyValue, key: str) -> Any:
        """`kv.get(key)` of a key this test just wrote. On a replicated bucket a Direct Get
        may be answered by a replica that has not applied the write yet (JetStream lets
        every replica answer): read again for up to 2 s."""
        deadline = time.monotonic() + (2.0 if self.replicas > 1 else 0.0)
        while True:
            try:
                return await kv.get(key)
            except KeyNotFoundError:
                if time.monotonic() >= deadline:
                    raise
            await anyio.sleep(0.05)

    async def until_missing(self, kv: KeyValue, key: str, within: float) -> float:
        """Poll `kv.history(key)` until the key has no stored message; seconds waited."""
        start = time.monotonic()
        while True:
            try:
                await kv.history(key)
            except KeyNotFoundError:
                return time.monotonic() - start
            assert time.monotonic() - start < within, f"{key!r} still stored after {within} s"
            await anyio.sleep(0.05)

    async def test_max_bytes_refuses_writes_into_a_full_bucket(self) -> None:
        kv = await self.open_kv(max_bytes=400, history=2)
        assert (await kv.status()).max_bytes == 400
        value = b"v" * 50
        stored: list[str] = []
        with pytest.raises(BucketFullError) as info:
            for i in range(20):
                await kv.put(f"k{i}", value)
                stored.append(f"k{i}")
        assert stored, "not even one value fitted"
        full = info.value
        assert (full.bucket, full.max_bytes) == (kv.bucket, 400)
        assert kv.bucket in str(full) and "400" in str(full)
        # Nothing of the refused write is stored, and every kind of write is refused.
        assert await kv.keys() == sorted(stored)
        first = (await kv.get(stored[0])).revision
        for call in (
            lambda: kv.create("new", value),
            lambda: kv.update(stored[0], value, first),
            lambda: kv.put(stored[0], value),
        ):
            with pytest.raises(BucketFullError):
                await call()
        assert (await kv.get(stored[0])).revision == first
        # Room made, writes go through again.
        await kv.purge_all(">")
        await kv.put("again", value)
        assert await kv.keys() == ["again"]

    async def test_invalid_extended_config(self) -> None:
        for config in (
            {"max_bytes": 0},
            {"limit_marker_ttl": 0.5},
            {"sources": "one_bucket"},
        ):
            with pytest.raises(KVError):
                await self.open_kv(**config)

    async def test_per_value_ttl_expires_only_that_value(self) -> None:
        kv = await self.open_kv(limit_marker_ttl=1, history=3)
        assert (await kv.status()).limit_marker_ttl == 1
        async with kv.watch("short", updates_only=True) as watcher:
            assert await self.next_item(watcher) is None
            await kv.create("short", b"s", ttl=1)
            await kv.create("long", b"l")
            assert (await kv.get("short")).value == b"s"
            await self.until_missing_value(kv, "short", within=1 + self.value_ttl_slack)
            assert (await self.next_entry(watcher)).operation is Operation.PUT
            # ADR-48: the expiry leaves a limit marker, delivered to watchers as a PURGE,
            # which itself expires after limit_marker_ttl.
            marker = await self.next_entry(watcher)
            assert (marker.key, marker.operation) == ("short", Operation.PURGE)
        await self.until_missing(kv, "short", within=1 + self.value_ttl_slack)
        assert (await kv.get("long")).value == b"l"
        assert await kv.keys() == ["long"]
        # The key expired: create takes it again.
        await kv.create("short", b"again")
        assert (await self.read_own(kv, "short")).value == b"again"

    async def until_missing_value(self, kv: KeyValue, key: str, within: float) -> None:
        start = time.monotonic()
        while True:
            try:
                await kv.get(key)
            except KeyNotFoundError:
                return
            assert time.monotonic() - start < within, f"{key!r} still alive after {within} s"
            await anyio.sleep(0.05)

    async def test_purge_marker_with_ttl_leaves_no_trace(self) -> None:
        kv = await self.open_kv(limit_marker_ttl=1)
        await kv.put("k", b"v")
        await kv.purge("k", ttl=1)
        assert [e.operation for e in await kv.history("k")] == [Operation.PURGE]
        await self.until_missing(kv, "k", within=1 + self.value_ttl_slack)

    async def test_per_value_ttl_refused_without_limit_markers(self) -> None:
        kv = await self.open_kv()
        assert (await kv.status()).limit_marker_ttl is None
        for call in (lambda: kv.create("k", b"v", ttl=5), lambda: kv.purge("k", ttl=5)):
            with pytest.raises(KVError) as info:
                await call()
            assert "limit_marker_ttl" in str(info.value) and kv.bucket in str(info.value)
        with pytest.raises(KeyNotFoundError):
            await kv.history("k")  # nothing written
        marked = await self.open_kv(limit_marker_ttl=1)
        with pytest.raises(KVError, match="at least 1 s"):
            await marked.create("k", b"v", ttl=0.5)

    async def test_apply_changes_only_the_settings_passed(self) -> None:
        kv = await self.open_kv(history=2, ttl=60.0)
        await kv.put("k", b"1")
        # Binding with other settings but without apply changes nothing.
        await self.open_kv(kv.bucket, history=5, max_bytes=10_000)
        status = await kv.status()
        assert (status.history, status.ttl, status.max_bytes) == (2, 60.0, None)
        # apply=True changes what was passed, and only that.
        await self.open_kv(kv.bucket, history=5, max_bytes=10_000, apply=True)
        status = await kv.status()
        assert (status.history, status.ttl, status.max_bytes) == (5, 60.0, 10_000)
        await self.open_kv(kv.bucket, ttl=None, max_value_size=100, apply=True)
        status = await kv.status()
        assert (status.history, status.ttl, status.max_value_size) == (5, None, 100)
        assert (await kv.get("k")).value == b"1"

    async def test_apply_turns_on_per_value_ttl(self) -> None:
        kv = await self.open_kv()
        await self.open_kv(kv.bucket, limit_marker_ttl=2, apply=True)
        fresh = await self.open_kv(kv.bucket)
        assert (await fresh.status()).limit_marker_ttl == 2
        await fresh.create("k", b"v", ttl=60)
        # ... and refuses to turn it off (ADR-48).
        with pytest.raises(KVError, match="cannot be turned off"):
            await self.open_kv(kv.bucket, limit_marker_ttl=None, apply=True)

    async def test_apply_refuses_a_storage_change(self) -> None:
        kv = await self.open_kv(storage="file")
        with pytest.raises(KVError) as info:
            await self.open_kv(kv.bucket, storage="memory", apply=True)
        message = str(info.value)
        assert kv.bucket in message and "storage" in message and "new bucket" in message
        assert (await kv.status()).storage == "file"
