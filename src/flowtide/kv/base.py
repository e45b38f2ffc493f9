"""The KV port: ADR-8 key-value buckets (JetStream KV semantics) behind one async shape.

A bucket is an append-only log of messages, one per write. Every message gets the next
revision of the bucket (a per-bucket sequence starting at 1) and belongs to one key. For
each key the bucket keeps at most `history` messages (1..64); a delete appends a `DEL`
marker (history is kept), a purge drops the key's history and leaves one `PURGE` marker.
A key "exists" while its newest message is a `PUT`.

Adapters (`memory`, `nats`) implement `KeyValue` and pass the shared conformance
suite in `tests/kv/conformance.py`. They raise only the port's errors (`kv.errors`),
never a driver's exception. What a reader gets (`kv.entries`), the rules of keys and
filters (`kv.keys`) and the errors are re-exported here with the port.

Keys follow ADR-8: `[-/_=.a-zA-Z0-9]+`, no leading or trailing `.`, no empty token, and
the `_kv` prefix is reserved. Filters are keys whose tokens may also be `*` (exactly one
token) or a final `>` (one or more tokens), as NATS subjects.

`delta` on an `Entry` is, for `get`, `history` and `get_last_many`, the number of newer
messages of the same key still stored (0 = the key's newest message; ADR-8: "the index of
the historical value"). For a watcher's initial data it is the number of initial entries
still to come after this one (JetStream's consumer "pending"); live updates carry 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, Self

from flowtide.kv.entries import Entry, Operation, Status, StorageType
from flowtide.kv.errors import (
    BucketFullError,
    BucketNotFoundError,
    CreateManyError,
    InvalidKeyError,
    KeyExistsError,
    KeyNotFoundError,
    KVError,
    ReadOnlyBucketError,
    ValueTooLargeError,
    WrongRevisionError,
)
from flowtide.kv.keys import (
    KeyFilter,
    decode_key_token,
    encode_key_token,
    validate_bucket_name,
    validate_filter,
    validate_key,
)
from flowtide.kv.options import Placement, Republish, validate_extended

__all__ = [
    "CREATE_MANY_MAX",
    "MAX_HISTORY",
    "BucketConfig",
    "BucketFullError",
    "BucketNotFoundError",
    "CreateManyError",
    "EndOfWatch",
    "Entry",
    "InvalidKeyError",
    "KVError",
    "KeyExistsError",
    "KeyFilter",
    "KeyNotFoundError",
    "KeyValue",
    "KeyWatcher",
    "Operation",
    "Placement",
    "QueueWatcher",
    "ReadOnlyBucketError",
    "Republish",
    "Status",
    "StorageType",
    "ValueTooLargeError",
    "WrongRevisionError",
    "as_bytes",
    "decode_key_token",
    "prepare_creates",
    "encode_key_token",
    "validate_bucket_name",
    "validate_filter",
    "validate_key",
]

MAX_HISTORY = 64

# The most items one `create_many` call takes: bounds the memory, the time a caller waits
# and (NATS) the replies outstanding. Callers with more chunk (as `LoopState.record_many`).
CREATE_MANY_MAX: Final = 1000


# ---------------------------------------------------------------------- the port


def as_bytes(value: bytes) -> bytes:
    """The value an adapter stores: `bytes` as given, a bytearray or memoryview copied.

    Raises:
        TypeError: `value` is not bytes-like.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"KV values are bytes, got {type(value).__name__}")


def prepare_creates(
    items: Sequence[tuple[str, bytes]], *, bucket: str, max_value_size: int | None
) -> list[tuple[str, bytes] | None]:
    """Validate the items of a `create_many` call before anything is written.

    Returns:
        Per item its key and value as stored, or None for a key an earlier item of the
        call already has (the first one wins).
    Raises:
        KVError: more than CREATE_MANY_MAX items.
        InvalidKeyError: a key is invalid.
        ValueTooLargeError: a value exceeds `max_value_size`.
        TypeError: a value is not bytes-like.
    """
    if len(items) > CREATE_MANY_MAX:
        raise KVError(
            f"create_many takes at most {CREATE_MANY_MAX} items per call, got {len(items)}; "
            "split them into several calls",
            bucket=bucket,
        )
    seen: set[str] = set()
    out: list[tuple[str, bytes] | None] = []
    for key, value in items:
        validate_key(key, bucket=bucket)
        data = as_bytes(value)
        if max_value_size is not None and len(data) > max_value_size:
            raise ValueTooLargeError(bucket, key, size=len(data), max_size=max_value_size)
        if key in seen:
            out.append(None)
        else:
            seen.add(key)
            out.append((key, data))
    return out


@dataclass(frozen=True, slots=True)
class BucketConfig:
    """How a bucket is created. Validated on construction.

    `ttl` is in seconds (None: values never expire); `max_value_size` in bytes (None: no
    limit). `storage`, `replicas` and `compression` shape a JetStream stream; adapters
    without such a notion keep them only to report them in `status()`. `max_bytes`,
    `placement`, `republish`, `mirror`, `sources` and `limit_marker_ttl` are described
    in `flowtide.kv.options`, which validates them.
    """

    bucket: str
    history: int = 1
    ttl: float | None = None
    max_value_size: int | None = None
    storage: StorageType = "file"
    replicas: int = 1
    compression: bool = False
    max_bytes: int | None = None
    placement: Placement | None = None
    republish: Republish | None = None
    mirror: str | None = None
    sources: tuple[str, ...] = ()
    limit_marker_ttl: float | None = None

    def __post_init__(self) -> None:
        validate_bucket_name(self.bucket)
        b = self.bucket
        if not isinstance(self.history, int) or not 1 <= self.history <= MAX_HISTORY:
            raise KVError(f"history must be 1..{MAX_HISTORY}, got {self.history!r}", bucket=b)
        if self.ttl is not None and not self.ttl > 0:
            raise KVError(f"ttl must be positive seconds or None, got {self.ttl!r}", bucket=b)
        if self.max_value_size is not None and not self.max_value_size > 0:
            raise KVError(
                f"max_value_size must be positive or None, got {self.max_value_size!r}",
                bucket=b,
            )
        if self.storage not in ("file", "memory"):
            raise KVError(f"storage must be 'file' or 'memory', got {self.storage!r}", bucket=b)
        # JetStream allows R1..R5 streams.
        if not isinstance(self.replicas, int) or not 1 <= self.replicas <= 5:
            raise KVError(f"replicas must be 1..5, got {self.replicas!r}", bucket=b)
        validate_extended(self)


class KeyWatcher(Protocol):
    """What `KeyValue.watch` returns: an async iterator of `Entry | None`.

    The initial data (per the watch options) comes first, then `None` exactly once as
    the end-of-initial-data marker (also when there is no initial data, and first thing
    with `updates_only`), then live updates as they are written. A revision the bucket's
    history limit removed before it was delivered is skipped, as on JetStream (its
    consumer reads the stream, and a key's older revisions leave it), so a watcher
    always reaches each key's newest revision but may not see every one before it. The
    watch starts when the watcher is entered (`async with`) or first iterated; use
    `async with` or `stop()` to release it. Iteration ends after `stop()`, when the handle is closed or the
    bucket destroyed.
    """

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: Any) -> None: ...

    def __aiter__(self) -> Self: ...

    async def __anext__(self) -> Entry | None: ...

    async def stop(self) -> None:
        """Stop watching; iteration ends."""
        ...


class KeyValue(Protocol):
    """A handle on one bucket. All methods are coroutines except `watch`.

    Once the handle is closed, every method but `close` raises KVError (a watcher when
    it starts).
    """

    @property
    def bucket(self) -> str:
        """The bucket name."""
        ...

    async def get(self, key: str, revision: int | None = None) -> Entry:
        """Read the newest value of `key`, or the message at `revision`.

        Args:
            key: a valid key.
            revision: a revision of this key that is still stored; None for the newest.
        Returns:
            The entry (operation PUT).
        Raises:
            KeyNotFoundError: no such key or revision, or it is a delete/purge marker.
            InvalidKeyError: the key is invalid.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def put(self, key: str, value: bytes) -> int:
        """Write `value` under `key` unconditionally.

        Args:
            key: a valid key (no wildcards).
            value: the bytes to store.
        Returns:
            The new revision.
        Raises:
            InvalidKeyError: the key is invalid.
            ValueTooLargeError: `value` exceeds the bucket's max_value_size.
            BucketFullError: the bucket holds `max_bytes` already.
            ReadOnlyBucketError: the bucket is a mirror.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def create(self, key: str, value: bytes, ttl: float | None = None) -> int:
        """Write `value` only if `key` does not exist or its newest message is a
        delete or purge marker.

        Args:
            key: a valid key.
            value: the bytes to store.
            ttl: seconds this value lives (at least 1), whatever the bucket's ttl; only
                on a bucket with `limit_marker_ttl` (ADR-48: only create takes a TTL,
                so an older revision never comes back when a newer one expires).
        Returns:
            The new revision.
        Raises:
            KeyExistsError: the key exists (`revision` is its current revision).
            KVError: `ttl` given on a bucket without limit markers, or under 1 s.
            InvalidKeyError: the key is invalid.
            ValueTooLargeError: `value` exceeds the bucket's max_value_size.
            BucketFullError: the bucket holds `max_bytes` already.
            ReadOnlyBucketError: the bucket is a mirror.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def create_many(self, items: Sequence[tuple[str, bytes]]) -> list[int | None]:
        """`create` for many keys in one call, each key on its own (not atomic).

        Every key and value is validated before anything is written. Then each item is
        written only if its key does not exist or its newest message is a delete or
        purge marker, as `create` does; an existing key does not stop the other items. A
        key given twice is written at most once, for its first item; later ones get
        None. New revisions increase in item order among the items written together.
        At most CREATE_MANY_MAX (1,000) items per call: callers with more split them.

        Args:
            items: (key, value) pairs; an empty sequence returns [].
        Returns:
            Per item, in order: its new revision, or None when the key already existed
            (or an earlier item of the call had the same key).
        Raises:
            KVError: more than CREATE_MANY_MAX items (nothing written).
            InvalidKeyError: a key is invalid (nothing written).
            ValueTooLargeError: a value exceeds the bucket's max_value_size (nothing
                written).
            CreateManyError: some items could not be written for another reason than an
                existing key; raised once every other item was processed, naming the
                first failed key, with the per-item results.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Write `value` only if the newest message of `key` has revision `last`.

        `last` may be a delete marker's revision; `last=0` succeeds only when the key
        has no stored message at all (JetStream's expected-last-subject-sequence).

        Args:
            key: a valid key.
            value: the bytes to store.
            last: the revision the caller last saw.
        Returns:
            The new revision.
        Raises:
            WrongRevisionError: the key is at another revision (`current`).
            InvalidKeyError: the key is invalid.
            ValueTooLargeError: `value` exceeds the bucket's max_value_size.
            BucketFullError: the bucket holds `max_bytes` already.
            ReadOnlyBucketError: the bucket is a mirror.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def delete(self, key: str, last: int | None = None) -> None:
        """Append a DEL marker for `key`, keeping its history.

        Deleting a key that does not exist still writes the marker, as JetStream does.

        Args:
            key: a valid key.
            last: if given, delete only if the key's newest message has this revision.
        Raises:
            WrongRevisionError: `last` was given and the key is at another revision.
            InvalidKeyError: the key is invalid.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def purge(self, key: str, ttl: float | None = None) -> None:
        """Remove every message of `key`, leaving one PURGE marker.

        Args:
            key: a valid key.
            ttl: seconds the PURGE marker lives (at least 1), after which the key
                leaves no trace; only on a bucket with `limit_marker_ttl`.
        Raises:
            InvalidKeyError: the key is invalid.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def purge_all(self, filter: str | Sequence[str]) -> int:
        """Remove every message of every key matching the filters, without leaving markers.

        A JetStream stream purge with a subject filter: one request per filter however
        many keys match. Afterwards the keys have no stored message, so `create` and
        `update(last=0)` succeed on them; revisions keep counting up. Watchers see
        nothing for it, as for TTL expiry.

        Args:
            filter: a filter or a sequence of filters (`*` and `>` wildcards).
        Returns:
            How many messages were removed (the adapter's best knowledge; markers and
            history count).
        Raises:
            InvalidKeyError: a filter is invalid or the sequence is empty.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def history(self, key: str) -> list[Entry]:
        """Every stored message of `key`, oldest first, markers included.

        Args:
            key: a valid key.
        Returns:
            The entries; `delta` counts down to 0 for the newest.
        Raises:
            KeyNotFoundError: the key has no stored message.
            InvalidKeyError: the key is invalid.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def keys(self, filter: str | Sequence[str] = ">") -> list[str]:
        """The live keys (newest message is a PUT) matching any of the filters.

        Args:
            filter: a filter or a sequence of filters (`*` and `>` wildcards).
        Returns:
            The keys, sorted; empty when none matches.
        Raises:
            InvalidKeyError: a filter is invalid.
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    def watch(
        self,
        keys: str | Sequence[str] = ">",
        *,
        include_history: bool = False,
        ignore_deletes: bool = False,
        meta_only: bool = False,
        updates_only: bool = False,
    ) -> KeyWatcher:
        """Watch keys matching the filters (see `KeyWatcher` for the delivery order).

        Args:
            keys: a filter or a sequence of filters.
            include_history: initial data holds every stored message, not just the
                newest per key.
            ignore_deletes: never deliver DEL or PURGE entries.
            meta_only: deliver entries with an empty value.
            updates_only: no initial data; the marker comes first.
        Returns:
            A watcher, started on `async with` or the first iteration.
        Raises:
            InvalidKeyError: a filter is invalid (raised here, before starting).
        """
        ...

    async def get_last_many(
        self, filters: str | Sequence[str], up_to_revision: int | None = None
    ) -> dict[str, Entry]:
        """Read many keys at one point in time (ADR-31 multi-last direct get).

        For each key matching the filters, the newest message with revision <=
        `up_to_revision` (newest overall when None); keys whose message there is a
        delete/purge marker, or that have no stored message that old, are left out.
        A point before the oldest retained history cannot be reconstructed, as on
        JetStream. The port puts no cap on the number of keys (JetStream's 1024-subject
        limit per request is the adapter's concern).

        Args:
            filters: a filter or a sequence of filters.
            up_to_revision: the point in time, as a bucket revision.
        Returns:
            Key -> entry, in key order.
        Raises:
            InvalidKeyError: a filter is invalid.
            BucketNotFoundError: the bucket was destroyed.
            KVError: `up_to_revision` is negative.
        """
        ...

    async def status(self) -> Status:
        """Report the bucket's state and configuration.

        Returns:
            The status.
        Raises:
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def destroy(self) -> None:
        """Delete the bucket and all its data; every handle on it stops working and
        every watcher on it ends.

        Raises:
            BucketNotFoundError: the bucket was already destroyed.
        """
        ...

    async def close(self) -> None:
        """Release this handle and end its watchers; the bucket and its data stay.
        Idempotent."""
        ...


class EndOfWatch:
    """Queued for a watcher whose iteration must end after what is already queued."""


END_OF_WATCH: Final = EndOfWatch()


class QueueWatcher:
    """The iteration the adapters' watchers share; `KeyWatcher` is the contract.

    A subclass implements `start` (take the initial data, register for updates; a no-op
    once started or stopped) and `_release` (unregister, free what `start` took), and
    fills `_queue` with entries, the `None` marker and, to end iteration after what is
    queued, `END_OF_WATCH`. `_next` may serve items from elsewhere first.
    """

    def __init__(self) -> None:
        self._started = False
        self._stopped = False
        self._queue: asyncio.Queue[Entry | None | EndOfWatch] = asyncio.Queue()

    async def start(self) -> None:
        """Start watching (idempotent)."""
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError

    async def _next(self) -> Entry | None | EndOfWatch:
        return await self._queue.get()

    async def stop(self) -> None:
        """Stop watching; iteration ends at once (queued updates are dropped)."""
        if self._stopped:
            return
        self._stopped = True
        self._release()
        # Wakes a task blocked in __anext__ on this loop.
        self._queue.put_nowait(END_OF_WATCH)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.stop()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Entry | None:
        if self._stopped:
            raise StopAsyncIteration
        if not self._started:
            await self.start()
        item = await self._next()
        if isinstance(item, EndOfWatch) or self._stopped:
            if not self._stopped:
                self._stopped = True
                self._release()
            raise StopAsyncIteration
        return item
