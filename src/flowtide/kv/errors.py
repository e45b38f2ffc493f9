"""The KV port's errors: an adapter raises these and only these, never a driver's
exception, so callers catch one family whichever bucket they hold."""

from __future__ import annotations

from typing import Literal

from flowtide.errors import FlowtideError
from flowtide.kv.entries import Operation

__all__ = [
    "BucketFullError",
    "BucketNotFoundError",
    "CreateManyError",
    "KVUnavailable",
    "InvalidKeyError",
    "KVError",
    "KVUnavailableError",
    "KeyExistsError",
    "KeyNotFoundError",
    "ReadOnlyBucketError",
    "ValueTooLargeError",
    "WrongRevisionError",
]


class KVError(FlowtideError):
    """Root of the KV port's errors; also raised for a bad bucket configuration or URL."""

    def __init__(self, message: str, *, bucket: str | None = None, key: str | None = None) -> None:
        self.message = message
        self.bucket = bucket
        self.key = key
        super().__init__(message)


class KVUnavailableError(KVError):
    """The server did not answer in time or cannot serve the request right now: the
    connection is being re-established, or a JetStream cluster is electing the bucket's
    leader (a few seconds after a node dies). A write may or may not have been applied;
    asking again later is how to find out (`create` then says KeyExistsError)."""


class BucketNotFoundError(KVError):
    """The bucket does not exist (destroyed, or never created)."""

    refused = True

    def __init__(self, bucket: str) -> None:
        super().__init__(f"bucket {bucket!r} not found", bucket=bucket)


class KeyNotFoundError(KVError):
    """The key (or the requested revision of it) does not exist, was deleted or purged.

    `operation` is the marker's operation when the newest message is a delete or purge.
    """

    refused = True

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

    refused = True

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


class BucketFullError(KVError):
    """The bucket holds `max_bytes` already: the write was refused (JetStream's discard
    policy "new"; nothing older is dropped to make room)."""

    def __init__(self, bucket: str, key: str | None, *, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        limit = f"its limit of {max_bytes} bytes" if max_bytes else "its byte limit"
        super().__init__(
            f"bucket {bucket!r} is full ({limit}): write to {key!r} refused; delete or "
            "purge keys, or raise max_bytes (`flowtide kv edit BUCKET --max-bytes N`)",
            bucket=bucket,
            key=key,
        )


class ReadOnlyBucketError(KVError):
    """A write to a mirror bucket: a mirror is a read replica of `origin`, and writes go
    to the origin bucket (ADR-8)."""

    refused = True

    def __init__(self, bucket: str, key: str | None, *, origin: str) -> None:
        self.origin = origin
        super().__init__(
            f"bucket {bucket!r} is a read-only mirror of {origin!r}: write to {key!r} "
            f"refused; write to bucket {origin!r} instead (the mirror follows it)",
            bucket=bucket,
            key=key,
        )


class KVUnavailable(FlowtideError):
    """A bucket could not be opened (bad URL or bucket name, server unreachable or
    refusing); the message names the URL without its secret."""

    refused = True


class CreateManyError(KVError):
    """`create_many` could not write some items for another reason than an existing key
    (the server refused or did not answer); every other item was processed.

    `key` is the first failed item's key and `__cause__` its error. `results` is what
    `create_many` would have returned, None also for the failed items; `errors` maps each
    failed item's index to its error.
    """

    def __init__(
        self, bucket: str, results: list[int | None], errors: dict[int, KVError], total: int
    ) -> None:
        self.results = results
        self.errors = errors
        first = errors[min(errors)]
        key = first.key or "?"
        super().__init__(
            f"create_many in bucket {bucket!r}: {len(errors)} of {total} items not written; "
            f"first, key {key!r}: {first.message}",
            bucket=bucket,
            key=first.key,
        )
