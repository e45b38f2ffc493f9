"""The KV port (ADR-8 key-value buckets) and `connect`, which picks the adapter by URL.

    kv = await connect("memory://", "flowtide_state", history=1, ttl=3600)
    rev = await kv.create("exec.1.loop.fetch.0.done", b"1")

See `flowtide.kv.base` for the semantics every adapter follows, `flowtide.kv.lock` for
leases with fencing tokens on one key (`KVLock`, `Election`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from flowtide.kv.base import (
    CREATE_MANY_MAX,
    MAX_HISTORY,
    BucketConfig,
    BucketFullError,
    BucketNotFoundError,
    CreateManyError,
    Entry,
    InvalidKeyError,
    KeyExistsError,
    KeyNotFoundError,
    KeyValue,
    KeyWatcher,
    KVError,
    Operation,
    Placement,
    ReadOnlyBucketError,
    Republish,
    Status,
    StorageType,
    ValueTooLargeError,
    WrongRevisionError,
    decode_key_token,
    encode_key_token,
)
from flowtide.kv.election import Election
from flowtide.kv.errors import KVUnavailableError
from flowtide.kv.lock import KVLock, Lease, LeaseLostError, LockError, LockInfo, LockTimeoutError
from flowtide.kv.options import UNSET, Unset

if TYPE_CHECKING:
    from flowtide.natsauth import NatsAuth

__all__ = [
    "CREATE_MANY_MAX",
    "MAX_HISTORY",
    "UNSET",
    "BucketConfig",
    "BucketFullError",
    "BucketNotFoundError",
    "CreateManyError",
    "Election",
    "Entry",
    "InvalidKeyError",
    "KVError",
    "KVLock",
    "KVUnavailableError",
    "KeyExistsError",
    "KeyNotFoundError",
    "KeyValue",
    "KeyWatcher",
    "Lease",
    "LeaseLostError",
    "LockError",
    "LockInfo",
    "LockTimeoutError",
    "Operation",
    "Placement",
    "ReadOnlyBucketError",
    "Republish",
    "Status",
    "StorageType",
    "Unset",
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
    history: int | Unset = UNSET,
    ttl: float | None | Unset = UNSET,
    max_value_size: int | None | Unset = UNSET,
    storage: StorageType | Unset = UNSET,
    replicas: int | Unset = UNSET,
    compression: bool | Unset = UNSET,
    max_bytes: int | None | Unset = UNSET,
    placement: Placement | None | Unset = UNSET,
    republish: Republish | None | Unset = UNSET,
    mirror: str | None | Unset = UNSET,
    sources: Sequence[str] | Unset = UNSET,
    limit_marker_ttl: float | None | Unset = UNSET,
    create: bool = True,
    apply: bool = False,
    nats_auth: NatsAuth | None = None,
) -> KeyValue:
    """Open bucket `bucket` at `url`, creating it with these settings if it is missing.

    A setting not passed gets its default on creation. An existing bucket is bound as
    it is unless `apply=True`: then the settings passed explicitly (and only those:
    one left out is never reset to its default) are compared with the bucket's, and
    those that differ are changed in place (JetStream STREAM.UPDATE). `storage` and
    `mirror` cannot change in place, nor can `limit_marker_ttl` be turned off: such a
    change is refused with KVError saying what to do. Binding without `apply`
    (`flowtide kv ls`, a process passing its usual settings) never changes a bucket.

    With `create=False` a missing bucket is an error (tools that only look at a bucket
    must not create one from a typo).

    Args:
        url: `memory://` (in-process, shared by every connect in the process) or a NATS
            server URL: `nats://`, `tls://`, `ws://` or `wss://`, optionally with
            `user:password@` (or `token@`), several servers separated by commas. Every
            handle opened from one event loop on one URL shares one NATS connection.
        bucket: the bucket name, `[a-zA-Z0-9_-]+`.
        history: messages kept per key, 1..64 (default 1).
        ttl: seconds a message lives; None for no expiry (default; JetStream: at least
            0.1 s).
        max_value_size: largest value in bytes; None for no limit (default).
        storage: "file" (default) or "memory" (JetStream storage; `memory://` only
            reports it).
        replicas: JetStream replicas, 1..5 (default 1; `memory://` only reports it).
        compression: JetStream s2 compression (default off; `memory://` only reports it).
        max_bytes: bucket size limit in bytes; a write into a full bucket raises
            BucketFullError. None for no limit (default).
        placement: JetStream stream placement (cluster and/or tags; `memory://` only
            reports it).
        republish: republish writes on a NATS subject (`memory://` only reports it).
        mirror: make this bucket a read-only mirror of that bucket (NATS only).
        sources: buckets whose keys this bucket aggregates (NATS only).
        limit_marker_ttl: turn on per-value TTL (`create(..., ttl=)`) and markers for
            keys removed by a TTL, kept this many seconds (at least 1). NATS needs
            nats-server 2.11 or newer.
        create: create the bucket when it is missing (default); False to only bind.
        apply: change the settings passed explicitly on an existing bucket.
        nats_auth: NATS credentials for a URL without them (user and password, or a
            `.creds` file); see `flowtide.natsauth`. `memory://` ignores them.
    Returns:
        A handle implementing `KeyValue`.
    Raises:
        InvalidKeyError: the bucket name is invalid.
        BucketNotFoundError: `create=False` and there is no such bucket.
        KVError: a configuration value is out of range, a change cannot be applied,
            the URL scheme is unsupported, its adapter is not installed, or the NATS
            server cannot be reached or refuses the credentials (the message never
            includes the password).
    """
    given: dict[str, Any] = {
        "history": history,
        "ttl": ttl,
        "max_value_size": max_value_size,
        "storage": storage,
        "replicas": replicas,
        "compression": compression,
        "max_bytes": max_bytes,
        "placement": placement,
        "republish": republish,
        "mirror": mirror,
        "sources": sources if isinstance(sources, str | Unset) else tuple(sources),
        "limit_marker_ttl": limit_marker_ttl,
    }
    explicit = {name: value for name, value in given.items() if not isinstance(value, Unset)}
    config = BucketConfig(bucket=bucket, **explicit)
    changes = frozenset(explicit) if apply else None
    scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
    if scheme == "memory":
        from flowtide.kv.memory import open_memory

        return open_memory(url, config, create=create, apply=changes)
    if scheme in _NATS_SCHEMES:
        try:
            from flowtide.kv.nats import open_nats
        except ModuleNotFoundError as exc:
            if exc.name is None or not exc.name.startswith("nats"):
                raise
            raise KVError(
                "the NATS KV adapter needs nats-py: pip install 'flowtide[nats]'", bucket=bucket
            ) from exc
        return await open_nats(url, config, create=create, apply=changes, auth=nats_auth)
    shown = url.split("@", 1)[-1] if isinstance(url, str) else repr(url)  # no credentials
    raise KVError(
        f"unsupported KV URL '...{shown}': expected 'memory://' or 'nats://host:port'"
        if isinstance(url, str) and "@" in url
        else f"unsupported KV URL {url!r}: expected 'memory://' or 'nats://host:port'",
        bucket=bucket,
    )
