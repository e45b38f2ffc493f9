"""What a bucket handle shares with its watchers: the handle's state checks, JetStream
API requests on the bucket's stream with their errors translated, and the ephemeral
ordered push consumers (flow control, idle heartbeats) that keys, history and
get_last_many scan through and that watchers follow.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from flowtide.kv.base import BucketNotFoundError, Entry, KVError, Operation
from flowtide.kv.errors import KVUnavailableError
from flowtide.kv.nats.connection import _Connection, _Watch
from flowtide.kv.nats.protocol import (
    _ERR_STREAM_NOT_FOUND,
    DEFAULT_TIMEOUT,
    _ApiError,
    _Delivery,
    _idle_after,
    _parse_delivery,
    _status,
)
from flowtide.kv.nats.streams import _BucketInfo

_HEARTBEAT: Final = 1.0
_CONSUMER_INACTIVE_NS: Final = 60 * 10**9
_SCAN_ATTEMPTS: Final = 3


@dataclass(slots=True)
class _Scan:
    done: asyncio.Future[bool]
    found: list[_Delivery] = field(default_factory=list)


class _BoundBucket:
    """A bucket bound on a pooled connection: the part of a handle (`NatsKeyValue`) that
    its watchers use too."""

    def __init__(
        self, conn: _Connection, info: _BucketInfo, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self._conn = conn
        self._info = info
        self._timeout = timeout
        self._prefix = info.prefix
        self._stream = info.stream
        # Reads use this stream's Direct Get subject (a mirror's origin, see _BucketInfo).
        self._direct_stream = info.direct_stream or info.stream
        self._closed = False
        self._destroyed = False
        self._watchers: weakref.WeakSet[_Watch] = weakref.WeakSet()

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._info.bucket

    # -- plumbing

    def _bucket_gone(self) -> None:
        """The bucket was destroyed through a handle on the same connection."""
        self._destroyed = True
        for watcher in list(self._watchers):
            watcher._finish()

    def _check(self) -> None:
        if self._closed:
            raise KVError(f"KV handle on bucket {self.bucket!r} is closed", bucket=self.bucket)
        if self._destroyed:
            raise BucketNotFoundError(self.bucket)
        if asyncio.get_running_loop() is not self._conn.loop:
            raise KVError(
                f"KV handle on bucket {self.bucket!r} used from another event loop than the "
                "one that opened it; open one handle per loop",
                bucket=self.bucket,
            )

    async def _missing_or(self, what: str) -> KVError:
        """The error for a request nobody answered: the bucket is gone, or not serving."""
        try:
            await self._conn.api(f"$JS.API.STREAM.INFO.{self._stream}", None, timeout=self._timeout)
        except _ApiError as exc:
            if exc.err_code == _ERR_STREAM_NOT_FOUND:
                return BucketNotFoundError(self.bucket)
            return KVError(f"{what} in bucket {self.bucket!r} failed: {exc}", bucket=self.bucket)
        # The stream exists and nobody answered: just created, or electing a leader.
        return KVUnavailableError(
            f"{what}: no JetStream responder for bucket {self.bucket!r} (it exists: just"
            " created, or electing a leader)",
            bucket=self.bucket,
        )

    async def _stream_api(
        self,
        what: str,
        subject: str,
        body: dict[str, Any] | None,
        *,
        none_on: int | None = None,
    ) -> Any:
        """A JetStream API request on this bucket's stream, its errors translated; None
        for the API error `none_on`."""
        try:
            return await self._conn.api(subject, body, timeout=self._timeout)
        except _ApiError as exc:
            if none_on is not None and exc.err_code == none_on:
                return None
            if exc.err_code == _ERR_STREAM_NOT_FOUND:
                raise BucketNotFoundError(self.bucket) from None
            raise KVError(
                f"{what} in bucket {self.bucket!r} failed: {exc}", bucket=self.bucket
            ) from None
        except KVError as exc:
            exc.bucket = self.bucket
            raise

    # -- ordered consumers

    async def _create_consumer(
        self,
        deliver_subject: str,
        filters: Sequence[str],
        *,
        policy: str,
        start_seq: int | None,
        headers_only: bool,
    ) -> dict[str, Any]:
        config: dict[str, Any] = {
            "deliver_subject": deliver_subject,
            "deliver_policy": policy,
            "ack_policy": "none",
            "max_deliver": 1,
            "replay_policy": "instant",
            "flow_control": True,
            "idle_heartbeat": int(_HEARTBEAT * 1e9),
            "headers_only": headers_only,
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": _CONSUMER_INACTIVE_NS,
        }
        subjects = [self._prefix + f for f in filters]
        if len(subjects) == 1:
            config["filter_subject"] = subjects[0]
        else:
            config["filter_subjects"] = subjects
        if policy == "by_start_sequence":
            config["opt_start_seq"] = start_seq
        reply: dict[str, Any] = await self._stream_api(
            "reading",
            f"$JS.API.CONSUMER.CREATE.{self._stream}",
            {"stream_name": self._stream, "config": config},
        )
        return reply

    def _drop_consumer(self, sub: Subscription | None, name: str | None) -> None:
        """Unsubscribe and delete an ephemeral consumer, in the background."""

        async def drop() -> None:
            if sub is not None:
                try:
                    await sub.unsubscribe()
                except nats.errors.Error:
                    pass
            if name is not None:
                try:
                    await self._conn.api(
                        f"$JS.API.CONSUMER.DELETE.{self._stream}.{name}", None, timeout=1.0
                    )
                except (KVError, _ApiError):
                    # It goes away by itself once inactive (inactive_threshold).
                    pass

        self._conn.spawn(drop())

    async def _scan(
        self,
        filters: Sequence[str],
        *,
        policy: str,
        start_seq: int | None = None,
        values: bool = False,
    ) -> list[_Delivery]:
        """Read a snapshot through an ordered consumer (headers only unless `values`),
        until its first message with nothing pending."""
        nc = self._conn.client
        for _ in range(_SCAN_ATTEMPTS):
            scan = _Scan(self._conn.loop.create_future())

            async def on_msg(msg: Msg, scan: _Scan = scan) -> None:
                if scan.done.done():
                    return
                status = _status(msg)
                if status == "100":
                    await self._answer_control(msg)
                    idle = _idle_after(msg, len(scan.found))
                    if idle is not None:
                        # Idle with everything delivered means messages counted as
                        # pending at creation expired or were purged since; idle
                        # after more than we got means one was lost.
                        scan.done.set_result(idle)
                    return
                delivery = _parse_delivery(msg, self._prefix) if status is None else None
                if delivery is None or delivery.dseq != len(scan.found) + 1:
                    # A gap (slow consumer) or an unexpected status: start again.
                    scan.done.set_result(False)
                    return
                scan.found.append(delivery)
                if delivery.pending == 0:
                    scan.done.set_result(True)

            sub = await nc.subscribe(nc.new_inbox(), cb=on_msg)
            name: str | None = None
            try:
                info = await self._create_consumer(
                    sub.subject,
                    filters,
                    policy=policy,
                    start_seq=start_seq,
                    headers_only=not values,
                )
                name = str(info["name"])
                if int(info.get("num_pending") or 0) == 0:
                    return []
                try:
                    await self._conn.wait_progress(scan.done, scan.found.__len__, self._timeout)
                except KVError as exc:
                    exc.bucket = self.bucket
                    raise
                if scan.done.result():
                    return scan.found
            finally:
                self._drop_consumer(sub, name)
        raise KVError(
            f"could not read a consistent snapshot of bucket {self.bucket!r} "
            f"in {_SCAN_ATTEMPTS} attempts",
            bucket=self.bucket,
        )

    def _delivery_entry(self, d: _Delivery, delta: int) -> Entry:
        value = d.value if d.operation is Operation.PUT else b""
        return Entry(self.bucket, d.key, value, d.revision, d.created, delta, d.operation)

    async def _answer_control(self, msg: Msg) -> None:
        """Answer a flow-control request or a stalled-consumer heartbeat."""
        nc = self._conn.client
        headers = msg.headers or {}
        if msg.reply:
            await nc.publish(msg.reply, b"")
        stalled = headers.get("Nats-Consumer-Stalled")
        if stalled:
            await nc.publish(stalled, b"")
