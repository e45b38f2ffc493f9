"""The KV port (ADR-8 key-value buckets) and `connect`, which picks the adapter by URL.

    kv = await connect("memory://", "flowtide_state", history=1, ttl=3600)
    rev = await kv.create("exec.1.loop.fetch.0.done", b"1")

See `flowtide.kv.base` for the semantics every adapter follows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from flowtide.kv.base import (
    CREATE_MANY_MAX,
    MAX_HISTORY,
    BucketConfig,
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
    Status,
    StorageType,
    ValueTooLargeError,
    WrongRevisionError,
    decode_key_token,
    encode_key_token,
)
from flowtide.kv.errors import KVUnavailableError

if TYPE_CHECKING:
    from flowtide.natsauth import NatsAuth

__all__ = [
    "CREATE_MANY_MAX",
    "MAX_HISTORY",
    "BucketConfig",
    "BucketNotFoundError",
    "CreateManyError",
    "Entry",
    "InvalidKeyError",
    "KVError",
    "KVUnavailableError",
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
    create: bool = True,
    nats_auth: NatsAuth | None = None,
) -> KeyValue:
    """Open bucket `bucket` at `url`, creating it with this configuration if it is missing.

    An existing bucket is bound as it is; the configuration only applies on creation.
    With `create=False` a missing bucket is an error (tools that only look at a bucket
    must not create one from a typo).

    Args:
        url: `memory://` (in-process, shared by every connect in the process) or a NATS
            server URL: `nats://`, `tls://`, `ws://` or `wss://`, optionally with
            `user:password@` (or `token@`), several servers separated by commas. Every
            handle opened from one event loop on one URL shares one NATS connection.
        bucket: the bucket name, `[a-zA-Z0-9_-]+`.
        history: messages kept per key, 1..64.
        ttl: seconds a message lives; None for no expiry (JetStream: at least 0.1 s).
        max_value_size: largest value in bytes; None for no limit.
        storage: "file" or "memory" (JetStream storage; `memory://` only reports it).
        replicas: JetStream replicas, 1..5 (`memory://` only reports it).
        compression: JetStream s2 compression (`memory://` only reports it).
        create: create the bucket when it is missing (default); False to only bind.
        nats_auth: NATS credentials for a URL without them (user and password, or a
            `.creds` file); see `flowtide.natsauth`. `memory://` ignores them.
    Returns:
        A handle implementing `KeyValue`.
    Raises:
        InvalidKeyError: the bucket name is invalid.
        BucketNotFoundError: `create=False` and there is no such bucket.
        KVError: a configuration value is out of range, the URL scheme is unsupported,
            its adapter is not installed, or the NATS server cannot be reached or
            refuses the credentials (the message never includes the password).
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

        return open_memory(url, config, create=create)
    if scheme in _NATS_SCHEMES:
        try:
            from flowtide.kv.nats import open_nats
        except ModuleNotFoundError as exc:
            if exc.name is None or not exc.name.startswith("nats"):
                raise
            raise KVError(
                "the NATS KV adapter needs nats-py: pip install 'flowtide[nats]'", bucket=bucket
            ) from exc
        return await open_nats(url, config, create=create, auth=nats_auth)
    shown = url.split("@", 1)[-1] if isinstance(url, str) else repr(url)  # no credentials
    raise KVError(
        f"unsupported KV URL '...{shown}': expected 'memory://' or 'nats://host:port'"
        if isinstance(url, str) and "@" in url
        else f"unsupported KV URL {url!r}: expected 'memory://' or 'nats://host:port'",
        bucket=bucket,
    )
