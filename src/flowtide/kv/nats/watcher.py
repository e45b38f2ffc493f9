"""`NatsWatcher`: a watch on a bucket, following one ordered push consumer and
re-creating it after a gap, missed heartbeats or a reconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from flowtide.kv.base import (
    END_OF_WATCH,
    BucketNotFoundError,
    Entry,
    KeyFilter,
    KVError,
    Operation,
    QueueWatcher,
)
from flowtide.kv.nats.consumers import _HEARTBEAT, _BoundBucket
from flowtide.kv.nats.protocol import _Delivery, _idle_after, _parse_delivery, _reduce, _status

# The adapter's one logger (see connection.py).
_log = logging.getLogger("flowtide.kv.nats")

_MISSED_HEARTBEATS: Final = 3
# A watcher answers the server's flow control only while its reader keeps up.
_FLOW_CONTROL_BACKLOG: Final = 4096


class NatsWatcher(QueueWatcher):
    """A watch on a JetStream KV bucket; implements `flowtide.kv.KeyWatcher`.

    An ordered push consumer: it is re-created from the revision after the last one
    delivered when a delivery is missing (a gap), heartbeats stop, or the connection
    comes back after an outage. Iteration ends on `stop()`, when the handle is closed,
    or when the bucket is gone.
    """

    def __init__(
        self,
        handle: _BoundBucket,
        keys: KeyFilter,
        *,
        include_history: bool,
        ignore_deletes: bool,
        meta_only: bool,
        updates_only: bool,
    ) -> None:
        super().__init__()
        self._handle = handle
        self._filters = _reduce(keys.filters)
        self._include_history = include_history
        self._ignore_deletes = ignore_deletes
        self._meta_only = meta_only
        self._updates_only = updates_only
        # With deletes filtered out here, the server's pending counts include entries
        # never delivered; initial data is held until the marker to number it exactly.
        self._held: list[Entry] | None = [] if ignore_deletes else None
        self._marker_queued = False
        self._ending = False
        self._gen = 0
        self._sub: Subscription | None = None
        self._consumer: str | None = None
        self._last_revision = 0
        self._next_dseq = 1
        self._last_seen = 0.0
        self._flow_reply: str | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._resetting: asyncio.Task[None] | None = None

    @property
    def _initial_policy(self) -> str:
        if self._updates_only:
            return "new"
        return "all" if self._include_history else "last_per_subject"

    async def start(self) -> None:
        """Create the consumer (idempotent).

        Raises:
            BucketNotFoundError: the bucket was destroyed.
            KVError: the handle is closed or the server cannot be reached.
        """
        if self._started or self._stopped:
            return
        handle = self._handle
        handle._check()
        self._started = True
        if self._updates_only:
            self._queue_marker()
        try:
            await self._open(self._initial_policy, None)
        except BaseException:
            self._stopped = True
            self._release()
            raise
        handle._watchers.add(self)
        handle._conn.watchers.add(self)
        self._monitor = handle._conn.loop.create_task(self._watch_heartbeats())

    async def _open(self, policy: str, start_seq: int | None) -> None:
        handle = self._handle
        nc = handle._conn.client
        self._gen += 1
        gen = self._gen

        async def on_msg(msg: Msg) -> None:
            await self._on_msg(msg, gen)

        sub = await nc.subscribe(nc.new_inbox(), cb=on_msg)
        self._sub = sub
        self._consumer = None
        self._next_dseq = 1
        self._last_seen = time.monotonic()
        try:
            info = await handle._create_consumer(
                sub.subject,
                self._filters,
                policy=policy,
                start_seq=start_seq,
                headers_only=self._meta_only,
            )
        except BaseException:
            if self._sub is sub:
                self._sub = None
            handle._drop_consumer(sub, None)
            raise
        if gen != self._gen:
            # Superseded (stopped or reset) while the server was answering.
            handle._drop_consumer(None, str(info["name"]))
            return
        self._consumer = str(info["name"])
        delivered = info.get("delivered") or {}
        self._last_revision = max(self._last_revision, int(delivered.get("stream_seq") or 0))
        if int(info.get("num_pending") or 0) == 0:
            self._queue_marker()

    async def _on_msg(self, msg: Msg, gen: int) -> None:
        if gen != self._gen or self._stopped or self._ending:
            return
        self._last_seen = time.monotonic()
        status = _status(msg)
        if status is not None:
            if status != "100":
                self._schedule_reset()
                return
            headers = msg.headers or {}
            if msg.reply:
                # Flow control: answer now while the reader keeps up, else when it has
                # caught up (__anext__), which is the back-pressure.
                if self._queue.qsize() < _FLOW_CONTROL_BACKLOG:
                    await self._publish(msg.reply)
                else:
                    self._flow_reply = msg.reply
                return
            stalled = headers.get("Nats-Consumer-Stalled")
            if stalled:
                await self._publish(stalled)
            idle = _idle_after(msg, self._next_dseq - 1)
            if idle is False:
                self._schedule_reset()
            elif idle and not self._marker_queued:
                # Initial data counted at creation that expired before delivery.
                self._queue_marker()
            return
        delivery = _parse_delivery(msg, self._handle._prefix)
        if delivery is None:
            return
        if delivery.dseq != self._next_dseq:
            self._schedule_reset()
            return
        self._next_dseq += 1
        self._last_revision = delivery.revision
        self._deliver(delivery)

    def _deliver(self, d: _Delivery) -> None:
        keep = not (self._ignore_deletes and d.operation is not Operation.PUT)
        if self._marker_queued:
            if keep:
                self._queue.put_nowait(self._entry(d, 0))
            return
        if keep:
            if self._held is not None:
                self._held.append(self._entry(d, 0))
            else:
                self._queue.put_nowait(self._entry(d, d.pending))
        if d.pending == 0:
            self._queue_marker()

    def _entry(self, d: _Delivery, delta: int) -> Entry:
        value = b"" if self._meta_only or d.operation is not Operation.PUT else d.value
        return Entry(self._handle.bucket, d.key, value, d.revision, d.created, delta, d.operation)

    def _queue_marker(self) -> None:
        if self._marker_queued:
            return
        self._marker_queued = True
        held, self._held = self._held or [], None
        total = len(held)
        for i, e in enumerate(held):
            self._queue.put_nowait(
                Entry(e.bucket, e.key, e.value, e.revision, e.created, total - i - 1, e.operation)
            )
        self._queue.put_nowait(None)

    async def _publish(self, subject: str) -> None:
        try:
            await self._handle._conn.client.publish(subject, b"")
        except (KVError, nats.errors.Error) as exc:
            _log.debug("watcher on %s could not answer %s: %s", self._handle.bucket, subject, exc)

    # -- recovery

    def _schedule_reset(self) -> None:
        if self._stopped or self._ending or not self._started:
            return
        if self._resetting is not None and not self._resetting.done():
            return
        # Ignore whatever the old consumer still delivers from now on.
        self._gen += 1
        self._resetting = self._handle._conn.loop.create_task(self._reset())

    async def _reset(self) -> None:
        handle = self._handle
        handle._drop_consumer(self._sub, self._consumer)
        self._sub = None
        self._consumer = None
        if self._marker_queued or self._last_revision > 0:
            policy, start = "by_start_sequence", self._last_revision + 1
        else:
            policy, start = self._initial_policy, None
        if handle._conn.closed:
            self._finish()
            return
        try:
            await self._open(policy, start)
        except BucketNotFoundError:
            self._finish()
        except KVError as exc:
            # The heartbeat monitor tries again.
            _log.debug("watcher on %s: re-creating its consumer failed: %s", handle.bucket, exc)

    async def _watch_heartbeats(self) -> None:
        while not (self._stopped or self._ending):
            await asyncio.sleep(_HEARTBEAT)
            if time.monotonic() - self._last_seen > _MISSED_HEARTBEATS * _HEARTBEAT:
                self._schedule_reset()

    # -- ending

    def _release(self) -> None:
        self._gen += 1
        current = asyncio.current_task()
        for task in (self._monitor, self._resetting):
            if task is not None and task is not current:
                task.cancel()
        self._monitor = self._resetting = None
        handle = self._handle
        if self._sub is not None or self._consumer is not None:
            handle._drop_consumer(self._sub, self._consumer)
        self._sub = None
        self._consumer = None
        handle._watchers.discard(self)
        handle._conn.watchers.discard(self)

    def _finish(self) -> None:
        """End iteration after the updates already queued (handle closed, bucket gone)."""
        if self._stopped or self._ending:
            return
        self._ending = True
        self._release()
        self._queue.put_nowait(END_OF_WATCH)

    async def __anext__(self) -> Entry | None:
        item = await super().__anext__()
        # The reader has caught up: answer the flow control held back (back-pressure).
        if self._flow_reply is not None and self._queue.qsize() < _FLOW_CONTROL_BACKLOG:
            reply, self._flow_reply = self._flow_reply, None
            await self._publish(reply)
        return item
