"""The KV port (ADR-8 key-value buckets) and `connect`, which picks the adapter by URL.

    kv = await connect("memory://", "flowtide_state", history=1, ttl=3600)
    rev = await kv.create("exec.1.loop.fetch.0.done", b"1")

See `flowtide.kv.base` for the semantics every adapter follows.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flowtide.kv.base import (
    MAX_HISTORY,
    BucketConfig,
    BucketNotFoundError,
    Entry,
    InvalidKeyError,
    KeyExistsError,
    KeyNotFoundError,
    KeyValue,
    KeyWatcher,
    KVError,
    Operation,
    Status,
    StorageType,
    ValueTooLargeError,
    WrongRevisionError,
    decode_key_token,
    encode_key_token,
)

__all__ = [
    "MAX_HISTORY",
    "BucketConfig",
    "BucketNotFoundError",
    "Entry",
    "InvalidKeyError",
    "KVError",
    "KeyExistsError",
    "KeyNotFoundError",
    "KeyValue",
    "KeyWatcher",
    "Operation",
    "Status",
    "StorageType",
    "ValueTooLargeError",
    "WrongRevisionError",
    "connect",
    "decode_key_token",
    "encode_key_token",
]

# Schemes a NATS server URL may use (nats-py accepts all of them).
_NATS_SCHEMES = frozenset({"nats", "tls", "ws", "wss"})


async def connect(
    url: str,
    bucket: str,
    *,
    history: int = 1,
    ttl: float | None = None,
    max_value_size: int | None = None,
    storage: StorageType = "file",
    replicas: int = 1,
    compression: bool = False,
) -> KeyValue:
    """Open bucket `bucket` at `url`, creating it with this configuration if it is missing.

    An existing bucket is bound as it is; the configuration only applies on creation.

    Args:
        url: `memory://` (in-process, shared by every connect in the process) or a NATS
            server URL (`nats://host:4222`, not available yet).
        bucket: the bucket name, `[a-zA-Z0-9_-]+`.
        history: messages kept per key, 1..64.
        ttl: seconds a message lives; None for no expiry.
        max_value_size: largest value in bytes; None for no limit.
        storage: "file" or "memory" (JetStream storage; reported only by `memory://`).
        replicas: JetStream replicas, 1..5 (reported only by `memory://`).
        compression: JetStream s2 compression (reported only by `memory://`).
    Returns:
        A handle implementing `KeyValue`.
    Raises:
        InvalidKeyError: the bucket name is invalid.
        KVError: a configuration value is out of range, or the URL scheme is unsupported
            or its adapter is not available.
    """
    config = BucketConfig(
        bucket=bucket,
        history=history,
        ttl=ttl,
        max_value_size=max_value_size,
        storage=storage,
        replicas=replicas,
        compression=compression,
    )
    scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
    if scheme == "memory":
        from flowtide.kv.memory import open_memory

        return open_memory(url, config)
    if scheme in _NATS_SCHEMES:
        raise KVError(
            f"cannot open {url!r}: the NATS JetStream KV adapter is not installed yet "
            "(flowtide.kv.nats); use 'memory://' for now",
            bucket=bucket,
        )
    raise KVError(
        f"unsupported KV URL {url!r}: expected 'memory://' or 'nats://host:port'", bucket=bucket
    )
