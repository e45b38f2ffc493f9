"""The bucket handle: `NatsKeyValue`, the KV port's operations over JetStream (its reads
are `reads`; here the writes and their compare-and-set errors, watch, status, destroy,
close), and `open_nats`, which binds a bucket on a pooled connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Final

from nats.aio.msg import Msg

from flowtide.kv.base import (
    BucketConfig,
    BucketFullError,
    BucketNotFoundError,
    CreateManyError,
    KeyExistsError,
    KeyFilter,
    KVError,
    Operation,
    ReadOnlyBucketError,
    Status,
    ValueTooLargeError,
    WrongRevisionError,
    as_bytes,
    prepare_creates,
    validate_key,
)
from flowtide.kv.errors import KVUnavailableError
from flowtide.kv.nats.connection import _acquire
from flowtide.kv.nats.pipeline import request_pipelined
from flowtide.kv.nats.protocol import (
    _ERR_MAX_BYTES,
    _ERR_MESSAGE_TOO_LARGE,
    _ERR_MSG_TTL_DISABLED,
    _HDR_EXPECTED_LAST,
    _HDR_OPERATION,
    _HDR_ROLLUP,
    _HDR_TTL,
    _WRONG_LAST_RE,
    _WRONG_LAST_SEQUENCE,
    DEFAULT_TIMEOUT,
    _ApiError,
    _NoResponders,
    _reduce,
    _TooLarge,
    _WrongLast,
)
from flowtide.kv.nats.reads import _BucketReads
from flowtide.kv.nats.streams import _bind_bucket, _bucket_info
from flowtide.kv.nats.watcher import NatsWatcher
from flowtide.kv.options import check_value_ttl
from flowtide.natsauth import NatsAuth

_CREATE_ATTEMPTS: Final = 10
#: Seconds a write nobody answered is sent again while its bucket exists (_publish).
_NO_RESPONDER_WAIT: Final = 2.0
#: JetStream's "temporarily unavailable" (no leader yet): not applied, may be sent again.
_UNAVAILABLE: Final = frozenset({10008})
# create_many: acks outstanding at a time on the connection (and leader reads at a time).
_PIPELINE_WINDOW: Final = 256


async def open_nats(
    url: str,
    config: BucketConfig,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    create: bool = True,
    apply: frozenset[str] | None = None,
    auth: NatsAuth | None = None,
) -> NatsKeyValue:
    """Open bucket `config.bucket` on the NATS server at `url`, creating it if missing
    (unless `create` is False: then a missing bucket is BucketNotFoundError).

    An existing bucket is bound as it is, unless `apply` names settings: those of
    `config` that differ are changed with `$JS.API.STREAM.UPDATE` (see `connect`).

    Args:
        url: `nats://`, `tls://`, `ws://` or `wss://` URL, optionally `user:password@`
            (or `token@`); several servers separated by commas.
        config: the validated bucket configuration, used to create the bucket (and to
            change the settings `apply` names).
        apply: the settings to change on an existing bucket (those the caller passed).
        timeout: seconds to wait for each server reply.
        auth: credentials for a URL without them (user/password or a .creds file).
    Returns:
        A handle on the bucket.
    Raises:
        KVError: the server cannot be reached or refuses the credentials (the message
            names the URL without its password), JetStream is not enabled, or the
            bucket cannot be created or the stream is not a KV bucket.
    """
    conn = await _acquire(url, auth if auth is not None else NatsAuth())
    try:
        info = await _bind_bucket(conn, config, timeout, create, apply)
    except BaseException:
        await conn.release()
        raise
    handle = NatsKeyValue(conn, info, timeout)
    conn.handles.add(handle)
    return handle


class NatsKeyValue(_BucketReads):
    """A handle on a JetStream KV bucket; implements `flowtide.kv.KeyValue`, whose
    docstrings hold the contract of each method (the package's docstring says how it
    maps onto JetStream). Every method may also raise KVError when the server cannot be
    reached (no reply within the timeout)."""

    def __repr__(self) -> str:
        return f"NatsKeyValue(bucket={self._info.bucket!r}, url={self._conn.shown!r})"

    # -- plumbing

    def _check_writable(self, key: str | None) -> None:
        if self._info.mirror is not None:
            raise ReadOnlyBucketError(self.bucket, key, origin=self._info.mirror)

    @staticmethod
    def _ttl_header(ttl: float | None) -> dict[str, str]:
        # Go duration in milliseconds: JetStream reads whole seconds or a duration.
        return {} if ttl is None else {_HDR_TTL: f"{round(ttl * 1000)}ms"}

    def _check_size(self, key: str, value: bytes) -> None:
        limit = self._info.max_value_size
        if limit is not None and len(value) > limit:
            raise ValueTooLargeError(self.bucket, key, size=len(value), max_size=limit)

    def _too_large(self, key: str, value: bytes) -> ValueTooLargeError:
        limit = self._conn.client.max_payload
        return ValueTooLargeError(self.bucket, key, size=len(value), max_size=limit)

    async def _publish(self, key: str, value: bytes, headers: dict[str, str] | None) -> int:
        # No responders: the write reached nobody (safe to send again). A bucket that
        # exists gets it for a moment after its creation (its subjects reach every node
        # of a cluster a little later) or while it elects a leader: sent again for up
        # to _NO_RESPONDER_WAIT seconds; a bucket that is gone says so at once.
        deadline = time.monotonic() + _NO_RESPONDER_WAIT
        while True:
            try:
                msg = await self._conn.request(
                    self._prefix + key, value, timeout=self._timeout, headers=headers
                )
                break
            except _NoResponders:
                missing = await self._missing_or(f"write to {key!r}")
                if not isinstance(missing, KVUnavailableError) or time.monotonic() > deadline:
                    raise missing from None
            except _TooLarge:
                raise self._too_large(key, value) from None
            except KVError as exc:
                exc.bucket = self.bucket
                raise
            await asyncio.sleep(0.1)
        return self._ack(key, value, msg)

    def _ack(self, key: str, value: bytes, msg: Msg) -> int:
        """The revision a JetStream publish ack gives; raises _WrongLast for a lost
        compare-and-set, the port's errors otherwise."""
        try:
            ack = json.loads(msg.data)
        except ValueError:
            raise KVError(
                f"unreadable JetStream ack for {key!r}", bucket=self.bucket, key=key
            ) from None
        error = ack.get("error")
        if not error:
            return int(ack["seq"])
        api = _ApiError(error)
        if api.err_code in _WRONG_LAST_SEQUENCE:
            # 10071 carries the subject's last sequence; 10164 (clustered) does not.
            m = _WRONG_LAST_RE.search(api.description)
            raise _WrongLast(int(m.group(1)) if m else None)
        if api.err_code == _ERR_MAX_BYTES:
            raise BucketFullError(self.bucket, key, max_bytes=self._info.max_bytes)
        if api.err_code == _ERR_MSG_TTL_DISABLED:
            check_value_ttl(self.bucket, key, 1.0, None)
        if api.err_code == _ERR_MESSAGE_TOO_LARGE:
            max_size = self._info.max_value_size or self._conn.client.max_payload
            raise ValueTooLargeError(self.bucket, key, size=len(value), max_size=max_size)
        kind = KVUnavailableError if api.err_code in _UNAVAILABLE else KVError
        raise kind(
            f"JetStream refused the write to {key!r} in bucket {self.bucket!r}: {api}",
            bucket=self.bucket,
            key=key,
        )

    # -- the port

    async def put(self, key: str, value: bytes) -> int:
        """See `KeyValue.put`. ValueTooLargeError also when the message exceeds the
        server's max_payload."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        self._check()
        self._check_writable(key)
        return await self._publish(key, data, None)

    async def create(self, key: str, value: bytes, ttl: float | None = None) -> int:
        """See `KeyValue.create`. A write expecting last subject sequence 0, or the
        revision of the key's newest message when that is a marker; KVError when the key
        kept changing under ten attempts in a row. `ttl` is sent as `Nats-TTL`."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        self._check()
        self._check_writable(key)
        check_value_ttl(self.bucket, key, ttl, self._info.limit_marker_ttl)
        extra = self._ttl_header(ttl)
        last = 0
        for _ in range(_CREATE_ATTEMPTS):
            try:
                return await self._publish(key, data, {**extra, _HDR_EXPECTED_LAST: str(last)})
            except _WrongLast:
                # ADR-8: a key whose newest message is a marker may be re-created, with
                # the marker's revision as the expected last one.
                newest = await self._leader_last(key)
                if newest is None:
                    last = 0
                elif newest[1] is Operation.PUT:
                    raise KeyExistsError(self.bucket, key, revision=newest[0]) from None
                else:
                    last = newest[0]
        raise KVError(
            f"create of {key!r} in bucket {self.bucket!r} lost {_CREATE_ATTEMPTS} races "
            "against deletes and re-creates in a row",
            bucket=self.bucket,
            key=key,
        )

    async def create_many(self, items: Sequence[tuple[str, bytes]]) -> list[int | None]:
        """See `KeyValue.create_many`. Rounds of pipelined publishes on the handle's
        connection (at most 256 acks outstanding), each expecting last subject sequence
        0 in the first round. For an item refused with "wrong last sequence" the stream
        leader's newest message of its key decides, as for `create`: a PUT makes the
        item None, a marker sends it again in the next round expecting the marker's
        revision. An item still refused after ten rounds fails (CreateManyError)."""
        wanted = prepare_creates(
            items, bucket=self.bucket, max_value_size=self._info.max_value_size
        )
        self._check()
        self._check_writable(None)
        pairs = {i: item for i, item in enumerate(wanted) if item is not None}
        results: list[int | None] = [None] * len(wanted)
        errors: dict[int, KVError] = {}
        # A 503 (no stream behind the subject) is the same for every item: asked once.
        missing: KVError | None = None
        expected = dict.fromkeys(pairs, 0)
        for _ in range(_CREATE_ATTEMPTS):
            if not expected:
                break
            order = list(expected)
            try:
                replies = await request_pipelined(
                    self._conn,
                    [
                        (self._prefix + pairs[i][0], pairs[i][1], {_HDR_EXPECTED_LAST: str(last)})
                        for i, last in expected.items()
                    ],
                    timeout=self._timeout,
                    window=_PIPELINE_WINDOW,
                )
            except KVError as exc:
                exc.bucket = self.bucket
                raise
            refused: list[int] = []
            for i, reply in zip(order, replies, strict=True):
                key, data = pairs[i]
                try:
                    if isinstance(reply, Exception):
                        raise reply
                    results[i] = self._ack(key, data, reply)
                except _WrongLast:
                    refused.append(i)
                except _NoResponders:
                    missing = missing or await self._missing_or(f"write to {key!r}")
                    errors[i] = missing
                except _TooLarge:
                    errors[i] = self._too_large(key, data)
                except KVError as exc:
                    exc.bucket = self.bucket
                    exc.key = exc.key or key
                    errors[i] = exc
            expected = {}
            newest = await self._leader_lasts([pairs[i][0] for i in refused])
            for i, last in zip(refused, newest, strict=True):
                if isinstance(last, KVError):
                    last.key = last.key or pairs[i][0]
                    errors[i] = last
                elif last is None:
                    expected[i] = 0  # purged since: no message left
                elif last[1] is not Operation.PUT:
                    # ADR-8: a key whose newest message is a marker may be re-created.
                    expected[i] = last[0]
        for i in expected:
            errors[i] = KVError(
                f"create of {pairs[i][0]!r} lost {_CREATE_ATTEMPTS} races against deletes "
                "and re-creates in a row",
                bucket=self.bucket,
                key=pairs[i][0],
            )
        if errors:
            gone = [e for e in errors.values() if isinstance(e, BucketNotFoundError)]
            if gone:
                raise gone[0]
            raise CreateManyError(self.bucket, results, errors, len(wanted)) from errors[
                min(errors)
            ]
        return results

    async def _leader_lasts(self, keys: list[str]) -> list[tuple[int, Operation] | None | KVError]:
        """`_leader_last` of each key, at most 256 requests outstanding."""
        limit = asyncio.Semaphore(_PIPELINE_WINDOW)

        async def one(key: str) -> tuple[int, Operation] | None | KVError:
            async with limit:
                try:
                    return await self._leader_last(key)
                except KVError as exc:
                    return exc

        return list(await asyncio.gather(*(one(k) for k in keys)))

    async def update(self, key: str, value: bytes, last: int) -> int:
        """See `KeyValue.update`. WrongRevisionError's `current` is the revision the stream
        leader sees right after the refusal."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        self._check()
        self._check_writable(key)
        return await self._conditional(key, data, None, last)

    async def _conditional(
        self, key: str, data: bytes, headers: dict[str, str] | None, last: int
    ) -> int:
        if last < 0:
            current = await self._current_revision(key)
            raise WrongRevisionError(self.bucket, key, expected=last, current=current)
        try:
            return await self._publish(
                key, data, {**(headers or {}), _HDR_EXPECTED_LAST: str(last)}
            )
        except _WrongLast as exc:
            if exc.current is not None:
                current = exc.current
            else:
                # 10164: another write to the key was in flight on the cluster; give the
                # leader a moment to apply it so `current` says where the key went.
                current = await self._current_revision(key)
                for _ in range(2):
                    if current != last:
                        break
                    await asyncio.sleep(0.005)
                    current = await self._current_revision(key)
            raise WrongRevisionError(self.bucket, key, expected=last, current=current) from None

    async def delete(self, key: str, last: int | None = None) -> None:
        """See `KeyValue.delete`."""
        validate_key(key, bucket=self.bucket)
        self._check()
        self._check_writable(key)
        headers = {_HDR_OPERATION: "DEL"}
        if last is None:
            await self._publish(key, b"", headers)
        else:
            await self._conditional(key, b"", headers, last)

    async def purge(self, key: str, ttl: float | None = None) -> None:
        """See `KeyValue.purge`. A PURGE marker with `Nats-Rollup: sub` (and `Nats-TTL`
        for `ttl`)."""
        validate_key(key, bucket=self.bucket)
        self._check()
        self._check_writable(key)
        check_value_ttl(self.bucket, key, ttl, self._info.limit_marker_ttl)
        headers = {_HDR_OPERATION: "PURGE", _HDR_ROLLUP: "sub", **self._ttl_header(ttl)}
        await self._publish(key, b"", headers)

    async def purge_all(self, filter: str | Sequence[str]) -> int:
        """See `KeyValue.purge_all`. One `$JS.API.STREAM.PURGE` request per filter
        (filters covered by another one are dropped first), however many keys match;
        returns how many messages the server removed."""
        wanted = KeyFilter(filter, bucket=self.bucket)
        self._check()
        self._check_writable(None)
        removed = 0
        for pattern in _reduce(wanted.filters):
            reply = await self._stream_api(
                "purge_all",
                f"$JS.API.STREAM.PURGE.{self._stream}",
                {"filter": self._prefix + pattern},
            )
            removed += int(reply.get("purged") or 0)
        return removed

    def watch(
        self,
        keys: str | Sequence[str] = ">",
        *,
        include_history: bool = False,
        ignore_deletes: bool = False,
        meta_only: bool = False,
        updates_only: bool = False,
    ) -> NatsWatcher:
        """See `KeyValue.watch`; `meta_only` makes a headers-only consumer."""
        return NatsWatcher(
            self,
            KeyFilter(keys, bucket=self.bucket),
            include_history=include_history,
            ignore_deletes=ignore_deletes,
            meta_only=meta_only,
            updates_only=updates_only,
        )

    async def status(self) -> Status:
        """See `KeyValue.status`. `bytes` is the stream's byte count (headers and subjects
        included); `backing_store` is "JetStream"."""
        self._check()
        reply = await self._stream_api("status", f"$JS.API.STREAM.INFO.{self._stream}", None)
        info = _bucket_info(self.bucket, reply["config"])
        state = reply.get("state") or {}
        return Status(
            bucket=self.bucket,
            values=int(state.get("messages") or 0),
            history=info.history,
            ttl=info.ttl,
            max_value_size=info.max_value_size,
            storage=info.storage,
            replicas=info.replicas,
            compression=info.compression,
            bytes=int(state.get("bytes") or 0),
            backing_store="JetStream",
            max_bytes=info.max_bytes,
            placement=info.placement,
            republish=info.republish,
            mirror=info.mirror,
            sources=info.sources,
            limit_marker_ttl=info.limit_marker_ttl,
        )

    async def destroy(self) -> None:
        """See `KeyValue.destroy`. Handles and watchers sharing this handle's connection
        end at once; other handles find out on their next call, other watchers within a
        few heartbeats."""
        self._check()
        await self._stream_api("destroy", f"$JS.API.STREAM.DELETE.{self._stream}", None)
        for handle in list(self._conn.handles):
            if handle.bucket == self.bucket:
                handle._bucket_gone()

    async def close(self) -> None:
        """See `KeyValue.close`. The shared connection closes with its last handle."""
        if self._closed:
            return
        self._closed = True
        for watcher in list(self._watchers):
            watcher._finish()
        self._conn.handles.discard(self)
        await self._conn.release()
