"""KVLock and Election on both adapters (memory:// and a real nats-server): mutual
exclusion, fencing tokens, renewal, take-over of a stalled or killed holder, and the
pure logic of the contender's wait with a fake clock."""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from flowtide.kv import (
    Election,
    InvalidKeyError,
    KeyValue,
    KVError,
    KVLock,
    Lease,
    LeaseLostError,
    LockTimeoutError,
    connect,
)
from flowtide.kv.lock import MAX_HOLDER_LENGTH, _declared_ttl, _Observation

from .natsserver import NatsCluster, NatsServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer.start(tmp_path_factory.mktemp("nats-lock"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["memory", pytest.param("nats", marks=pytest.mark.nats)])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    return cast(NatsServer, request.getfixturevalue("nats_server")).url


class Buckets:
    """Opens handles on one fresh bucket; destroys it afterwards."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = f"lock_{uuid.uuid4().hex[:12]}"
        self.handles: list[KeyValue] = []

    async def open(self) -> KeyValue:
        kv = await connect(self.url, self.name, history=1)
        self.handles.append(kv)
        return kv


@pytest.fixture
async def buckets(url: str) -> AsyncIterator[Buckets]:
    b = Buckets(url)
    yield b
    if b.handles:
        try:
            await b.handles[0].destroy()
        except KVError:
            pass
    for kv in b.handles:
        await kv.close()


class Partitionable:
    """A handle whose writes can be cut off, as a network partition or a paused
    process would: while cut, `update` hangs and `delete` fails."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self.cut = False
        self._healed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def update(self, key: str, value: bytes, last: int) -> int:
        if self.cut:
            await self._healed.wait()
        return await self._kv.update(key, value, last)

    async def delete(self, key: str, last: int | None = None) -> None:
        if self.cut:
            raise KVError("partitioned (test)")
        await self._kv.delete(key, last)

    def heal(self) -> None:
        self.cut = False
        self._healed.set()


async def cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# The stalled holders (ttl 0.6 s) trust their lease for half its ttl: the margin (0.3 s)
# covers a loaded machine's delay between the deadline and the body's cancellation.
SAFETY = 0.5


# --------------------------------------------------------------------- pure logic


def test_contender_waits_ttl_from_first_sight_of_a_revision() -> None:
    seen = _Observation()
    seen.observe(7, ttl=10.0, now=100.0)
    seen.observe(7, ttl=10.0, now=105.0)  # the same revision: the wait is not restarted
    assert seen.expires == 110.0
    seen.observe(9, ttl=4.0, now=106.0)  # renewed: the wait restarts, with its ttl
    assert (seen.revision, seen.expires) == (9, 110.0)


def test_declared_ttl_is_clamped_and_defaults_for_foreign_values() -> None:
    assert _declared_ttl({"ttl": 3}, default=9.0) == 3.0
    assert _declared_ttl({"ttl": 1e9}, default=9.0) == 86400.0
    assert _declared_ttl({"ttl": 0.0}, default=9.0) == 0.1
    assert _declared_ttl({"ttl": "x"}, default=9.0) == 9.0
    assert _declared_ttl(None, default=9.0) == 9.0


async def test_invalid_arguments_are_refused_with_clear_errors() -> None:
    kv = await connect("memory://", f"lock_{uuid.uuid4().hex[:8]}")
    with pytest.raises(InvalidKeyError):
        KVLock(kv, "a.*", ttl=1)
    for ttl in (0, -1, 0.01, float("nan"), float("inf"), 90000, True):
        with pytest.raises(KVError, match="lock ttl must be"):
            KVLock(kv, "k", ttl=ttl)
    with pytest.raises(KVError, match="holder must be a string of 1..256"):
        KVLock(kv, "k", ttl=1, holder="x" * (MAX_HOLDER_LENGTH + 1))
    with pytest.raises(KVError, match="holder must be a string"):
        KVLock(kv, "k", ttl=1, holder="")
    with pytest.raises(KVError, match="printable"):
        KVLock(kv, "k", ttl=1, holder="a\nb")
    with pytest.raises(KVError, match="safety"):
        KVLock(kv, "k", ttl=1, safety=1.0)
    assert ":" in KVLock(kv, "k", ttl=1).holder  # host:pid by default
    await kv.destroy()


# ------------------------------------------------------------ on both adapters


async def test_acquire_and_release(buckets: Buckets) -> None:
    kv = await buckets.open()
    lock = KVLock(kv, "jobs.gc", ttl=2, holder="one")
    lease = await lock.acquire(timeout=5)
    assert lease.held and await lease.check()
    started = time.monotonic()
    with pytest.raises(LockTimeoutError, match="within 0 s"):
        await KVLock(kv, "jobs.gc", ttl=2, holder="two").acquire(timeout=0)
    assert time.monotonic() - started < 1.0
    info = await lock.current()
    assert info is not None and (info.holder, info.token, info.ttl) == ("one", lease.token, 2.0)
    assert await lease.release() is True
    assert lease.lost.is_set() and not lease.held and lease.lost_reason == "released"
    assert await lock.current() is None
    assert await lease.release() is False


async def test_second_acquirer_waits_for_release_and_gets_a_larger_token(
    buckets: Buckets,
) -> None:
    first = KVLock(await buckets.open(), "k", ttl=3, holder="first")
    second = KVLock(await buckets.open(), "k", ttl=3, holder="second")
    lease = await first.acquire()
    waiting = asyncio.create_task(second.acquire(timeout=10))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    released_at = time.monotonic()
    await lease.release()
    successor = await asyncio.wait_for(waiting, 5)
    # Woken by the watch, not by the 3 s take-over.
    assert successor.acquired_at - released_at < 1.0
    assert successor.token > lease.token
    assert (await second.current()).holder == "second"  # type: ignore[union-attr]
    await successor.release()


async def test_renewals_keep_the_lease_past_several_ttls(buckets: Buckets) -> None:
    holder = KVLock(await buckets.open(), "k", ttl=0.6, holder="holder")
    contender = KVLock(await buckets.open(), "k", ttl=0.6, holder="contender")
    async with holder.hold(timeout=5) as lease:
        with pytest.raises(LockTimeoutError, match="held by 'holder'") as caught:
            await contender.acquire(timeout=2.0)  # > 3 ttls
        assert isinstance(caught.value, TimeoutError)
        assert lease.held and await lease.check()
        assert lease.renewals >= 4
        assert lease.revision > lease.token  # renewals move the revision, not the token
        info = await holder.current()
        assert info is not None and (info.token, info.revision) == (lease.token, lease.revision)
    assert await holder.current() is None


async def test_stalled_holder_loses_before_it_is_taken_over(buckets: Buckets) -> None:
    link = Partitionable(await buckets.open())
    holder = KVLock(cast(KeyValue, link), "k", holder="stalled", ttl=0.6, safety=SAFETY)
    contender = KVLock(await buckets.open(), "k", ttl=0.6, holder="contender")
    entered = asyncio.Event()
    body_ended: list[float] = []
    holding: list[Lease] = []

    async def hold() -> None:
        async with holder.hold(timeout=5) as lease:
            holding.append(lease)
            entered.set()
            try:
                await asyncio.sleep(60)
            finally:
                body_ended.append(time.monotonic())

    task = asyncio.create_task(hold())
    try:
        await asyncio.wait_for(entered.wait(), 5)
        old = holding[0]
        link.cut = True  # renewals hang from now on
        started = time.monotonic()
        successor = await contender.acquire(timeout=5)
        with pytest.raises(LeaseLostError, match="no renewal succeeded"):
            await asyncio.wait_for(task, 5)
    finally:
        await cancel(task)
    assert old.lost_at is not None and old.lost_at < successor.acquired_at
    assert body_ended[0] < successor.acquired_at
    assert successor.acquired_at - started >= 0.6  # waited a full ttl unchanged
    assert successor.token > old.revision >= old.token
    # The stale holder comes back and releases late: the successor's lock stays.
    link.heal()
    assert await old.release() is False
    assert await successor.check()
    info = await contender.current()
    assert info is not None and (info.holder, info.token) == ("contender", successor.token)
    await successor.release()


async def test_stale_release_never_deletes_the_successors_lock(buckets: Buckets) -> None:
    link = Partitionable(await buckets.open())
    old = await KVLock(cast(KeyValue, link), "k", holder="old", ttl=0.6, safety=SAFETY).acquire()
    link.cut = True
    successor = await KVLock(await buckets.open(), "k", ttl=5, holder="new").acquire(timeout=5)
    assert old.lost.is_set()
    link.heal()
    # The stale holder's own CAS delete, as its release would send it.
    assert await old.release() is False
    assert await successor.check() and successor.held
    await successor.release()


async def test_a_purged_key_loses_the_lease_and_is_created_again(buckets: Buckets) -> None:
    kv = await buckets.open()
    lease = await KVLock(kv, "k", ttl=0.6, holder="a").acquire()
    await kv.purge("k")
    await asyncio.wait_for(lease.lost.wait(), 2)
    assert lease.lost_reason is not None and "deleted" in lease.lost_reason
    again = await KVLock(kv, "k", ttl=0.6, holder="b").acquire(timeout=0.3)
    assert again.token > lease.revision
    await again.release()


async def contend(handles: list[KeyValue], rounds: int) -> None:
    """One task per handle, each acquiring, holding a few ms and releasing `rounds`
    times; asserts no two holding intervals overlap and tokens grow in their order."""
    intervals: list[tuple[float, float, int]] = []
    rng = random.Random(7)

    async def worker(i: int) -> None:
        lock = KVLock(handles[i], "contended", ttl=2, holder=f"worker-{i}")
        for _ in range(rounds):
            lease = await lock.acquire(timeout=30)
            start = time.monotonic()
            await asyncio.sleep(rng.uniform(0, 0.03))
            assert lease.held
            end = time.monotonic()
            intervals.append((start, end, lease.token))
            await lease.release()

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(len(handles)))), 60)
    intervals.sort()
    assert len(intervals) == len(handles) * rounds
    for (_, end, token), (start, _, next_token) in zip(intervals, intervals[1:], strict=False):
        assert end < start, "two holders overlapped"
        assert token < next_token


async def test_contending_holders_never_overlap_and_tokens_grow(buckets: Buckets) -> None:
    await contend([await buckets.open() for _ in range(6)], rounds=3)


async def test_election_hands_leadership_over(buckets: Buckets) -> None:
    led: list[tuple[str, int]] = []
    leading = asyncio.Event()

    async def lead(lease: Lease) -> None:
        led.append((lease.holder, lease.token))
        leading.set()
        await asyncio.sleep(60)

    first = Election(await buckets.open(), "leader", ttl=0.6, holder="e1")
    second = Election(await buckets.open(), "leader", ttl=0.6, holder="e2")
    run1 = asyncio.create_task(first.run(lead))
    run2: asyncio.Task[Any] | None = None
    try:
        await asyncio.wait_for(leading.wait(), 5)
        run2 = asyncio.create_task(second.run(lead))
        await asyncio.sleep(0.3)
        assert first.leading and not second.leading
        assert (await second.leader()).holder == "e1"  # type: ignore[union-attr]
        leading.clear()
        await cancel(run1)  # the leader stops: its term is released on the way out
        await asyncio.wait_for(leading.wait(), 5)
        assert second.leading and not first.leading and first.lease is None
        assert [h for h, _ in led] == ["e1", "e2"] and led[0][1] < led[1][1]
    finally:
        await cancel(run1, *([run2] if run2 else []))


async def test_a_stalled_leader_is_stopped_before_the_next_one_leads(buckets: Buckets) -> None:
    events: list[tuple[str, str, float]] = []
    started = {"e1": asyncio.Event(), "e2": asyncio.Event()}

    async def lead(lease: Lease) -> None:
        events.append((lease.holder, "leads", time.monotonic()))
        started[lease.holder].set()
        try:
            await asyncio.sleep(60)
        finally:
            events.append((lease.holder, "stops", time.monotonic()))

    link = Partitionable(await buckets.open())
    first = Election(cast(KeyValue, link), "leader", holder="e1", ttl=0.6, safety=SAFETY)
    second = Election(await buckets.open(), "leader", ttl=0.6, holder="e2")
    run1 = asyncio.create_task(first.run(lead))
    run2: asyncio.Task[Any] | None = None
    try:
        await asyncio.wait_for(started["e1"].wait(), 5)
        run2 = asyncio.create_task(second.run(lead))
        link.cut = True
        await asyncio.wait_for(started["e2"].wait(), 5)
        assert [(h, what) for h, what, _ in events] == [
            ("e1", "leads"),
            ("e1", "stops"),
            ("e2", "leads"),
        ]
        assert events[1][2] < events[2][2]
        assert first.terms_won == 1 and second.terms_won == 1
        assert second.leading and not first.leading
    finally:
        await cancel(run1, *([run2] if run2 else []))


async def test_a_campaign_survives_a_failing_bucket(buckets: Buckets) -> None:
    link = Partitionable(await buckets.open())
    failures = 0
    create = link._kv.create

    async def flaky_create(key: str, value: bytes) -> int:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise KVError("unreachable (test)")
        return await create(key, value)

    link.create = flaky_create  # type: ignore[method-assign]
    election = Election(cast(KeyValue, link), "leader", ttl=0.1, holder="e")
    terms = election.terms()
    try:
        lease = await asyncio.wait_for(anext(terms), 5)
        assert failures == 2 and election.leading and lease.held
    finally:
        await terms.aclose()
    assert not lease.held and await election.leader() is None


# ------------------------------------------------------- a killed holder (NATS)

_HOLDER = """
import asyncio, sys
from flowtide.kv import KVLock, connect

async def main() -> None:
    kv = await connect(sys.argv[1], sys.argv[2])
    lease = await KVLock(kv, "k", ttl=float(sys.argv[3]), holder="doomed").acquire(timeout=20)
    print(lease.token, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.nats
async def test_a_killed_holder_is_taken_over_after_its_ttl(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    ttl = 1.0
    bucket = f"lock_{uuid.uuid4().hex[:12]}"
    kv = await connect(nats_server.url, bucket)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, nats_server.url, bucket, str(ttl)],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        token = int(line)
        await asyncio.sleep(0.5)  # it renews meanwhile
        proc.kill()
        proc.wait()
        killed = time.monotonic()
        lease = await KVLock(kv, "k", ttl=ttl, holder="survivor").acquire(timeout=10)
        assert lease.token > token
        assert ttl <= lease.acquired_at - killed < ttl + 1.0
        await lease.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        await kv.destroy()
        await kv.close()


# ------------------------------------------------------- an R3 bucket on a cluster


async def open_when_ready(url: str, bucket: str) -> KeyValue:
    """A handle on an R3 bucket, retried while a fresh cluster's JetStream API does not
    answer yet (a loaded machine: seconds after the metadata leader is chosen)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await connect(url, bucket, replicas=3)
        except KVError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@pytest.mark.nats
async def test_contention_on_an_r3_bucket_across_cluster_nodes(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Contenders connected to different nodes of a 3-node cluster: every compare-and-set
    goes through the stream leader, so exclusion and growing tokens hold as on one node."""
    bucket = f"lock_{uuid.uuid4().hex[:12]}"
    with NatsCluster.start(tmp_path_factory.mktemp("lock-cluster")) as cluster:
        handles: list[KeyValue] = []
        try:
            for i in range(6):
                node = cluster.nodes[i % len(cluster.nodes)]
                handles.append(await open_when_ready(node.url, bucket))
            assert (await handles[0].status()).replicas == 3
            await contend(handles, rounds=2)
        finally:
            if handles:
                with contextlib.suppress(KVError):
                    await handles[0].destroy()
            for kv in handles:
                await kv.close()
