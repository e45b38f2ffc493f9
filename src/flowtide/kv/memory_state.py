"""The shared state of one in-process bucket (`memory://`): its messages per key, the
TTL expiry (the bucket's ttl and per-value TTLs, with ADR-48 limit markers), the size
limit, and a settings change. `flowtide.kv.memory` holds the handles and watchers.
"""

from __future__ import annotations

import heapq
import threading
import time
import weakref
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from flowtide.kv.base import BucketConfig, BucketFullError, Entry, KeyFilter, KVError, Operation
from flowtide.kv.options import SETTINGS, check_changes

if TYPE_CHECKING:
    from flowtide.kv.memory import MemoryWatcher

__all__ = ["_Bucket", "_Msg", "message_size"]


def message_size(key: str, value: bytes) -> int:
    """What a message counts against `max_bytes` here: its key and value lengths.

    JetStream counts more per message (the subject `$KV.<bucket>.<key>`, the headers
    and some 30 bytes of record overhead), so a JetStream bucket of the same max_bytes
    fills up sooner; the memory adapter's count is the smaller, simpler one.
    """
    return len(key) + len(value)


class _Msg:
    """One stored message; `mono` is the monotonic time it was written, `deadline` the
    monotonic time a per-value TTL removes it (None: the bucket's ttl applies)."""

    __slots__ = ("key", "value", "revision", "created", "mono", "operation", "deadline")

    def __init__(
        self,
        key: str,
        value: bytes,
        revision: int,
        created: float,
        mono: float,
        operation: Operation,
        deadline: float | None = None,
    ) -> None:
        self.key = key
        self.value = value
        self.revision = revision
        self.created = created
        self.mono = mono
        self.operation = operation
        self.deadline = deadline


class _Bucket:
    """The shared state of one bucket. Every attribute is guarded by `lock`."""

    def __init__(self, config: BucketConfig) -> None:
        self.config = config
        self.name = config.bucket
        self.lock = threading.Lock()
        self.seq = 0
        # Per key, its stored messages in revision order (at most `history` of them).
        self.by_key: dict[str, list[_Msg]] = {}
        # Messages under the bucket's ttl in revision order; may hold messages already
        # dropped by a purge or the history limit, which expiry then skips.
        self.expiry: deque[_Msg] = deque()
        # Messages with their own TTL: (deadline, revision, message), a heap.
        self.timed: list[tuple[float, int, _Msg]] = []
        self.count = 0
        self.nbytes = 0
        self.destroyed = False
        # Weak, so a watcher its owner dropped without stop() does not stay registered.
        self.watchers: weakref.WeakSet[MemoryWatcher] = weakref.WeakSet()

    # All methods below expect `lock` to be held.

    def expire(self) -> None:
        """Drop what the bucket's ttl and per-value TTLs removed by now, oldest first;
        with limit markers, a key whose last value expired gets a PURGE marker that
        lives `limit_marker_ttl` (as JetStream's subject delete markers)."""
        now = time.monotonic()
        ttl = self.config.ttl
        cutoff = now - ttl if ttl is not None else None
        expiry, timed = self.expiry, self.timed
        while True:
            due_ttl = cutoff is not None and bool(expiry) and expiry[0].mono <= cutoff
            due_own = bool(timed) and timed[0][0] <= now
            if not (due_ttl or due_own):
                return
            if due_ttl and (not due_own or expiry[0].mono + (ttl or 0) <= timed[0][0]):
                msg = expiry.popleft()
                at = msg.mono + (ttl or 0)
            else:
                at, _, msg = heapq.heappop(timed)
            self._remove(msg, at)

    def _remove(self, msg: _Msg, at: float) -> None:
        msgs = self.by_key.get(msg.key)
        if not msgs:
            return
        for i, stored in enumerate(msgs):
            if stored is msg:
                del msgs[i]
                break
        else:
            return  # dropped before (history limit, purge)
        self._forget(msg)
        if msgs:
            return
        del self.by_key[msg.key]
        marker_ttl = self.config.limit_marker_ttl
        # A value expired: a marker says so (an expired marker leaves nothing).
        if marker_ttl is not None and msg.operation is Operation.PUT:
            self.append(msg.key, b"", Operation.PURGE, ttl=marker_ttl, now=at, check=False)

    def _forget(self, msg: _Msg) -> None:
        self.count -= 1
        self.nbytes -= message_size(msg.key, msg.value)

    def current_revision(self, key: str) -> int:
        msgs = self.by_key.get(key)
        return msgs[-1].revision if msgs else 0

    def append(
        self,
        key: str,
        value: bytes,
        operation: Operation,
        *,
        ttl: float | None = None,
        now: float | None = None,
        check: bool = True,
    ) -> _Msg:
        """Store a message. `ttl`: its own TTL in seconds. Raises BucketFullError when
        `check` and it would take the bucket past max_bytes (nothing is stored)."""
        size = message_size(key, value)
        limit = self.config.max_bytes
        if check and limit is not None and self.nbytes + size > limit:
            raise BucketFullError(self.name, key, max_bytes=limit)
        self.seq += 1
        mono = time.monotonic() if now is None else now
        deadline = mono + ttl if ttl is not None else None
        msg = _Msg(key, value, self.seq, time.time(), mono, operation, deadline)
        msgs = self.by_key.setdefault(key, [])
        if operation is Operation.PURGE:
            for old in msgs:
                self._forget(old)
            msgs.clear()
        msgs.append(msg)
        self.count += 1
        self.nbytes += size
        if len(msgs) > self.config.history:
            self._forget(msgs.pop(0))
        if deadline is not None:
            heapq.heappush(self.timed, (deadline, msg.revision, msg))
        elif self.config.ttl is not None:
            self.expiry.append(msg)
        self._notify(msg)
        return msg

    def reconfigure(self, config: BucketConfig, fields: frozenset[str]) -> None:
        """Apply the settings in `fields` of `config` that differ (`connect(...,
        apply=True)`): history trims every key at once, a new ttl applies to the stored
        messages too, as on JetStream.

        Raises:
            KVError: a change JetStream could not apply in place either.
        """
        current = self.config
        changes: dict[str, tuple[Any, Any]] = {
            name: (getattr(current, name), getattr(config, name))
            for name in SETTINGS
            if name in fields and getattr(current, name) != getattr(config, name)
        }
        if not changes:
            return
        check_changes(self.name, changes)
        if "sources" in changes:
            raise KVError(
                "memory:// buckets live inside one process: sourced buckets need nats://",
                bucket=self.name,
            )
        self.config = replace(current, **{name: new for name, (_, new) in changes.items()})
        if "history" in changes:
            for msgs in self.by_key.values():
                while len(msgs) > self.config.history:
                    self._forget(msgs.pop(0))
        if "ttl" in changes:
            self.expiry = deque(
                sorted(
                    (m for msgs in self.by_key.values() for m in msgs if m.deadline is None),
                    key=lambda m: m.revision,
                )
            )

    def _notify(self, msg: _Msg) -> None:
        if not self.watchers:
            return
        entry = Entry(self.name, msg.key, msg.value, msg.revision, msg.created, 0, msg.operation)
        for watcher in list(self.watchers):
            watcher._offer(entry)

    def entry(self, msg: _Msg, msgs: list[_Msg], index: int) -> Entry:
        return Entry(
            self.name,
            msg.key,
            msg.value,
            msg.revision,
            msg.created,
            len(msgs) - index - 1,
            msg.operation,
        )

    def matching(self, keys: KeyFilter) -> list[tuple[str, list[_Msg]]]:
        if keys.literal_only:
            return [(k, self.by_key[k]) for k in keys.literals if k in self.by_key]
        return [(k, msgs) for k, msgs in self.by_key.items() if keys.matches(k)]
