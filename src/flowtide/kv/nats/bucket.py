"""The bucket handle: `NatsKeyValue`, the KV port's operations over JetStream (writes
and their compare-and-set errors, Direct Get and stream-leader reads, paging of
get_last_many), and `open_nats`, which binds a bucket on a pooled connection.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

from nats.aio.msg import Msg

from flowtide.kv.base import (
    BucketConfig,
    Entry,
    KeyExistsError,
    KeyFilter,
    KeyNotFoundError,
    KVError,
    Operation,
    Status,
    ValueTooLargeError,
    WrongRevisionError,
    as_bytes,
    validate_key,
)
from flowtide.kv.nats.connection import _acquire
from flowtide.kv.nats.consumers import _BoundBucket
from flowtide.kv.nats.protocol import (
    _ERR_MESSAGE_TOO_LARGE,
    _ERR_NO_MESSAGE,
    _HDR_EXPECTED_LAST,
    _HDR_OPERATION,
    _HDR_ROLLUP,
    _WRONG_LAST_RE,
    _WRONG_LAST_SEQUENCE,
    DEFAULT_TIMEOUT,
    _ApiError,
    _Delivery,
    _NoResponders,
    _num_pending,
    _operation,
    _parse_header_block,
    _parse_ts,
    _reduce,
    _status,
    _Stored,
    _TooLarge,
    _WrongLast,
)
from flowtide.kv.nats.streams import _bind_bucket, _bucket_info
from flowtide.kv.nats.watcher import NatsWatcher
from flowtide.natsauth import NatsAuth

_MULTI_LAST_MAX: Final = 1024
_BATCH_MAX: Final = 1000
_CREATE_ATTEMPTS: Final = 10


async def open_nats(
    url: str,
    config: BucketConfig,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    create: bool = True,
    auth: NatsAuth | None = None,
) -> NatsKeyValue:
    """Open bucket `config.bucket` on the NATS server at `url`, creating it if missing
    (unless `create` is False: then a missing bucket is BucketNotFoundError).

    An existing bucket is bound as it is (its configuration was fixed at creation).

    Args:
        url: `nats://`, `tls://`, `ws://` or `wss://` URL, optionally `user:password@`
            (or `token@`); several servers separated by commas.
        config: the validated bucket configuration, used only to create the bucket.
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
        info = await _bind_bucket(conn, config, timeout, create)
    except BaseException:
        await conn.release()
        raise
    handle = NatsKeyValue(conn, info, timeout)
    conn.handles.add(handle)
    return handle


class NatsKeyValue(_BoundBucket):
    """A handle on a JetStream KV bucket; implements `flowtide.kv.KeyValue`, whose
    docstrings hold the contract of each method (the package's docstring says how it
    maps onto JetStream). Every method may also raise KVError when the server cannot be
    reached (no reply within the timeout)."""

    def __repr__(self) -> str:
        return f"NatsKeyValue(bucket={self._info.bucket!r}, url={self._conn.shown!r})"

    # -- plumbing

    def _check_size(self, key: str, value: bytes) -> None:
        limit = self._info.max_value_size
        if limit is not None and len(value) > limit:
            raise ValueTooLargeError(self.bucket, key, size=len(value), max_size=limit)

    async def _direct_many(self, what: str, body: dict[str, Any]) -> tuple[list[Msg], Msg]:
        try:
            return await self._conn.request_many(
                f"$JS.API.DIRECT.GET.{self._stream}", body, timeout=self._timeout
            )
        except _NoResponders:
            raise await self._missing_or(what) from None
        except KVError as exc:
            exc.bucket = self.bucket
            raise

    def _direct_entry(self, msg: Msg, delta: int) -> Entry:
        headers = msg.headers or {}
        op = _operation(headers)
        return Entry(
            self.bucket,
            headers.get("Nats-Subject", "")[len(self._prefix) :],
            msg.data if op is Operation.PUT else b"",
            int(headers.get("Nats-Sequence") or 0),
            _parse_ts(headers.get("Nats-Time-Stamp", "")),
            delta,
            op,
        )

    def _direct_failure(self, what: str, end: Msg) -> KVError:
        headers = end.headers or {}
        # nats-py keys the status description by an enum member, not the plain string.
        desc = headers.get("Description") or next(
            (v for k, v in headers.items() if str(k).lower().endswith("description")), ""
        )
        return KVError(
            f"{what} in bucket {self.bucket!r}: Direct Get answered {_status(end)} {desc}".rstrip(),
            bucket=self.bucket,
        )

    async def _publish(self, key: str, value: bytes, headers: dict[str, str] | None) -> int:
        try:
            msg = await self._conn.request(
                self._prefix + key, value, timeout=self._timeout, headers=headers
            )
        except _NoResponders:
            raise await self._missing_or(f"write to {key!r}") from None
        except _TooLarge:
            limit = self._conn.client.max_payload
            raise ValueTooLargeError(self.bucket, key, size=len(value), max_size=limit) from None
        except KVError as exc:
            exc.bucket = self.bucket
            raise
        try:
            ack = json.loads(msg.data)
        except ValueError:
            raise KVError(f"unreadable JetStream ack for {key!r}", bucket=self.bucket) from None
        error = ack.get("error")
        if not error:
            return int(ack["seq"])
        api = _ApiError(error)
        if api.err_code in _WRONG_LAST_SEQUENCE:
            # 10071 carries the subject's last sequence; 10164 (clustered) does not.
            m = _WRONG_LAST_RE.search(api.description)
            raise _WrongLast(int(m.group(1)) if m else None)
        if api.err_code == _ERR_MESSAGE_TOO_LARGE:
            max_size = self._info.max_value_size or self._conn.client.max_payload
            raise ValueTooLargeError(self.bucket, key, size=len(value), max_size=max_size)
        raise KVError(
            f"JetStream refused the write to {key!r} in bucket {self.bucket!r}: {api}",
            bucket=self.bucket,
            key=key,
        )

    async def _msg_get(self, body: dict[str, Any]) -> _Stored | None:
        """A stored message through the stream leader (`$JS.API.STREAM.MSG.GET`):
        read-after-write, unlike Direct Get, and available without allow_direct."""
        reply = await self._stream_api(
            "read", f"$JS.API.STREAM.MSG.GET.{self._stream}", body, none_on=_ERR_NO_MESSAGE
        )
        if reply is None:
            return None
        message = reply["message"]
        hdrs = message.get("hdrs")
        data = message.get("data")
        return _Stored(
            subject=str(message["subject"]),
            revision=int(message["seq"]),
            headers=_parse_header_block(base64.b64decode(hdrs)) if hdrs else None,
            value=base64.b64decode(data) if data else b"",
            created=_parse_ts(str(message.get("time") or "")),
        )

    def _stored_entry(self, stored: _Stored, delta: int) -> Entry:
        op = _operation(stored.headers)
        return Entry(
            self.bucket,
            stored.subject[len(self._prefix) :],
            stored.value if op is Operation.PUT else b"",
            stored.revision,
            stored.created,
            delta,
            op,
        )

    async def _leader_last(self, key: str) -> tuple[int, Operation] | None:
        """The newest message of `key` as the stream leader sees it (read-after-write)."""
        stored = await self._msg_get({"last_by_subj": self._prefix + key})
        if stored is None:
            return None
        return stored.revision, _operation(stored.headers)

    async def _current_revision(self, key: str) -> int:
        last = await self._leader_last(key)
        return last[0] if last is not None else 0

    # -- the port

    async def get(self, key: str, revision: int | None = None) -> Entry:
        """See `KeyValue.get`. A Direct Get (a batch of one from `revision` for an older
        revision); without allow_direct, `$JS.API.STREAM.MSG.GET` on the stream leader
        (and for an older revision a consumer's pending count as `delta`)."""
        validate_key(key, bucket=self.bucket)
        self._check()
        if revision is not None and revision < 1:
            raise KeyNotFoundError(self.bucket, key, revision=revision)
        if self._info.direct:
            entry = await self._get_direct(key, revision)
        else:
            entry = await self._get_from_leader(key, revision)
        if entry is None:
            raise KeyNotFoundError(self.bucket, key, revision=revision)
        if entry.operation is not Operation.PUT:
            raise KeyNotFoundError(self.bucket, key, revision=revision, operation=entry.operation)
        return entry

    async def _get_direct(self, key: str, revision: int | None) -> Entry | None:
        subject = self._prefix + key
        if revision is None:
            try:
                msg = await self._conn.request(
                    f"$JS.API.DIRECT.GET.{self._stream}.{subject}", timeout=self._timeout
                )
            except _NoResponders:
                raise await self._missing_or(f"get {key!r}") from None
            except KVError as exc:
                exc.bucket = self.bucket
                raise
            status = _status(msg)
            if status == "404":
                return None
            if status is not None:
                raise self._direct_failure(f"get {key!r}", msg)
            return self._direct_entry(msg, 0)
        # A batch of one from `revision` on the key's subject: the message is ours when
        # its sequence is `revision`, and its pending count is the delta.
        msgs, end = await self._direct_many(
            f"get {key!r}", {"seq": revision, "next_by_subj": subject, "batch": 1}
        )
        if _status(end) not in ("204", "404"):
            raise self._direct_failure(f"get {key!r}", end)
        if not msgs or int((msgs[0].headers or {}).get("Nats-Sequence") or 0) != revision:
            return None
        return self._direct_entry(msgs[0], _num_pending(msgs[0]))

    async def _get_from_leader(self, key: str, revision: int | None) -> Entry | None:
        subject = self._prefix + key
        if revision is None:
            stored = await self._msg_get({"last_by_subj": subject})
            return None if stored is None else self._stored_entry(stored, 0)
        stored = await self._msg_get({"seq": revision})
        if stored is None or stored.subject != subject:
            return None
        return self._stored_entry(stored, await self._count_from(key, revision + 1))

    async def _count_from(self, key: str, start: int) -> int:
        """How many messages of `key` have a revision >= `start`: the pending count of a
        consumer nobody reads from."""
        nc = self._conn.client
        info = await self._create_consumer(
            nc.new_inbox(), (key,), policy="by_start_sequence", start_seq=start, headers_only=True
        )
        self._drop_consumer(None, str(info["name"]))
        return int(info.get("num_pending") or 0)

    async def put(self, key: str, value: bytes) -> int:
        """See `KeyValue.put`. ValueTooLargeError also when the message exceeds the
        server's max_payload."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        self._check()
        return await self._publish(key, data, None)

    async def create(self, key: str, value: bytes) -> int:
        """See `KeyValue.create`. A write expecting last subject sequence 0, or the
        revision of the key's newest message when that is a marker; KVError when the key
        kept changing under ten attempts in a row."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        self._check()
        last = 0
        for _ in range(_CREATE_ATTEMPTS):
            try:
                return await self._publish(key, data, {_HDR_EXPECTED_LAST: str(last)})
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

    async def update(self, key: str, value: bytes, last: int) -> int:
        """See `KeyValue.update`. WrongRevisionError's `current` is the revision the stream
        leader sees right after the refusal."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        self._check()
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
        headers = {_HDR_OPERATION: "DEL"}
        if last is None:
            await self._publish(key, b"", headers)
        else:
            await self._conditional(key, b"", headers, last)

    async def purge(self, key: str) -> None:
        """See `KeyValue.purge`. A PURGE marker with `Nats-Rollup: sub`."""
        validate_key(key, bucket=self.bucket)
        self._check()
        await self._publish(key, b"", {_HDR_OPERATION: "PURGE", _HDR_ROLLUP: "sub"})

    async def purge_all(self, filter: str | Sequence[str]) -> int:
        """See `KeyValue.purge_all`. One `$JS.API.STREAM.PURGE` request per filter
        (filters covered by another one are dropped first), however many keys match;
        returns how many messages the server removed."""
        wanted = KeyFilter(filter, bucket=self.bucket)
        self._check()
        removed = 0
        for pattern in _reduce(wanted.filters):
            reply = await self._stream_api(
                "purge_all",
                f"$JS.API.STREAM.PURGE.{self._stream}",
                {"filter": self._prefix + pattern},
            )
            removed += int(reply.get("purged") or 0)
        return removed

    async def history(self, key: str) -> list[Entry]:
        """See `KeyValue.history`. Direct Get batches; without allow_direct, an ordered
        consumer."""
        validate_key(key, bucket=self.bucket)
        self._check()
        if not self._info.direct:
            found = await self._scan((key,), policy="all", values=True)
            if not found:
                raise KeyNotFoundError(self.bucket, key)
            return [self._delivery_entry(d, d.pending) for d in found]
        subject = self._prefix + key
        entries: list[Entry] = []
        seq = 1
        while True:
            msgs, end = await self._direct_many(
                f"history of {key!r}", {"seq": seq, "next_by_subj": subject, "batch": _BATCH_MAX}
            )
            status = _status(end)
            if status == "404":
                break
            if status != "204":
                raise self._direct_failure(f"history of {key!r}", end)
            entries.extend(self._direct_entry(m, _num_pending(m)) for m in msgs)
            # The server may stop a batch early (max bytes); the EOB says what is left.
            if not msgs or _num_pending(end) == 0:
                break
            seq = entries[-1].revision + 1
        if not entries:
            raise KeyNotFoundError(self.bucket, key)
        return entries

    async def keys(self, filter: str | Sequence[str] = ">") -> list[str]:
        """See `KeyValue.keys`. A headers-only ordered consumer delivering the last message
        per subject."""
        wanted = KeyFilter(filter, bucket=self.bucket)
        self._check()
        found = await self._scan(_reduce(wanted.filters), policy="last_per_subject")
        return sorted(d.key for d in found if d.operation is Operation.PUT)

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

    async def get_last_many(
        self, filters: str | Sequence[str], up_to_revision: int | None = None
    ) -> dict[str, Entry]:
        """See `KeyValue.get_last_many`. More than 1024 matching keys are read in pages of
        1024 subjects, all at the same stream sequence."""
        wanted = KeyFilter(filters, bucket=self.bucket)
        if up_to_revision is not None and up_to_revision < 0:
            raise KVError(f"up_to_revision must be >= 0, got {up_to_revision}", bucket=self.bucket)
        self._check()
        # up_to_seq 0 would mean "unset" to the server.
        if up_to_revision == 0:
            return {}
        reduced = _reduce(wanted.filters)
        if not self._info.direct:
            entries = await self._last_many_by_scan(reduced, up_to_revision)
            entries.sort(key=lambda e: e.key)
            return {e.key: e for e in entries}
        subjects = [self._prefix + f for f in reduced]
        body: dict[str, Any] = {"multi_last": subjects}
        if up_to_revision is not None:
            body["up_to_seq"] = up_to_revision
        msgs, end = await self._direct_many("get_last_many", body)
        status = _status(end)
        if status == "404":
            msgs = []
        elif status == "413" or (status == "204" and _num_pending(end) > 0):
            msgs = await self._last_many_paged(subjects, up_to_revision)
        elif status != "204":
            raise self._direct_failure("get_last_many", end)
        entries = [
            e for e in (self._direct_entry(m, 0) for m in msgs) if e.operation is Operation.PUT
        ]
        if up_to_revision is not None and entries:
            newer = Counter(
                d.key
                for d in await self._scan(
                    reduced, policy="by_start_sequence", start_seq=up_to_revision + 1
                )
            )
            entries = [
                Entry(e.bucket, e.key, e.value, e.revision, e.created, newer[e.key], e.operation)
                for e in entries
            ]
        entries.sort(key=lambda e: e.key)
        return {e.key: e for e in entries}

    async def _last_many_by_scan(self, filters: Sequence[str], up_to: int | None) -> list[Entry]:
        """get_last_many for a bucket without Direct Get: one ordered consumer."""
        if up_to is None:
            found = await self._scan(filters, policy="last_per_subject", values=True)
            return [self._delivery_entry(d, 0) for d in found if d.operation is Operation.PUT]
        last: dict[str, _Delivery] = {}
        newer: Counter[str] = Counter()
        for d in await self._scan(filters, policy="all", values=True):
            if d.revision <= up_to:
                last[d.key] = d
            else:
                newer[d.key] += 1
        return [
            self._delivery_entry(d, newer[key])
            for key, d in last.items()
            if d.operation is Operation.PUT
        ]

    async def _last_many_paged(self, subjects: list[str], up_to: int | None) -> list[Msg]:
        listed: set[str] = set()
        point = up_to
        for subject in subjects:
            offset = 0
            while True:
                reply = await self._stream_api(
                    "get_last_many",
                    f"$JS.API.STREAM.INFO.{self._stream}",
                    {"subjects_filter": subject, "offset": offset},
                )
                state = reply.get("state") or {}
                if point is None:
                    # Fix the point in time before listing, so every page reads the same.
                    point = int(state.get("last_seq") or 0)
                page = state.get("subjects") or {}
                listed.update(page)
                offset += len(page)
                if not page or offset >= int(reply.get("total") or 0):
                    break
        if not listed or not point:
            return []
        ordered = sorted(listed)
        out: list[Msg] = []
        size = _MULTI_LAST_MAX
        i = 0
        while i < len(ordered):
            part = ordered[i : i + size]
            msgs, end = await self._direct_many(
                "get_last_many", {"multi_last": part, "up_to_seq": point}
            )
            status = _status(end)
            if status == "413" or (status == "204" and _num_pending(end) > 0):
                # Cut short by the server's byte limit: ask for fewer keys at a time.
                if size == 1:
                    raise self._direct_failure("get_last_many", end)
                size = max(1, size // 2)
                continue
            if status not in ("204", "404"):
                raise self._direct_failure("get_last_many", end)
            out.extend(msgs)
            i += len(part)
        return out

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
