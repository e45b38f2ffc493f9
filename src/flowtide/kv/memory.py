"""In-process KV adapter with ADR-8 semantics (`memory://`).

Buckets live in a process-wide registry keyed by bucket name, so every `connect` to the
same name shares the data until `destroy()`. A bucket is used from the engine's event
loop and from worker threads that run their own loops, so its state sits behind one
`threading.Lock`; the methods are coroutines for the port's sake but never wait, except a
watcher waiting for the next update.

Watchers are bound to the event loop that starts them. Writes hand them entries with
`loop.call_soon_threadsafe` while still holding the bucket lock, so every watcher sees
updates in revision order whatever thread wrote them, and the snapshot of initial data
and the registration for live updates happen under the same lock (no gap, no duplicate).

TTL expiry is lazy: every operation first drops the messages older than the TTL (by the
monotonic clock), oldest revision first. As on JetStream, expiry does not notify
watchers, except with limit markers (`limit_marker_ttl`): a key whose last message
expired gets a PURGE marker, which watchers see when the next operation on the bucket
notices the expiry. A value created with its own TTL expires at that TTL only.

The other settings: `max_bytes` is enforced (counting key and value lengths, see
`memory_state.message_size`); `storage`, `replicas`, `compression`, `placement` and
`republish` are only reported by `status()`; mirrors and sourced buckets need NATS
(KVError). `connect(..., apply=True)` changes the settings passed explicitly
(`_Bucket.reconfigure`).
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from flowtide.kv.base import (
    END_OF_WATCH,
    BucketConfig,
    BucketFullError,
    BucketNotFoundError,
    CreateManyError,
    EndOfWatch,
    Entry,
    KeyExistsError,
    KeyFilter,
    KeyNotFoundError,
    KVError,
    Operation,
    QueueWatcher,
    Status,
    ValueTooLargeError,
    WrongRevisionError,
    as_bytes,
    prepare_creates,
    validate_key,
)
from flowtide.kv.memory_state import _Bucket
from flowtide.kv.options import check_value_ttl

__all__ = ["MemoryKeyValue", "MemoryWatcher", "open_memory"]


_REGISTRY: dict[str, _Bucket] = {}
# Lock order: _REGISTRY_LOCK before any bucket lock.
_REGISTRY_LOCK: Final = threading.Lock()


def open_memory(
    url: str,
    config: BucketConfig,
    *,
    create: bool = True,
    apply: frozenset[str] | None = None,
) -> MemoryKeyValue:
    """Open (creating it if needed, unless `create` is False: then a missing bucket is
    BucketNotFoundError) the in-process bucket `config.bucket`.

    An existing bucket is bound as it is, unless `apply` names settings: those of
    `config` that differ are changed (see `connect`).

    Args:
        url: the `memory://` URL (kept for repr only; all memory URLs share one registry).
        config: the validated bucket configuration.
        apply: the settings to change on an existing bucket (those the caller passed).
    Returns:
        A new handle on the bucket.
    Raises:
        KVError: a mirror or sourced bucket is asked for (NATS only), or a change
            cannot be applied.
    """
    with _REGISTRY_LOCK:
        state = _REGISTRY.get(config.bucket)
        if state is None:
            if not create:
                raise BucketNotFoundError(config.bucket)
            if config.mirror is not None or config.sources:
                raise KVError(
                    "memory:// buckets live inside one process: mirrors and sourced buckets "
                    "copy between NATS servers and need nats://",
                    bucket=config.bucket,
                )
            state = _Bucket(config)
            _REGISTRY[config.bucket] = state
        elif apply:
            with state.lock:
                state.reconfigure(config, apply)
    return MemoryKeyValue(state, url)


class MemoryKeyValue:
    """A handle on an in-process bucket; implements `flowtide.kv.KeyValue`, whose
    docstrings hold the contract of each method."""

    def __init__(self, state: _Bucket, url: str = "memory://") -> None:
        self._state = state
        self._url = url
        self._closed = False
        self._watchers: weakref.WeakSet[MemoryWatcher] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"MemoryKeyValue(bucket={self._state.name!r}, url={self._url!r})"

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._state.name

    def _check(self) -> _Bucket:
        """Return the bucket state; call with its lock held."""
        state = self._state
        if self._closed:
            raise KVError(f"KV handle on bucket {state.name!r} is closed", bucket=state.name)
        if state.destroyed:
            raise BucketNotFoundError(state.name)
        state.expire()
        return state

    def _check_size(self, key: str, value: bytes) -> None:
        limit = self._state.config.max_value_size
        if limit is not None and len(value) > limit:
            raise ValueTooLargeError(self._state.name, key, size=len(value), max_size=limit)

    async def get(self, key: str, revision: int | None = None) -> Entry:
        """See `KeyValue.get`."""
        validate_key(key, bucket=self.bucket)
        with self._state.lock:
            state = self._check()
            msgs = state.by_key.get(key)
            if not msgs:
                raise KeyNotFoundError(state.name, key, revision=revision)
            if revision is None:
                index = len(msgs) - 1
            else:
                revisions = [m.revision for m in msgs]
                index = bisect.bisect_left(revisions, revision)
                if index == len(msgs) or revisions[index] != revision:
                    raise KeyNotFoundError(state.name, key, revision=revision)
            msg = msgs[index]
            if msg.operation is not Operation.PUT:
                raise KeyNotFoundError(state.name, key, revision=revision, operation=msg.operation)
            return state.entry(msg, msgs, index)

    async def put(self, key: str, value: bytes) -> int:
        """See `KeyValue.put`."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        with self._state.lock:
            return self._check().append(key, data, Operation.PUT).revision

    async def create(self, key: str, value: bytes, ttl: float | None = None) -> int:
        """See `KeyValue.create`."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        with self._state.lock:
            state = self._check()
            check_value_ttl(state.name, key, ttl, state.config.limit_marker_ttl)
            msgs = state.by_key.get(key)
            if msgs and msgs[-1].operation is Operation.PUT:
                raise KeyExistsError(state.name, key, revision=msgs[-1].revision)
            return state.append(key, data, Operation.PUT, ttl=ttl).revision

    async def create_many(self, items: Sequence[tuple[str, bytes]]) -> list[int | None]:
        """See `KeyValue.create_many`. All items under one hold of the bucket lock, so
        another writer sees all of them or none (the port promises less)."""
        wanted = prepare_creates(
            items, bucket=self.bucket, max_value_size=self._state.config.max_value_size
        )
        out: list[int | None] = []
        errors: dict[int, KVError] = {}
        with self._state.lock:
            state = self._check()
            for i, item in enumerate(wanted):
                if item is None:
                    out.append(None)
                    continue
                key, data = item
                msgs = state.by_key.get(key)
                if msgs and msgs[-1].operation is Operation.PUT:
                    out.append(None)
                    continue
                try:
                    out.append(state.append(key, data, Operation.PUT).revision)
                except BucketFullError as exc:
                    out.append(None)
                    errors[i] = exc
        if errors:
            raise CreateManyError(self.bucket, out, errors, len(wanted)) from errors[min(errors)]
        return out

    async def update(self, key: str, value: bytes, last: int) -> int:
        """See `KeyValue.update`."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        with self._state.lock:
            state = self._check()
            current = state.current_revision(key)
            if current != last:
                raise WrongRevisionError(state.name, key, expected=last, current=current)
            return state.append(key, data, Operation.PUT).revision

    async def delete(self, key: str, last: int | None = None) -> None:
        """See `KeyValue.delete`."""
        validate_key(key, bucket=self.bucket)
        with self._state.lock:
            state = self._check()
            if last is not None:
                current = state.current_revision(key)
                if current != last:
                    raise WrongRevisionError(state.name, key, expected=last, current=current)
            state.append(key, b"", Operation.DEL)

    async def purge(self, key: str, ttl: float | None = None) -> None:
        """See `KeyValue.purge`."""
        validate_key(key, bucket=self.bucket)
        with self._state.lock:
            state = self._check()
            check_value_ttl(state.name, key, ttl, state.config.limit_marker_ttl)
            state.append(key, b"", Operation.PURGE, ttl=ttl)

    async def purge_all(self, filter: str | Sequence[str]) -> int:
        """See `KeyValue.purge_all`; returns exactly how many messages were removed."""
        wanted = KeyFilter(filter, bucket=self.bucket)
        removed = 0
        with self._state.lock:
            state = self._check()
            for key, msgs in state.matching(wanted):
                for msg in msgs:
                    state._forget(msg)
                removed += len(msgs)
                # The expiry queue may still hold these messages; expire() skips
                # messages that are no longer a key's first.
                del state.by_key[key]
        return removed

    async def history(self, key: str) -> list[Entry]:
        """See `KeyValue.history`."""
        validate_key(key, bucket=self.bucket)
        with self._state.lock:
            state = self._check()
            msgs = state.by_key.get(key)
            if not msgs:
                raise KeyNotFoundError(state.name, key)
            return [state.entry(m, msgs, i) for i, m in enumerate(msgs)]

    async def keys(self, filter: str | Sequence[str] = ">") -> list[str]:
        """See `KeyValue.keys`."""
        wanted = KeyFilter(filter, bucket=self.bucket)
        with self._state.lock:
            state = self._check()
            found = [k for k, msgs in state.matching(wanted) if msgs[-1].operation is Operation.PUT]
        found.sort()
        return found

    def watch(
        self,
        keys: str | Sequence[str] = ">",
        *,
        include_history: bool = False,
        ignore_deletes: bool = False,
        meta_only: bool = False,
        updates_only: bool = False,
    ) -> MemoryWatcher:
        """See `KeyValue.watch`."""
        return MemoryWatcher(
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
        """See `KeyValue.get_last_many`."""
        wanted = KeyFilter(filters, bucket=self.bucket)
        if up_to_revision is not None and up_to_revision < 0:
            raise KVError(f"up_to_revision must be >= 0, got {up_to_revision}", bucket=self.bucket)
        out: list[tuple[str, Entry]] = []
        with self._state.lock:
            state = self._check()
            for key, msgs in state.matching(wanted):
                if up_to_revision is None:
                    index = len(msgs) - 1
                else:
                    index = len(msgs) - 1
                    # History is at most 64 long: a backwards scan beats building keys.
                    while index >= 0 and msgs[index].revision > up_to_revision:
                        index -= 1
                    if index < 0:
                        continue
                if msgs[index].operation is Operation.PUT:
                    out.append((key, state.entry(msgs[index], msgs, index)))
        out.sort(key=lambda item: item[0])
        return dict(out)

    async def status(self) -> Status:
        """See `KeyValue.status`. `bytes` is the sum of the key and value lengths of the
        stored messages; `backing_store` is "memory"."""
        with self._state.lock:
            state = self._check()
            cfg = state.config
            return Status(
                bucket=state.name,
                values=state.count,
                history=cfg.history,
                ttl=cfg.ttl,
                max_value_size=cfg.max_value_size,
                storage=cfg.storage,
                replicas=cfg.replicas,
                compression=cfg.compression,
                bytes=state.nbytes,
                backing_store="memory",
                max_bytes=cfg.max_bytes,
                placement=cfg.placement,
                republish=cfg.republish,
                mirror=cfg.mirror,
                sources=cfg.sources,
                limit_marker_ttl=cfg.limit_marker_ttl,
            )

    async def destroy(self) -> None:
        """See `KeyValue.destroy`."""
        with _REGISTRY_LOCK, self._state.lock:
            state = self._state
            if self._closed:
                raise KVError(f"KV handle on bucket {state.name!r} is closed", bucket=state.name)
            if state.destroyed:
                raise BucketNotFoundError(state.name)
            state.destroyed = True
            if _REGISTRY.get(state.name) is state:
                del _REGISTRY[state.name]
            state.by_key.clear()
            state.expiry.clear()
            state.timed.clear()
            state.count = state.nbytes = 0
            watchers = list(state.watchers)
            state.watchers.clear()
        for watcher in watchers:
            watcher._finish()

    async def close(self) -> None:
        """See `KeyValue.close`."""
        with self._state.lock:
            if self._closed:
                return
            self._closed = True
            watchers = list(self._watchers)
            self._watchers.clear()
            for watcher in watchers:
                self._state.watchers.discard(watcher)
        for watcher in watchers:
            watcher._finish()


class MemoryWatcher(QueueWatcher):
    """A watch on an in-process bucket; implements `flowtide.kv.KeyWatcher`."""

    def __init__(
        self,
        handle: MemoryKeyValue,
        keys: KeyFilter,
        *,
        include_history: bool,
        ignore_deletes: bool,
        meta_only: bool,
        updates_only: bool,
    ) -> None:
        super().__init__()
        self._handle = handle
        self._keys = keys
        self._include_history = include_history
        self._ignore_deletes = ignore_deletes
        self._meta_only = meta_only
        self._updates_only = updates_only
        self._marker_sent = False
        self._initial: deque[Entry] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Take the initial data and register for live updates (idempotent).

        Raises:
            BucketNotFoundError: the bucket was destroyed.
            KVError: the handle is closed.
        """
        if self._started or self._stopped:
            return
        self._loop = asyncio.get_running_loop()
        handle = self._handle
        with handle._state.lock:
            state = handle._check()
            if not self._updates_only:
                self._initial.extend(self._snapshot(state))
            state.watchers.add(self)
            handle._watchers.add(self)
            self._started = True

    def _snapshot(self, state: _Bucket) -> list[Entry]:
        if self._include_history:
            msgs = [m for _, key_msgs in state.matching(self._keys) for m in key_msgs]
        else:
            msgs = [key_msgs[-1] for _, key_msgs in state.matching(self._keys)]
        if self._ignore_deletes:
            msgs = [m for m in msgs if m.operation is Operation.PUT]
        msgs.sort(key=lambda m: m.revision)
        total = len(msgs)
        return [
            Entry(
                state.name,
                m.key,
                b"" if self._meta_only else m.value,
                m.revision,
                m.created,
                total - i - 1,
                m.operation,
            )
            for i, m in enumerate(msgs)
        ]

    def _offer(self, entry: Entry) -> None:
        """Queue a live update; called by writers, from any thread, under the bucket lock."""
        if not self._keys.matches(entry.key):
            return
        if self._ignore_deletes and entry.operation is not Operation.PUT:
            return
        if self._meta_only:
            entry = replace(entry, value=b"")
        if not self._post(entry):
            # The watcher's loop is closed: nobody can read it any more.
            self._handle._state.watchers.discard(self)

    def _post(self, item: Entry | EndOfWatch) -> bool:
        loop = self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            return False
        return True

    def _finish(self) -> None:
        """End iteration after the updates already queued (bucket destroyed, handle closed)."""
        self._post(END_OF_WATCH)

    def _release(self) -> None:
        handle = self._handle
        with handle._state.lock:
            handle._state.watchers.discard(self)
            handle._watchers.discard(self)

    async def _next(self) -> Entry | None | EndOfWatch:
        # The initial data and the marker come from the snapshot, before the queue.
        if self._initial:
            return self._initial.popleft()
        if not self._marker_sent:
            self._marker_sent = True
            return None
        return await self._queue.get()
