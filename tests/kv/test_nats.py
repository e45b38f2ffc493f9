"""The NATS JetStream KV adapter against a real nats-server: the conformance suite plus
what only JetStream brings (error codes, paging, credentials, restarts, stream config,
the shared connection)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import nats
import psutil
import pytest

import flowtide.kv.nats as adapter
from flowtide.kv import (
    BucketNotFoundError,
    CreateManyError,
    KeyExistsError,
    KeyNotFoundError,
    KeyValue,
    KVError,
    KVUnavailableError,
    Operation,
    ValueTooLargeError,
    WrongRevisionError,
    connect,
)
from flowtide.kv.base import BucketConfig
from flowtide.kv.nats import NatsKeyValue, open_nats, redact_url
from flowtide.natsauth import NatsAuth

# The suite's asserts live outside a test_*.py file; have pytest rewrite them too.
pytest.register_assert_rewrite(f"{__package__}.conformance")

from .conformance import KVConformance, increment_from_threads, race_to_create  # noqa: E402
from .natsserver import NatsServer  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.nats]


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer.start(tmp_path_factory.mktemp("nats"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class TestNatsKV(KVConformance):
    __test__ = True

    # A file-backed stream expires messages ~0.25 s after max_age (measured on 2.15, a
    # fixed lag); the fresh-entries test checks at 1.2 ttl, so 0.2 ttl must exceed it.
    ttl = 2.5
    ttl_slack = 0.75

    @pytest.fixture(autouse=True)
    def _nats_url(self, nats_server: NatsServer) -> None:
        self.url = nats_server.url

    async def make_kv(self, bucket: str, **config: Any) -> KeyValue:
        return await connect(self.url, bucket, **config)


class TestNatsKVWithoutDirectGet(TestNatsKV):
    """The same behaviour on buckets whose stream has allow_direct off, as nats-py's
    create_key_value makes them: reads go through the stream leader and consumers."""

    async def make_kv(self, bucket: str, **config: Any) -> KeyValue:
        if config.get("create") is False or config.get("apply"):
            # Bind only, or change an existing bucket: nothing to pre-create.
            return await connect(self.url, bucket, **config)
        # Validates exactly as connect() does, so the error tests still see KV errors.
        stream = adapter._stream_config(BucketConfig(bucket=bucket, **config))
        stream["allow_direct"] = False
        nc = await nats.connect(self.url)
        try:
            # Refused with 10058 when the bucket exists with another configuration: then
            # bind it. Any other refusal (a busy server) is retried, never ignored: the
            # connect below would create the bucket itself, with direct get.
            for attempt in range(5):
                reply = await nc.request(
                    f"$JS.API.STREAM.CREATE.KV_{bucket}", json.dumps(stream).encode(), timeout=10
                )
                error = json.loads(reply.data).get("error")
                if error is None or error.get("err_code") == 10058:
                    break
                if attempt == 4:
                    raise AssertionError(f"stream create refused: {error}")
                await asyncio.sleep(0.2 * (attempt + 1))
        finally:
            await nc.close()
        kv = await connect(self.url, bucket, **config)
        assert isinstance(kv, NatsKeyValue) and not kv._info.direct
        return kv


# --------------------------------------------------------------------------- helpers


def bucket_name() -> str:
    return f"nats_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def kv(nats_server: NatsServer) -> AsyncIterator[NatsKeyValue]:
    """A handle on a fresh bucket with history 10, destroyed afterwards."""
    handle = await connect(nats_server.url, bucket_name(), history=10)
    assert isinstance(handle, NatsKeyValue)
    yield handle
    await _drop(handle)


async def _drop(handle: KeyValue) -> None:
    try:
        await handle.destroy()
    except KVError:
        pass
    await handle.close()


async def put_in_parallel(kv: KeyValue, items: list[tuple[str, bytes]], writers: int) -> None:
    """Put every (key, value) of `items`, spread over `writers` concurrent tasks."""

    async def write(start: int) -> None:
        for key, value in items[start::writers]:
            await kv.put(key, value)

    async with anyio.create_task_group() as tg:
        for start in range(writers):
            tg.start_soon(write, start)


async def stream_info(url: str, bucket: str) -> dict[str, Any]:
    """`$JS.API.STREAM.INFO` straight from nats-py, not through the adapter."""
    nc = await nats.connect(url)
    try:
        reply = await nc.request(f"$JS.API.STREAM.INFO.KV_{bucket}", b"", timeout=5)
        info: dict[str, Any] = json.loads(reply.data)
        return info
    finally:
        await nc.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sockets_to(port: int) -> int:
    """Established TCP connections of this process to 127.0.0.1:port."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


async def eventually(check: Any, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not await check():
            await anyio.sleep(0.05)


# ------------------------------------------------------------- bucket configuration


async def test_stream_config_matches_request(nats_server: NatsServer) -> None:
    name = bucket_name()
    kv = await connect(
        nats_server.url,
        name,
        history=7,
        ttl=90.0,
        max_value_size=1000,
        storage="memory",
        compression=True,
    )
    try:
        config = (await stream_info(nats_server.url, name))["config"]
        assert config["name"] == f"KV_{name}"
        assert config["subjects"] == [f"$KV.{name}.>"]
        assert config["storage"] == "memory"
        assert config["num_replicas"] == 1
        assert config["max_msgs_per_subject"] == 7
        assert config["max_age"] == 90 * 10**9
        # ADR-8: the duplicate window follows max_age below two minutes.
        assert config["duplicate_window"] == 90 * 10**9
        assert config["compression"] == "s2"
        assert config["allow_direct"] is True
        assert config["allow_rollup_hdrs"] is True
        assert config["deny_delete"] is True
        assert config["deny_purge"] is False
        assert config["discard"] == "new"
        # The documented deviation: room for headers, the exact limit in metadata.
        assert config["max_msg_size"] == 1000 + 128
        assert config["metadata"]["flowtide.max_value_size"] == "1000"
        status = await kv.status()
        assert (status.history, status.ttl, status.max_value_size) == (7, 90.0, 1000)
        assert (status.storage, status.replicas, status.compression) == ("memory", 1, True)
        assert status.backing_store == "JetStream"
    finally:
        await _drop(kv)


async def test_default_stream_config(nats_server: NatsServer) -> None:
    name = bucket_name()
    kv = await connect(nats_server.url, name)
    try:
        config = (await stream_info(nats_server.url, name))["config"]
        assert (config["storage"], config["num_replicas"]) == ("file", 1)
        assert (config["max_msgs_per_subject"], config["max_age"]) == (1, 0)
        assert config["max_msg_size"] == -1
        assert config["duplicate_window"] == 120 * 10**9
        assert config["compression"] == "none"
        assert config["allow_direct"] is True
    finally:
        await _drop(kv)


async def test_existing_bucket_keeps_its_config(nats_server: NatsServer) -> None:
    name = bucket_name()
    first = await connect(nats_server.url, name, history=3)
    again = await connect(nats_server.url, name, history=10, ttl=5.0, storage="memory")
    try:
        status = await again.status()
        assert (status.history, status.ttl, status.storage) == (3, None, "file")
    finally:
        await again.close()
        await _drop(first)


async def test_interoperates_with_nats_py_kv(nats_server: NatsServer) -> None:
    """A bucket made by another ADR-8 client is bound as it is, and both read each
    other's writes, markers included."""
    name = bucket_name()
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    theirs = await js.create_key_value(bucket=name, history=5)
    ours = await connect(nats_server.url, name, history=1)
    try:
        rev = await theirs.put("a.b", b"from nats-py")
        entry = await ours.get("a.b")
        assert (entry.value, entry.revision) == (b"from nats-py", rev)
        assert (await ours.status()).history == 5
        rev = await ours.put("a.c", b"from flowtide")
        assert (await theirs.get("a.c")).value == b"from flowtide"
        await ours.delete("a.b")
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await theirs.get("a.b")
        await theirs.delete("a.c")
        with pytest.raises(KeyNotFoundError) as info:
            await ours.get("a.c")
        assert info.value.operation is Operation.DEL
        assert await ours.keys() == []
    finally:
        await _drop(ours)
        await nc.close()


async def test_ttl_below_jetstream_minimum_is_a_kv_error(nats_server: NatsServer) -> None:
    with pytest.raises(KVError, match="max age"):
        await connect(nats_server.url, bucket_name(), ttl=0.05)


async def test_ttl_expiry_on_memory_storage(nats_server: NatsServer) -> None:
    # Memory streams expire on time; the conformance suite covers file streams.
    kv = await connect(nats_server.url, bucket_name(), ttl=0.4, storage="memory", history=3)
    try:
        await kv.put("k", b"1")
        await kv.put("k", b"2")
        await anyio.sleep(0.2)
        assert (await kv.get("k")).value == b"2"
        await anyio.sleep(0.5)
        with pytest.raises(KeyNotFoundError):
            await kv.get("k")
        assert (await kv.status()).values == 0
        await kv.create("k", b"3")
    finally:
        await _drop(kv)


# ------------------------------------------------------------------ error mapping


class _RecordingApiError(adapter._ApiError):
    codes: list[int] = []

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error)
        self.codes.append(self.err_code)


@pytest.fixture
def api_error_codes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """JetStream error codes the adapter receives, recorded on their way in."""
    codes: list[int] = []
    monkeypatch.setattr(_RecordingApiError, "codes", codes)
    # Where JetStream error replies become _ApiError (API replies, publish acks).
    for module in (adapter.connection, adapter.bucket):
        monkeypatch.setattr(module, "_ApiError", _RecordingApiError)
    return codes


async def test_stale_update_is_10071_as_wrong_revision(
    kv: NatsKeyValue, api_error_codes: list[int]
) -> None:
    r1 = await kv.put("k", b"1")
    r2 = await kv.put("k", b"2")
    with pytest.raises(WrongRevisionError) as info:
        await kv.update("k", b"3", r1)
    assert (info.value.expected, info.value.current) == (r1, r2)
    assert api_error_codes == [10071]
    with pytest.raises(WrongRevisionError) as info:
        await kv.delete("k", last=r1)
    assert info.value.current == r2
    with pytest.raises(KeyExistsError) as exists:
        await kv.create("k", b"x")
    assert exists.value.revision == r2
    assert api_error_codes == [10071, 10071, 10071]


async def test_create_race_maps_to_key_exists(kv: NatsKeyValue, api_error_codes: list[int]) -> None:
    winners, losers = await race_to_create(kv, "claim", b"me", 32)
    assert len(winners) == 1 and len(losers) == 31
    assert {exc.revision for exc in losers} == {winners[0]}
    assert set(api_error_codes) == {10071}


async def test_create_race_after_delete(kv: NatsKeyValue) -> None:
    await kv.put("k", b"old")
    await kv.delete("k")
    winners, losers = await race_to_create(kv, "k", b"new", 16)
    assert len(winners) == 1
    assert all(exc.revision == winners[0] for exc in losers)


# ------------------------------------------------------------------ create_many


async def test_create_many_pipelines_and_settles_refusals_as_create(
    kv: NatsKeyValue, api_error_codes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """New keys cost no request/reply of their own (the publishes are pipelined); each
    existing key is one 10071 and one read of the stream leader."""
    for i in range(0, 600, 2):
        await kv.put(f"k.{i}", b"old")
    requests: list[str] = []
    real_request = kv._conn.request

    async def counting(subject: str, *args: Any, **kwargs: Any) -> Any:
        requests.append(subject)
        return await real_request(subject, *args, **kwargs)

    monkeypatch.setattr(kv._conn, "request", counting)
    api_error_codes.clear()
    revs = await kv.create_many([(f"k.{i}", b"new") for i in range(600)])
    assert [r is None for r in revs] == [i % 2 == 0 for i in range(600)]
    assert api_error_codes == [10071] * 300
    assert len(requests) == 300
    assert all(subject.startswith("$JS.API.STREAM.MSG.GET.") for subject in requests)
    assert {e.value for e in (await kv.get_last_many("k.*")).values()} == {b"old", b"new"}


async def test_create_many_bounds_the_acks_outstanding(
    kv: NatsKeyValue, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = kv._conn
    live: set[str] = set()
    most = 0
    real_expect, real_forget = conn.expect_reply, conn.forget_reply

    def expect() -> tuple[str, asyncio.Future[Any]]:
        nonlocal most
        token, future = real_expect()
        live.add(token)
        most = max(most, len(live))
        return token, future

    def forget(token: str) -> None:
        live.discard(token)
        real_forget(token)

    monkeypatch.setattr(conn, "expect_reply", expect)
    monkeypatch.setattr(conn, "forget_reply", forget)
    revs = await kv.create_many([(f"k.{i}", b"v") for i in range(1000)])
    assert None not in revs and len(set(revs)) == 1000
    assert most == adapter.bucket._PIPELINE_WINDOW
    assert live == set()


async def test_create_many_stops_sending_when_the_server_does_not_answer(
    nats_server: NatsServer,
) -> None:
    """A subscriber that never replies: the first request times out, the unanswered ones
    fail with it and the rest are not sent, in about one timeout, not one per request."""
    kv = await connect(nats_server.url, bucket_name())
    assert isinstance(kv, NatsKeyValue)
    # The subscriber is on the requests' own connection: the server takes its SUB before
    # their PUBs (from another connection, a loaded server answered 503 to the first).
    nc = kv._conn.client
    received: list[str] = []

    async def swallow(msg: Any) -> None:
        received.append(msg.subject)

    sub = await nc.subscribe("sink.>", cb=swallow)
    await nc.flush()
    try:
        requests = [(f"sink.{i}", b"x", None) for i in range(20)]
        t0 = time.monotonic()
        outcomes = await adapter.pipeline.request_pipelined(
            kv._conn, requests, timeout=0.5, window=4
        )
        elapsed = time.monotonic() - t0
        assert elapsed < 4.0  # 20 timeouts in a row would be 10 s
        assert all(isinstance(o, KVError) for o in outcomes)
        assert "no reply" in str(outcomes[0])
        assert all("not sent" in str(o) for o in outcomes[4:])
        assert sorted(received) == sorted(f"sink.{i}" for i in range(4))
    finally:
        await sub.unsubscribe()
        await _drop(kv)


async def test_create_many_reports_failed_items_after_the_others(kv: NatsKeyValue) -> None:
    big = b"x" * (2 * 1024 * 1024)  # over the server's max payload, not the bucket's limit
    with pytest.raises(CreateManyError) as info:
        await kv.create_many([("a", b"1"), ("big", big), ("c", b"3"), ("a", b"4")])
    error = info.value
    assert error.key == "big" and error.bucket == kv.bucket
    assert "big" in str(error) and "1 of 4" in str(error)
    assert list(error.errors) == [1]
    assert isinstance(error.errors[1], ValueTooLargeError)
    assert isinstance(error.__cause__, ValueTooLargeError)
    assert error.results[1:] == [None, error.results[2], None]
    assert (await kv.get("a")).revision == error.results[0]
    assert (await kv.get("c")).revision == error.results[2]
    with pytest.raises(KeyNotFoundError):
        await kv.get("big")


async def test_create_many_from_many_connections(nats_server: NatsServer) -> None:
    """Threads each with their own loop, hence their own connection, create the same keys
    (some deleted before, so re-creation races too): each key goes to one of them."""
    name = bucket_name()
    kv = await connect(nats_server.url, name, history=2)
    keys = [f"r.{i}" for i in range(400)]
    for key in keys[:100]:
        await kv.put(key, b"before")
        await kv.delete(key)
    won: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def thread_main(who: int) -> None:
        async def main() -> None:
            handle = await connect(nats_server.url, name)
            order = keys[::-1] if who % 2 else keys
            revs = await handle.create_many([(k, b"%d" % who) for k in order])
            won[who] = [k for k, r in zip(order, revs, strict=True) if r is not None]
            await handle.close()

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=thread_main, args=(who,)) for who in range(4)]
    try:
        for thread in threads:
            thread.start()
        await anyio.to_thread.run_sync(lambda: [t.join() for t in threads])
        assert errors == []
        assert sorted(k for keys_won in won.values() for k in keys_won) == sorted(keys)
        stored = await kv.get_last_many("r.*")
        for who, keys_won in won.items():
            assert all(stored[k].value == b"%d" % who for k in keys_won)
    finally:
        await _drop(kv)


async def test_value_at_the_limit_survives_headers(nats_server: NatsServer) -> None:
    kv = await connect(nats_server.url, bucket_name(), max_value_size=8)
    try:
        rev = await kv.create("k", b"12345678")
        rev = await kv.update("k", b"87654321", rev)
        await kv.delete("k", last=rev)
        await kv.purge("k")
        with pytest.raises(ValueTooLargeError):
            await kv.put("k", b"123456789")
    finally:
        await _drop(kv)


async def test_value_above_server_max_payload(kv: NatsKeyValue) -> None:
    with pytest.raises(ValueTooLargeError) as info:
        await kv.put("big", b"x" * (2 * 1024 * 1024))
    assert info.value.max_size == 1024 * 1024
    assert info.value.bucket == kv.bucket


async def test_missing_bucket_is_bucket_not_found_everywhere(nats_server: NatsServer) -> None:
    other = await connect(nats_server.url, bucket_name())
    # Deleted behind the handle's back, so every call has to find out from the server.
    nc = await nats.connect(nats_server.url)
    await nc.request(f"$JS.API.STREAM.DELETE.KV_{other.bucket}", b"", timeout=5)
    await nc.close()
    calls = [
        lambda: other.get("k"),
        lambda: other.get("k", revision=3),
        lambda: other.put("k", b"v"),
        lambda: other.create("k", b"v"),
        lambda: other.create_many([("k", b"v"), ("j", b"w")]),
        lambda: other.update("k", b"v", 1),
        lambda: other.delete("k"),
        lambda: other.purge("k"),
        lambda: other.history("k"),
        lambda: other.keys(),
        lambda: other.get_last_many(">"),
        lambda: other.status(),
        lambda: other.purge_all(">"),
        lambda: other.watch().start(),
        lambda: other.destroy(),
    ]
    try:
        for call in calls:
            with pytest.raises(BucketNotFoundError) as info:
                await call()
            assert info.value.bucket == other.bucket
    finally:
        await other.close()


# ------------------------------------------------------------------ keys and reads


async def test_keys_with_filters_skip_deleted_keys(kv: NatsKeyValue) -> None:
    for key in ("job.1.state", "job.1.log", "job.2.state", "job.3.state", "other", "job.4.x.y"):
        await kv.put(key, b"v")
    await kv.delete("job.1.state")
    await kv.purge("job.3.state")
    await kv.put("job.1.log", b"again")
    assert await kv.keys("job.*.state") == ["job.2.state"]
    assert await kv.keys(["job.>", "other"]) == ["job.1.log", "job.2.state", "job.4.x.y", "other"]
    # Overlapping filters: one consumer, each key once.
    assert await kv.keys(["job.*.state", "job.2.*", "job.>"]) == [
        "job.1.log",
        "job.2.state",
        "job.4.x.y",
    ]
    assert await kv.keys("job.3.>") == []
    await kv.put("job.3.state", b"back")
    assert await kv.keys("job.3.*") == ["job.3.state"]


async def test_get_revision_reports_delta_and_markers(kv: NatsKeyValue) -> None:
    r1 = await kv.put("k", b"1")
    r2 = await kv.put("k", b"2")
    await kv.delete("k")
    assert (await kv.get("k", revision=r1)).delta == 2
    assert (await kv.get("k", revision=r2)).delta == 1
    marker = (await kv.history("k"))[-1]
    with pytest.raises(KeyNotFoundError) as info:
        await kv.get("k", revision=marker.revision)
    assert info.value.operation is Operation.DEL
    for bad in (0, -1):
        with pytest.raises(KeyNotFoundError):
            await kv.get("k", revision=bad)


async def test_get_last_many_pages_past_1024_keys(
    kv: NatsKeyValue, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 2500
    await put_in_parallel(kv, [(f"r.{i}", b"%d" % i) for i in range(count)], writers=25)
    for i in range(0, count, 10):
        await kv.delete(f"r.{i}")
    point = await kv.put("r.marker", b"point")
    for i in range(1, 100):
        await kv.put(f"r.{i}", b"changed")
    await kv.put("r.late", b"after the point")

    bodies: list[dict[str, Any]] = []
    original = adapter._Connection.request_many

    async def recording(self: Any, subject: str, body: dict[str, Any], *, timeout: float) -> Any:
        bodies.append(body)
        return await original(self, subject, body, timeout=timeout)

    monkeypatch.setattr(adapter._Connection, "request_many", recording)

    now = await kv.get_last_many("r.>")
    # Every tenth key was deleted before the point; r.1 .. r.99 were written after it.
    live_then = {f"r.{i}" for i in range(count) if i % 10} | {"r.marker"}
    live = live_then | {f"r.{i}" for i in range(10, 100, 10)} | {"r.late"}
    assert set(now) == live
    assert list(now) == sorted(now)
    assert now["r.1"].value == b"changed" and now["r.111"].value == b"111"
    assert all(e.delta == 0 for e in now.values())
    # The first request was refused (413); then pages of at most 1024 explicit subjects.
    pages = [b for b in bodies[1:] if "multi_last" in b]
    assert bodies[0]["multi_last"] == [f"$KV.{kv.bucket}.r.>"]
    assert len(pages) >= 3 and all(len(b["multi_last"]) <= 1024 for b in pages)
    assert len({b["up_to_seq"] for b in pages}) == 1

    then = await kv.get_last_many(["r.*"], up_to_revision=point)
    assert set(then) == live_then
    assert then["r.1"].value == b"1" and then["r.1"].delta == 1
    assert then["r.111"].value == b"111" and then["r.111"].delta == 0
    assert max(e.revision for e in then.values()) == point


async def test_history_of_a_key_with_64_revisions(nats_server: NatsServer) -> None:
    kv = await connect(nats_server.url, bucket_name(), history=64)
    try:
        for i in range(70):
            await kv.put("k", b"%d" % i)
        history = await kv.history("k")
        assert [e.value for e in history] == [b"%d" % i for i in range(6, 70)]
        assert [e.delta for e in history] == list(range(63, -1, -1))
    finally:
        await _drop(kv)


# ------------------------------------------------------------------------ purge_all


async def test_purge_all_is_one_request_per_filter(
    kv: NatsKeyValue, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 10_000
    await put_in_parallel(kv, [(f"exec.7.loop.s.0.r.{i}", b"ok") for i in range(count)], writers=50)
    await kv.put("exec.7.loop.s.0.meta", b"{}")
    await kv.put("exec.8.loop.s.0.meta", b"{}")

    purges: list[dict[str, Any] | None] = []
    original = adapter._Connection.api

    async def recording(self: Any, subject: str, body: Any, *, timeout: float) -> Any:
        if ".STREAM.PURGE." in subject:
            purges.append(body)
        return await original(self, subject, body, timeout=timeout)

    monkeypatch.setattr(adapter._Connection, "api", recording)
    removed = await kv.purge_all(["exec.7.loop.s.0.r.*", "exec.7.loop.s.0.meta"])
    assert removed == count + 1
    assert purges == [
        {"filter": f"$KV.{kv.bucket}.exec.7.loop.s.0.r.*"},
        {"filter": f"$KV.{kv.bucket}.exec.7.loop.s.0.meta"},
    ]
    # A filter covered by another one costs no request.
    purges.clear()
    assert await kv.purge_all(["exec.>", "exec.8.>", "exec.8.loop.s.0.meta"]) == 1
    assert len(purges) == 1
    assert await kv.keys() == []


# ------------------------------------------------------------------------- watchers


async def test_watcher_recovers_when_its_consumer_disappears(
    kv: NatsKeyValue, nats_server: NatsServer
) -> None:
    await kv.put("a", b"1")
    async with kv.watch() as watcher:
        assert [e.key for e in await initial(watcher)] == ["a"]
        consumer = watcher._consumer
        assert consumer is not None
        nc = await nats.connect(nats_server.url)
        try:
            await nc.request(f"$JS.API.CONSUMER.DELETE.KV_{kv.bucket}.{consumer}", b"", timeout=5)
        finally:
            await nc.close()
        revs = [await kv.put("b", b"%d" % i) for i in range(3)]
        # Missed heartbeats make it re-create the consumer from the next revision.
        with anyio.fail_after(10):
            got = [await anext(watcher) for _ in range(3)]
        assert [e.revision for e in got if e is not None] == revs
        assert watcher._consumer != consumer


async def initial(watcher: Any) -> list[Any]:
    items = []
    with anyio.fail_after(5):
        while (item := await anext(watcher)) is not None:
            items.append(item)
    return items


async def test_close_and_destroy_end_watchers(nats_server: NatsServer) -> None:
    kv = await connect(nats_server.url, bucket_name())
    other = await connect(nats_server.url, kv.bucket)
    w1 = kv.watch()
    w2 = other.watch()
    await w1.start()
    await w2.start()
    assert await initial(w1) == [] and await initial(w2) == []
    await kv.put("k", b"v")
    with anyio.fail_after(5):
        assert (await anext(w1)) is not None
        assert (await anext(w2)) is not None
    await kv.close()
    with anyio.fail_after(5), pytest.raises(StopAsyncIteration):
        await anext(w1)
    with pytest.raises(KVError, match="closed"):
        await kv.get("k")
    assert (await other.get("k")).value == b"v"
    await other.destroy()
    with anyio.fail_after(5), pytest.raises(StopAsyncIteration):
        await anext(w2)
    with pytest.raises(BucketNotFoundError):
        await other.get("k")
    await other.close()


async def test_destroy_elsewhere_ends_watchers(nats_server: NatsServer) -> None:
    kv = await connect(nats_server.url, bucket_name())
    try:
        async with kv.watch() as watcher:
            assert await initial(watcher) == []
            nc = await nats.connect(nats_server.url)
            try:
                await nc.request(f"$JS.API.STREAM.DELETE.KV_{kv.bucket}", b"", timeout=5)
            finally:
                await nc.close()
            with anyio.fail_after(10), pytest.raises(StopAsyncIteration):
                await anext(watcher)
        with pytest.raises(BucketNotFoundError):
            await kv.put("k", b"v")
    finally:
        await kv.close()


async def test_watch_large_initial_data_uses_flow_control(kv: NatsKeyValue) -> None:
    count = 3000
    value = b"x" * 2000
    await put_in_parallel(kv, [(f"f.{i}", value) for i in range(count)], writers=20)
    async with kv.watch("f.>") as watcher:
        got = await initial(watcher)
        assert len(got) == count
        assert [e.delta for e in got] == list(range(count - 1, -1, -1))
        assert all(e.value == value for e in got)
        rev = await kv.put("f.live", b"1")
        with anyio.fail_after(5):
            entry = await anext(watcher)
        assert entry is not None and (entry.revision, entry.delta) == (rev, 0)


async def test_watch_ignore_deletes_counts_delta_over_delivered(kv: NatsKeyValue) -> None:
    for key in ("a", "b", "c"):
        await kv.put(key, b"v")
    await kv.delete("b")
    async with kv.watch(ignore_deletes=True) as watcher:
        got = await initial(watcher)
        assert [(e.key, e.delta) for e in got] == [("a", 1), ("c", 0)]


# ------------------------------------------------------------------- connections


async def test_handles_share_one_connection(nats_server: NatsServer) -> None:
    name = bucket_name()
    before = sockets_to(nats_server.port)
    handles = await asyncio.gather(*(connect(nats_server.url, name) for _ in range(16)))
    try:
        assert len({id(h._conn) for h in handles if isinstance(h, NatsKeyValue)}) == 1
        assert sockets_to(nats_server.port) == before + 1
        await handles[0].put("k", b"v")
        assert all([(await h.get("k")).value == b"v" for h in handles])
        for h in handles[:-1]:
            await h.close()
        assert sockets_to(nats_server.port) == before + 1
        assert (await handles[-1].get("k")).value == b"v"
    finally:
        await handles[-1].destroy()
        await handles[-1].close()
    # The last close closed the connection; a new connect opens a new one.
    await eventually(lambda: _true(sockets_to(nats_server.port) == before), timeout=5)
    again = await connect(nats_server.url, name)
    assert sockets_to(nats_server.port) == before + 1
    await _drop(again)


async def _true(value: bool) -> bool:
    return value


async def test_handle_refuses_another_event_loop(kv: NatsKeyValue) -> None:
    def elsewhere() -> None:
        async def use() -> None:
            with pytest.raises(KVError, match="another event loop"):
                await kv.get("k")

        asyncio.run(use())

    await anyio.to_thread.run_sync(elsewhere)


async def test_cas_increments_from_many_connections(nats_server: NatsServer) -> None:
    """Threads each with their own loop, hence their own connection, race on one key:
    updates must collide at the server and the total must still be exact."""
    name = bucket_name()
    kv = await connect(nats_server.url, name)
    await kv.put("counter", b"0")
    threads, tasks, rounds = 4, 4, 25
    try:
        conflicts = await increment_from_threads(
            nats_server.url, name, "counter", threads=threads, tasks=tasks, rounds=rounds
        )
        assert int((await kv.get("counter")).value) == threads * tasks * rounds
        assert conflicts > 0
    finally:
        await _drop(kv)


# --------------------------------------------------------------------- credentials


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer.start(
        tmp_path_factory.mktemp("nats-auth"), "--user", "flow", "--pass", "s3cr3t-Pa55"
    )
    try:
        yield server
    finally:
        server.stop()


async def test_user_and_password_in_url(auth_server: NatsServer) -> None:
    url = f"nats://flow:s3cr3t-Pa55@127.0.0.1:{auth_server.port}"
    kv = await connect(url, bucket_name())
    try:
        await kv.put("k", b"v")
        assert (await kv.get("k")).value == b"v"
        assert "s3cr3t" not in repr(kv)
        assert "flow:***@" in repr(kv)
    finally:
        await _drop(kv)


@pytest.mark.parametrize(
    ("userinfo", "secret"),
    [("flow:WrongPassw0rd", "WrongPassw0rd"), ("flow:", None), ("", None)],
)
async def test_refused_credentials_are_a_kv_error_without_the_password(
    auth_server: NatsServer, userinfo: str, secret: str | None
) -> None:
    at = f"{userinfo}@" if userinfo else ""
    url = f"nats://{at}127.0.0.1:{auth_server.port}"
    with pytest.raises(KVError) as info:
        await connect(url, "bucket")
    text = f"{info.value} {info.value!r} {info.value.args}"
    assert "authorization violation" in text
    assert f"127.0.0.1:{auth_server.port}" in text
    if secret is not None:
        assert secret not in text
        assert "flow:***@" in text
    assert not isinstance(info.value.__cause__, nats.errors.Error)


async def test_credentials_given_apart_from_the_url(auth_server: NatsServer) -> None:
    """FLOWTIDE_NATS_USER/PASSWORD reach the adapter as a NatsAuth: no secret in the URL."""
    kv = await connect(
        auth_server.url, bucket_name(), nats_auth=NatsAuth(user="flow", password="s3cr3t-Pa55")
    )
    try:
        await kv.put("k", b"v")
        assert (await kv.get("k")).value == b"v"
        assert "s3cr3t" not in repr(kv)
        # The same URL with other credentials is another connection, refused on its own.
        with pytest.raises(KVError) as info:
            await connect(
                auth_server.url, "bucket", nats_auth=NatsAuth(user="flow", password="Wr0ngPass")
            )
        text = f"{info.value} {info.value!r}"
        assert "authorization violation" in text and auth_server.url in text
        assert "Wr0ngPass" not in text
        # Credentials in the URL win over the others.
        url = f"nats://flow:s3cr3t-Pa55@127.0.0.1:{auth_server.port}"
        other = await connect(url, bucket_name(), nats_auth=NatsAuth(user="flow", password="Wr0ng"))
        await _drop(other)
    finally:
        await _drop(kv)


async def test_unreachable_server_is_a_kv_error() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(
        KVError, match=f"cannot connect to NATS at nats://u:\\*\\*\\*@127.0.0.1:{port}"
    ) as info:
        await connect(f"nats://u:hunter2@127.0.0.1:{port}", "bucket")
    assert "hunter2" not in str(info.value)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://u:p@h:4222", "nats://u:***@h:4222"),
        ("tls://tok3n@h:4222", "tls://***@h:4222"),
        ("wss://u:p%40ss@h/path", "wss://u:***@h/path"),
        ("nats://a:1@h1:4222, nats://b:2@h2:4222", "nats://a:***@h1:4222,nats://b:***@h2:4222"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("url", ["tls://127.0.0.1:{port}", "ws://127.0.0.1:{port}"])
async def test_other_schemes_route_to_nats(url: str) -> None:
    with pytest.raises(KVError, match="cannot connect to NATS"):
        await connect(url.format(port=free_port()), "bucket")


def test_importing_the_port_does_not_import_nats() -> None:
    code = "import sys, flowtide.kv; assert 'nats' not in sys.modules, sorted(sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(adapter.__file__).parents[3])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ------------------------------------------------------------------ server restart


async def test_handle_and_watcher_survive_a_server_restart(tmp_path: Path) -> None:
    """Decided behaviour: the handle recovers by itself. While the server is down an
    operation fails with KVError after the request timeout; once it is back, the same
    handle works and watchers resume from the next revision."""
    server = NatsServer.start(tmp_path)
    config = BucketConfig(bucket=bucket_name(), history=5)
    kv = await open_nats(server.url, config, timeout=1.5)
    try:
        rev = await kv.put("before", b"1")
        async with kv.watch() as watcher:
            assert [e.revision for e in await initial(watcher)] == [rev]
            server.restart()
            # A request written to the dying socket is lost and times out; the client
            # reconnects by itself and the same handle works again.
            after = await until_ok(lambda: kv.put("after", b"2"))
            assert (await kv.get("before")).value == b"1"
            await watch_until(watcher, after)

            server.stop()
            with pytest.raises(KVUnavailableError, match="no reply from NATS|dropped") as info:
                await kv.put("down", b"3")
            assert not isinstance(info.value, BucketNotFoundError)
            server.restart()
            back = await until_ok(lambda: kv.put("back", b"4"))
            await watch_until(watcher, back)
        # The timed-out put stayed in the client's send buffer and may have been
        # written after the reconnect: a timeout never says a write did not happen.
        assert set(await kv.keys()) - {"down"} == {"before", "after", "back"}
        await kv.destroy()
    finally:
        await kv.close()
        server.stop()


async def test_a_request_in_flight_when_the_connection_drops_fails_at_once(
    tmp_path: Path,
) -> None:
    """A reply the dead node held never comes: the request ends when the connection
    drops (KVUnavailableError, which says the write may have happened), not at its
    timeout, and the handle works again once a server is back."""
    server = NatsServer.start(tmp_path)
    kv = await open_nats(server.url, BucketConfig(bucket=bucket_name()), timeout=30.0)
    try:
        await kv.put("before", b"1")
        server.freeze()  # it holds the request, answering nothing
        put = asyncio.ensure_future(kv.put("during", b"2"))
        await asyncio.sleep(0.3)
        assert not put.done()
        started = time.monotonic()
        server.proc.kill()  # the socket drops
        server.proc.wait()
        with pytest.raises(KVUnavailableError, match="dropped before the reply") as info:
            await put
        assert time.monotonic() - started < 5.0, "waited for the 30 s timeout"
        assert "may or may not have been applied" in str(info.value)
        server.restart()
        await until_ok(lambda: kv.put("after", b"3"))
        assert (await kv.get("before")).value == b"1"
    finally:
        await kv.close()
        server.stop()


async def until_ok(call: Any, timeout: float = 15.0) -> Any:
    with anyio.fail_after(timeout):
        while True:
            try:
                return await call()
            except KVError:
                await anyio.sleep(0.1)


async def watch_until(watcher: Any, revision: int) -> None:
    """Read live entries up to `revision`; they must come in revision order."""
    last = 0
    with anyio.fail_after(10):
        while last != revision:
            entry = await anext(watcher)
            assert entry is not None and entry.revision > last
            last = entry.revision


# ------------------------------------------------------------------------- cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NatsServer]]:
    root = tmp_path_factory.mktemp("nats-cluster")
    ports = [free_port() for _ in range(3)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in ports)
    servers: list[NatsServer] = []
    try:
        for i, port in enumerate(ports):
            servers.append(
                NatsServer.start(
                    root / f"s{i}",
                    "-n",
                    f"s{i}",
                    "--cluster_name",
                    "flowtide",
                    "--cluster",
                    f"nats://127.0.0.1:{port}",
                    "--routes",
                    routes,
                )
            )
        yield servers
    finally:
        for server in servers:
            server.stop()


async def _connect_when_meta_leader(url: str, name: str, **config: Any) -> KeyValue:
    # A fresh cluster needs a moment to elect its JetStream meta leader.
    deadline = time.monotonic() + 20
    while True:
        try:
            return await connect(url, name, **config)
        except KVError:
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.25)


async def test_replicated_bucket_maps_10164(
    cluster: list[NatsServer], api_error_codes: list[int]
) -> None:
    """On a cluster a CAS race is mostly refused with 10164 (no revision in it): it is
    a WrongRevisionError too, with `current` read from the stream leader."""
    url = ",".join(s.url for s in cluster)
    name = bucket_name()
    kv = await _connect_when_meta_leader(url, name, replicas=3)
    api_error_codes.clear()  # the look-up before creating the bucket (10059)
    try:
        config = (await stream_info(cluster[0].url, name))["config"]
        assert config["num_replicas"] == 3
        assert (await kv.status()).replicas == 3
        await kv.put("counter", b"0")
        workers, rounds = 16, 8
        seen: list[WrongRevisionError] = []

        async def increment() -> None:
            for _ in range(rounds):
                while True:
                    entry = await kv.get("counter")
                    try:
                        await kv.update("counter", b"%d" % (int(entry.value) + 1), entry.revision)
                        break
                    except WrongRevisionError as exc:
                        seen.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(increment)
        with anyio.fail_after(5):
            while int((await kv.get("counter")).value) != workers * rounds:
                await anyio.sleep(0.05)
        assert 10164 in api_error_codes
        assert set(api_error_codes) <= {10071, 10164}
        assert seen and all(exc.current >= exc.expected for exc in seen)
    finally:
        await _drop(kv)


# ------------------------------------------------------------- pure helpers


def _msg(subject: str = "", reply: str = "", headers: dict[str, str] | None = None) -> Any:
    return nats.aio.msg.Msg(None, subject=subject, reply=reply, data=b"v", headers=headers)


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.KV_b.cons.1.42.7.1795359592907267509.3",
        "$JS.ACK.hub.ACCHASH.KV_b.cons.1.42.7.1795359592907267509.3.rnd",
    ],
)
def test_parse_delivery_v1_and_v2_ack_subjects(reply: str) -> None:
    d = adapter._parse_delivery(_msg("$KV.b.a.b", reply, {"KV-Operation": "DEL"}), "$KV.b.")
    assert d is not None
    assert (d.key, d.revision, d.dseq, d.pending, d.operation) == ("a.b", 42, 7, 3, Operation.DEL)
    assert d.created == pytest.approx(1795359592.907267509)


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2026-11-22T14:57:23.319029496Z", 1795359443.319029496),
        ("2026-11-22T14:57:23Z", 1795359443.0),
        ("2026-11-22T15:57:23.5+01:00", 1795359443.5),
        ("2026-11-22 14:57:23.319029496 +0000 UTC", 1795359443.319029496),
        ("garbage", 0.0),
    ],
)
def test_parse_timestamps(text: str, epoch: float) -> None:
    assert adapter._parse_ts(text) == pytest.approx(epoch)


@pytest.mark.parametrize(
    ("filters", "reduced"),
    [
        (["a", "a"], ("a",)),
        (["a.b.*", "a.b.c"], ("a.b.*",)),
        (["a.b.c", "a.>"], ("a.>",)),
        (["a.*", "a.>", "b"], ("a.>", "b")),
        (["a.*.c", "a.b.*"], ("a.*.c", "a.b.*")),
        (["x", ">"], (">",)),
        (["a.*", "a"], ("a.*", "a")),
    ],
)
def test_reduce_filters(filters: list[str], reduced: tuple[str, ...]) -> None:
    assert adapter._reduce(filters) == reduced


@pytest.mark.parametrize(
    ("headers", "reply", "delivered", "verdict"),
    [
        ({"Status": "100", "Nats-Last-Consumer": "5"}, "", 5, True),
        ({"Status": "100", "Nats-Last-Consumer": "6"}, "", 5, False),
        (
            {"Status": "100", "Nats-Last-Consumer": "5", "Nats-Consumer-Stalled": "$JS.FC.x"},
            "",
            5,
            None,
        ),
        ({"Status": "100"}, "$JS.FC.KV_b.c.x", 5, None),
    ],
)
def test_idle_heartbeat_verdict(
    headers: dict[str, str], reply: str, delivered: int, verdict: bool | None
) -> None:
    assert adapter._idle_after(_msg(reply=reply, headers=headers), delivered) is verdict


async def test_replicated_bucket_create_many_races(
    cluster: list[NatsServer], api_error_codes: list[int]
) -> None:
    """Two connections to different servers of a cluster create the same keys of an R3
    bucket, some over delete markers: refusals come as 10071 or 10164 and each key still
    goes to exactly one of them."""
    name = bucket_name()
    kv1 = await _connect_when_meta_leader(cluster[0].url, name, replicas=3, history=2)
    kv2 = await _connect_when_meta_leader(cluster[1].url, name)
    try:
        keys = [f"r.{i}" for i in range(300)]
        for key in keys[:100]:
            await kv1.put(key, b"before")
            await kv1.delete(key)
        api_error_codes.clear()
        order2 = keys[::-1]
        got1, got2 = await asyncio.gather(
            kv1.create_many([(k, b"one") for k in keys]),
            kv2.create_many([(k, b"two") for k in order2]),
        )
        won1 = {k for k, r in zip(keys, got1, strict=True) if r is not None}
        won2 = {k for k, r in zip(order2, got2, strict=True) if r is not None}
        assert won1 | won2 == set(keys) and not won1 & won2
        assert api_error_codes and set(api_error_codes) <= {10071, 10164}
        stored = await kv1.get_last_many("r.*")
        assert {k for k, e in stored.items() if e.value == b"one"} == won1
    finally:
        await kv2.close()
        await _drop(kv1)


async def test_a_key_too_long_for_nats_is_refused_and_the_handle_lives_on(
    kv: NatsKeyValue,
) -> None:
    # nats-server closes a connection whose protocol line passes 4096 bytes: a put of a
    # 5,000-character key closed the handle for good ("the NATS connection ... is
    # closed" for every later call), and a lock or watch on such a key did the same.
    from flowtide.kv import InvalidKeyError, KVLock
    from flowtide.kv.keys import MAX_KEY_LENGTH

    longest = "k" * MAX_KEY_LENGTH
    await kv.put(longest, b"fits")
    with pytest.raises(InvalidKeyError, match=f"at most {MAX_KEY_LENGTH} characters"):
        await kv.put("k" * 5000, b"v")
    with pytest.raises(InvalidKeyError, match="at most"):
        await KVLock(kv, "k" * 5000, ttl=10, holder="h").acquire(timeout=1)
    with pytest.raises(InvalidKeyError, match="at most"):
        await kv.keys("k" * 5000 + ".>")
    assert (await kv.get(longest)).value == b"fits"
