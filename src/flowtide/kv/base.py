"""The KV port: ADR-8 key-value buckets (JetStream KV semantics) behind one async shape.

A bucket is an append-only log of messages, one per write. Every message gets the next
revision of the bucket (a per-bucket sequence starting at 1) and belongs to one key. For
each key the bucket keeps at most `history` messages (1..64); a delete appends a `DEL`
marker (history is kept), a purge drops the key's history and leaves one `PURGE` marker.
A key "exists" while its newest message is a `PUT`.

Adapters (`memory`, `nats`) implement `KeyValue` and pass the shared conformance
suite in `tests/kv/conformance.py`. They raise only the errors defined here, never a
driver's exception.

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
import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, Self

from flowtide.errors import FlowtideError

MAX_HISTORY = 64
StorageType = Literal["file", "memory"]

_KEY_RE = re.compile(r"[-/_=.a-zA-Z0-9]+")
_TOKEN_RE = re.compile(r"[-/_=a-zA-Z0-9]+")
_BUCKET_RE = re.compile(r"[a-zA-Z0-9_-]+")
_HEX2_RE = re.compile(r"[0-9A-Fa-f]{2}")
# Characters encode_key_token keeps as they are; `=` is the escape character so it is
# escaped itself, which keeps the mapping reversible.
_PLAIN_TOKEN_CHARS = frozenset("-_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


class Operation(enum.Enum):
    """What a message of the bucket does to its key."""

    PUT = "PUT"
    DEL = "DEL"
    PURGE = "PURGE"


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of a bucket as seen by a reader."""

    bucket: str
    key: str
    value: bytes
    revision: int
    created: float
    delta: int
    operation: Operation


@dataclass(frozen=True, slots=True)
class Status:
    """The state and configuration of a bucket.

    `values` counts every stored message (history and delete/purge markers included);
    `bytes` is what the adapter stores for them (memory: key + value lengths).
    """

    bucket: str
    values: int
    history: int
    ttl: float | None
    max_value_size: int | None
    storage: StorageType
    replicas: int
    compression: bool
    bytes: int
    backing_store: str


# --------------------------------------------------------------------------- errors


class KVError(FlowtideError):
    """Root of the KV port's errors; also raised for a bad bucket configuration or URL."""

    def __init__(self, message: str, *, bucket: str | None = None, key: str | None = None) -> None:
        self.message = message
        self.bucket = bucket
        self.key = key
        super().__init__(message)


class BucketNotFoundError(KVError):
    """The bucket does not exist (destroyed, or never created)."""

    def __init__(self, bucket: str) -> None:
        super().__init__(f"bucket {bucket!r} not found", bucket=bucket)


class KeyNotFoundError(KVError):
    """The key (or the requested revision of it) does not exist, was deleted or purged.

    `operation` is the marker's operation when the newest message is a delete or purge.
    """

    def __init__(
        self,
        bucket: str,
        key: str,
        *,
        revision: int | None = None,
        operation: Operation | None = None,
    ) -> None:
        self.revision = revision
        self.operation = operation
        what = f"key {key!r}" if revision is None else f"key {key!r} revision {revision}"
        message = f"{what} not found in bucket {bucket!r}"
        if operation is Operation.DEL:
            message += " (deleted)"
        elif operation is Operation.PURGE:
            message += " (purged)"
        super().__init__(message, bucket=bucket, key=key)


class KeyExistsError(KVError):
    """`create` found the key alive; `revision` is its current revision."""

    def __init__(self, bucket: str, key: str, *, revision: int) -> None:
        self.revision = revision
        super().__init__(
            f"key {key!r} already exists in bucket {bucket!r} at revision {revision}",
            bucket=bucket,
            key=key,
        )


class WrongRevisionError(KVError):
    """A compare-and-set write expected revision `expected`; the key is at `current`
    (0 when the key has no stored message)."""

    def __init__(self, bucket: str, key: str, *, expected: int, current: int) -> None:
        self.expected = expected
        self.current = current
        self.revision = current
        super().__init__(
            f"key {key!r} in bucket {bucket!r} is at revision {current}, expected {expected}",
            bucket=bucket,
            key=key,
        )


class InvalidKeyError(KVError):
    """A key, filter or bucket name breaks the ADR-8 rules.

    `kind` is "key", "filter" or "bucket"; `key` holds the offending key or filter
    (None for a bucket name, which is in `bucket`).
    """

    def __init__(
        self,
        value: str,
        reason: str,
        *,
        kind: Literal["key", "filter", "bucket"] = "key",
        bucket: str | None = None,
    ) -> None:
        self.kind = kind
        self.reason = reason
        if kind == "bucket":
            super().__init__(f"invalid bucket name {value!r}: {reason}", bucket=value)
        else:
            super().__init__(f"invalid {kind} {value!r}: {reason}", bucket=bucket, key=value)


class ValueTooLargeError(KVError):
    """The value is larger than the bucket's `max_value_size`."""

    def __init__(self, bucket: str, key: str, *, size: int, max_size: int) -> None:
        self.size = size
        self.max_size = max_size
        super().__init__(
            f"value for key {key!r} is {size} bytes, bucket {bucket!r} allows {max_size}",
            bucket=bucket,
            key=key,
        )


# ----------------------------------------------------------------------- validation


def validate_bucket_name(name: str) -> str:
    """Check a bucket name against ADR-8 (`[a-zA-Z0-9_-]+`).

    Args:
        name: the bucket name.
    Returns:
        `name` unchanged.
    Raises:
        InvalidKeyError: (kind "bucket") the name is not valid.
    """
    if not isinstance(name, str) or not _BUCKET_RE.fullmatch(name):
        raise InvalidKeyError(str(name), "allowed characters are [a-zA-Z0-9_-]", kind="bucket")
    return name


def validate_key(key: str, *, bucket: str | None = None) -> str:
    """Check a key against ADR-8 (wildcards are not allowed in keys).

    Args:
        key: the key.
        bucket: named in the error, if given.
    Returns:
        `key` unchanged.
    Raises:
        InvalidKeyError: the key is not valid.
    """
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(str(key), "a key is a non-empty string", bucket=bucket)
    if not _KEY_RE.fullmatch(key):
        raise InvalidKeyError(key, "allowed characters are [-/_=.a-zA-Z0-9]", bucket=bucket)
    if key[0] == "." or key[-1] == ".":
        raise InvalidKeyError(key, "a key may not start or end with '.'", bucket=bucket)
    if ".." in key:
        raise InvalidKeyError(key, "empty token", bucket=bucket)
    if key.startswith("_kv"):
        raise InvalidKeyError(key, "keys starting with '_kv' are reserved", bucket=bucket)
    return key


def validate_filter(pattern: str, *, bucket: str | None = None) -> str:
    """Check a key filter: a key whose tokens may be `*`, or `>` as the last token.

    Args:
        pattern: the filter; "" means the whole bucket (as ADR-8's empty watch key).
        bucket: named in the error, if given.
    Returns:
        The filter, with "" normalised to ">".
    Raises:
        InvalidKeyError: (kind "filter") the filter is not valid.
    """
    if not isinstance(pattern, str):
        raise InvalidKeyError(str(pattern), "a filter is a string", kind="filter", bucket=bucket)
    if pattern == "":
        return ">"
    tokens = pattern.split(".")
    for i, token in enumerate(tokens):
        if token == "*":
            continue
        if token == ">":
            if i != len(tokens) - 1:
                raise InvalidKeyError(
                    pattern, "'>' must be the last token", kind="filter", bucket=bucket
                )
            continue
        if not token:
            raise InvalidKeyError(pattern, "empty token", kind="filter", bucket=bucket)
        if not _TOKEN_RE.fullmatch(token):
            raise InvalidKeyError(
                pattern,
                "tokens are '*', a final '>', or [-/_=a-zA-Z0-9]+",
                kind="filter",
                bucket=bucket,
            )
    return pattern


class KeyFilter:
    """A compiled set of filters; a key matches when any filter matches it."""

    __slots__ = ("filters", "literals", "_patterns", "match_all")

    def __init__(self, filters: str | Sequence[str], *, bucket: str | None = None) -> None:
        """Compile `filters`.

        Args:
            filters: one filter or a sequence of them (at least one).
            bucket: named in errors, if given.
        Raises:
            InvalidKeyError: a filter is invalid or the sequence is empty.
        """
        items = [filters] if isinstance(filters, str) else list(filters)
        if not items:
            raise InvalidKeyError("", "no filter given", kind="filter", bucket=bucket)
        self.filters: tuple[str, ...] = tuple(validate_filter(f, bucket=bucket) for f in items)
        self.match_all = ">" in self.filters
        # Literal filters are answered by a dictionary lookup instead of a scan.
        self.literals: frozenset[str] = frozenset(
            f for f in self.filters if "*" not in f.split(".") and not f.endswith(">")
        )
        self._patterns: tuple[tuple[str, ...], ...] = tuple(
            tuple(f.split(".")) for f in self.filters if f not in self.literals
        )

    @property
    def literal_only(self) -> bool:
        """True when every filter is a plain key (no wildcard)."""
        return not self._patterns

    def matches(self, key: str) -> bool:
        """Return whether `key` matches any of the filters."""
        if self.match_all or key in self.literals:
            return True
        if not self._patterns:
            return False
        tokens = key.split(".")
        return any(_tokens_match(p, tokens) for p in self._patterns)


def _tokens_match(pattern: tuple[str, ...], tokens: list[str]) -> bool:
    for i, want in enumerate(pattern):
        if want == ">":
            # '>' needs at least one token to match, as in NATS.
            return len(tokens) > i
        if i >= len(tokens):
            return False
        if want != "*" and want != tokens[i]:
            return False
    return len(tokens) == len(pattern)


# ------------------------------------------------------------------- key encoding


def encode_key_token(name: str) -> str:
    """Map an arbitrary name (a step name, say) to one valid key token.

    Letters, digits, `-` and `_` are kept; every other character, `.`, `/` and `=`
    included, becomes `=XX` for each byte of its UTF-8 encoding (upper-case hex). The
    result never contains `.`, so it is exactly one token, and `decode_key_token`
    reverses it.

    Args:
        name: any non-empty string.
    Returns:
        The encoded token, e.g. "fetch.users/v2" -> "fetch=2Eusers=2Fv2".
    Raises:
        InvalidKeyError: `name` is empty (an empty token is not a valid key part).
    """
    if not name:
        raise InvalidKeyError(name, "cannot encode an empty name as a key token")
    out: list[str] = []
    for ch in name:
        if ch in _PLAIN_TOKEN_CHARS:
            out.append(ch)
        else:
            out.extend(f"={b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode_key_token(token: str) -> str:
    """Reverse `encode_key_token`.

    Args:
        token: a token produced by `encode_key_token`.
    Returns:
        The original name.
    Raises:
        InvalidKeyError: the token holds a malformed escape.
    """
    raw = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "=":
            digits = token[i + 1 : i + 3]
            if not _HEX2_RE.fullmatch(digits):
                raise InvalidKeyError(token, f"bad escape at offset {i}")
            raw.append(int(digits, 16))
            i += 3
        else:
            raw.extend(ch.encode("utf-8"))
            i += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidKeyError(token, "escapes do not form UTF-8") from None


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


@dataclass(frozen=True, slots=True)
class BucketConfig:
    """How a bucket is created. Validated on construction.

    `ttl` is in seconds (None: values never expire); `max_value_size` in bytes (None: no
    limit). `storage`, `replicas` and `compression` shape a JetStream stream; adapters
    without such a notion keep them only to report them in `status()`.
    """

    bucket: str
    history: int = 1
    ttl: float | None = None
    max_value_size: int | None = None
    storage: StorageType = "file"
    replicas: int = 1
    compression: bool = False

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


class KeyWatcher(Protocol):
    """What `KeyValue.watch` returns: an async iterator of `Entry | None`.

    The initial data (per the watch options) comes first, then `None` exactly once as
    the end-of-initial-data marker (also when there is no initial data, and first thing
    with `updates_only`), then live updates as they are written. The watch starts when
    the watcher is entered (`async with`) or first iterated; use `async with` or `stop()`
    to release it. Iteration ends after `stop()`, when the handle is closed or the
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
            BucketNotFoundError: the bucket was destroyed.
        """
        ...

    async def create(self, key: str, value: bytes) -> int:
        """Write `value` only if `key` does not exist or its newest message is a
        delete or purge marker.

        Args:
            key: a valid key.
            value: the bytes to store.
        Returns:
            The new revision.
        Raises:
            KeyExistsError: the key exists (`revision` is its current revision).
            InvalidKeyError: the key is invalid.
            ValueTooLargeError: `value` exceeds the bucket's max_value_size.
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

    async def purge(self, key: str) -> None:
        """Remove every message of `key`, leaving one PURGE marker.

        Args:
            key: a valid key.
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
