"""The in-process KV adapter: the conformance suite plus what only `memory://` promises
(process-wide registry, thread safety, watcher teardown), and the key-token helpers."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from flowtide.kv import (
    BucketFullError,
    BucketNotFoundError,
    InvalidKeyError,
    KeyValue,
    KVError,
    Placement,
    Republish,
    connect,
    decode_key_token,
    encode_key_token,
)
from flowtide.kv.base import validate_key

# The suite's asserts live outside a test_*.py file; have pytest rewrite them too.
pytest.register_assert_rewrite(f"{__package__}.conformance")

from .conformance import KVConformance, increment_from_threads  # noqa: E402


class TestMemoryKV(KVConformance):
    __test__ = True

    async def make_kv(self, bucket: str, **config: Any) -> KeyValue:
        return await connect("memory://", bucket, **config)

    # --------------------------------------------------------- memory-only behaviour

    async def test_status_keeps_jetstream_options(self) -> None:
        kv = await self.open_kv(storage="memory", replicas=3, compression=True)
        status = await kv.status()
        assert (status.storage, status.replicas, status.compression) == ("memory", 3, True)
        assert status.backing_store == "memory"

    async def test_status_reports_placement_and_republish(self) -> None:
        placement = Placement("east", ("ssd",))
        republish = Republish("out.>", headers_only=True)
        kv = await self.open_kv(placement=placement, republish=republish)
        status = await kv.status()
        assert (status.placement, status.republish) == (placement, republish)

    async def test_mirrors_and_sources_need_nats(self) -> None:
        origin = await self.open_kv()
        for config in ({"mirror": origin.bucket}, {"sources": [origin.bucket]}):
            with pytest.raises(KVError, match="need nats://"):
                await self.open_kv(**config)

    async def test_max_bytes_counts_keys_and_values(self) -> None:
        kv = await self.open_kv(max_bytes=10)
        await kv.put("ab", b"1234")  # 6 bytes
        await kv.put("c", b"123")  # 10 bytes: exactly full
        with pytest.raises(BucketFullError):
            await kv.delete("c")  # a marker counts its key too
        await kv.purge_all("ab")
        await kv.delete("c")
        assert (await kv.status()).bytes == 1

    async def test_existing_bucket_keeps_its_config(self) -> None:
        kv = await self.open_kv(history=3)
        again = await self.open_kv(kv.bucket, history=10, ttl=5.0)
        status = await again.status()
        assert (status.history, status.ttl) == (3, None)

    async def test_bytes_counts_keys_and_values(self) -> None:
        kv = await self.open_kv(history=2)
        await kv.put("ab", b"1234")
        await kv.put("ab", b"12")
        assert (await kv.status()).bytes == 6 + 4
        await kv.put("ab", b"")
        assert (await kv.status()).bytes == 4 + 2
        await kv.purge("ab")
        assert (await kv.status()).bytes == 2

    async def test_values_must_be_bytes(self) -> None:
        kv = await self.open_kv()
        with pytest.raises(TypeError):
            await kv.put("k", "text")  # type: ignore[arg-type]
        await kv.put("k", bytearray(b"ok"))
        assert (await kv.get("k")).value == b"ok"

    async def test_close_ends_watchers_and_keeps_data(self) -> None:
        kv = await self.open_kv()
        other = await self.open_kv(kv.bucket)
        watcher = kv.watch()
        await watcher.start()
        assert await self.next_item(watcher) is None
        await kv.put("k", b"v")
        await kv.close()
        await kv.close()
        # The update written before close is still delivered, then iteration ends.
        assert (await self.next_entry(watcher)).key == "k"
        with pytest.raises(StopAsyncIteration):
            await self.next_item(watcher)
        with pytest.raises(KVError, match="closed"):
            await kv.get("k")
        with pytest.raises(KVError, match="closed"):
            await kv.watch().start()
        assert (await other.get("k")).value == b"v"

    async def test_destroy_ends_watchers(self) -> None:
        kv = await self.open_kv()
        other = await self.open_kv(kv.bucket)
        async with other.watch() as watcher:
            assert await self.next_item(watcher) is None
            await kv.destroy()
            with pytest.raises(StopAsyncIteration):
                await self.next_item(watcher)
        with pytest.raises(BucketNotFoundError):
            await other.watch().start()

    async def test_stop_wakes_a_waiting_reader(self) -> None:
        kv = await self.open_kv()
        watcher = kv.watch(updates_only=True)
        assert await self.next_item(watcher) is None
        ended = anyio.Event()

        async def read() -> None:
            with pytest.raises(StopAsyncIteration):
                await anext(watcher)
            ended.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.sleep(0.01)
            await watcher.stop()
            with anyio.fail_after(self.watch_timeout):
                await ended.wait()

    async def test_writes_from_another_thread_reach_watcher(self) -> None:
        kv = await self.open_kv()
        bucket = kv.bucket

        async def write_elsewhere() -> None:
            writer = await connect("memory://", bucket)
            for i in range(20):
                await writer.put(f"t.{i}", b"%d" % i)
            await writer.close()

        async with kv.watch("t.>") as watcher:
            assert await self.next_item(watcher) is None
            await anyio.to_thread.run_sync(asyncio.run, write_elsewhere())
            entries = [await self.next_entry(watcher) for _ in range(20)]
        assert [e.key for e in entries] == [f"t.{i}" for i in range(20)]
        assert [e.revision for e in entries] == list(range(1, 21))

    async def test_cas_increments_from_many_threads(self) -> None:
        kv = await self.open_kv()
        await kv.put("counter", b"0")
        threads, tasks, rounds = 4, 4, 25
        await increment_from_threads(
            "memory://", kv.bucket, "counter", threads=threads, tasks=tasks, rounds=rounds
        )
        assert int((await kv.get("counter")).value) == threads * tasks * rounds


# ------------------------------------------------------------------------- connect


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["redis://localhost", "memory", "", "/tmp/kv"])
async def test_unknown_urls_rejected(url: str) -> None:
    with pytest.raises(KVError, match="unsupported KV URL"):
        await connect(url, "bucket")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ---------------------------------------------------------------- key-token helpers


@pytest.mark.parametrize(
    ("name", "token"),
    [
        ("fetch_users", "fetch_users"),
        ("Fetch-2", "Fetch-2"),
        ("fetch.users", "fetch=2Eusers"),
        ("a/b", "a=2Fb"),
        ("x=y", "x=3Dy"),
        ("with space", "with=20space"),
        ("a:b", "a=3Ab"),
        ("é", "=C3=A9"),
        (">", "=3E"),
        ("*", "=2A"),
    ],
)
def test_encode_key_token(name: str, token: str) -> None:
    assert encode_key_token(name) == token
    assert decode_key_token(token) == name


@pytest.mark.parametrize("name", ["a.b.c", "..", "_kv", "émoji 🚀", "=2E", "step/1=2", "x" * 300])
def test_encoded_tokens_are_single_valid_tokens(name: str) -> None:
    token = encode_key_token(name)
    assert "." not in token
    validate_key(f"exec.1.loop.{token}.0.r.3")
    assert decode_key_token(token) == name


def test_encode_key_token_is_injective_on_tricky_pairs() -> None:
    names = ["a.b", "a=2Eb", "a_b", "a-b", "a/b", "a=b", "A.b"]
    assert len({encode_key_token(n) for n in names}) == len(names)


def test_encode_empty_name_rejected() -> None:
    with pytest.raises(InvalidKeyError):
        encode_key_token("")


@pytest.mark.parametrize("token", ["=", "=4", "=ZZ", "a=+1", "=C3"])
def test_decode_rejects_malformed_tokens(token: str) -> None:
    with pytest.raises(InvalidKeyError):
        decode_key_token(token)
