"""The reads of a bucket handle: Direct Get (single, batch and multi-last requests,
ADR-31) and, for a bucket without allow_direct or where read-after-write matters, the
stream leader (`$JS.API.STREAM.MSG.GET`); get, history, keys and get_last_many (paged
when more than 1024 keys match). `NatsKeyValue` (`bucket`) adds the writes.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

from nats.aio.msg import Msg

from flowtide.kv.base import (
    Entry,
    KeyFilter,
    KeyNotFoundError,
    KVError,
    Operation,
    validate_key,
)
from flowtide.kv.nats.consumers import _BoundBucket
from flowtide.kv.nats.protocol import (
    _ERR_NO_MESSAGE,
    _Delivery,
    _NoResponders,
    _num_pending,
    _operation,
    _parse_header_block,
    _parse_ts,
    _reduce,
    _status,
    _Stored,
)

_MULTI_LAST_MAX: Final = 1024
_BATCH_MAX: Final = 1000


class _BucketReads(_BoundBucket):
    """The reading half of `NatsKeyValue`: the port's reads, and the stream-leader reads
    its compare-and-set errors use."""

    # -- plumbing

    async def _direct_many(self, what: str, body: dict[str, Any]) -> tuple[list[Msg], Msg]:
        try:
            return await self._conn.request_many(
                f"$JS.API.DIRECT.GET.{self._direct_stream}", body, timeout=self._timeout
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
                    f"$JS.API.DIRECT.GET.{self._direct_stream}.{subject}", timeout=self._timeout
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
