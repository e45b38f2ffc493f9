"""A bucket's stream (`KV_<bucket>`): the configuration a new bucket gets (ADR-8, with
the value-size deviation), what an existing stream's configuration says about its
bucket, and binding a bucket (look the stream up, create it if allowed and missing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from flowtide.kv.base import BucketConfig, BucketNotFoundError, KVError, StorageType
from flowtide.kv.nats.connection import _Connection
from flowtide.kv.nats.protocol import _ERR_STREAM_NAME_IN_USE, _ERR_STREAM_NOT_FOUND, _ApiError

# Room for the headers of the largest conditional write or marker (~90 bytes).
_HEADER_ALLOWANCE: Final = 128
_META_MAX_VALUE: Final = "flowtide.max_value_size"
_MAX_DUPLICATE_WINDOW_NS: Final = 120 * 10**9


@dataclass(frozen=True, slots=True)
class _BucketInfo:
    bucket: str
    stream: str
    prefix: str
    history: int
    ttl: float | None
    max_value_size: int | None
    storage: StorageType
    replicas: int
    compression: bool
    # Direct Get enabled (ADR-8 sets it; nats-py's create_key_value does not by default).
    direct: bool


def _stream_config(config: BucketConfig) -> dict[str, Any]:
    ttl_ns = round(config.ttl * 1e9) if config.ttl is not None else 0
    stream: dict[str, Any] = {
        "name": f"KV_{config.bucket}",
        "subjects": [f"$KV.{config.bucket}.>"],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs_per_subject": config.history,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": ttl_ns,
        "max_msg_size": -1,
        "storage": config.storage,
        "discard": "new",
        "num_replicas": config.replicas,
        "duplicate_window": min(ttl_ns, _MAX_DUPLICATE_WINDOW_NS)
        if ttl_ns
        else _MAX_DUPLICATE_WINDOW_NS,
        "allow_rollup_hdrs": True,
        "deny_delete": True,
        "deny_purge": False,
        "allow_direct": True,
        "compression": "s2" if config.compression else "none",
    }
    if config.max_value_size is not None:
        stream["max_msg_size"] = config.max_value_size + _HEADER_ALLOWANCE
        stream["metadata"] = {_META_MAX_VALUE: str(config.max_value_size)}
    return stream


def _bucket_info(bucket: str, config: dict[str, Any]) -> _BucketInfo:
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    if f"{prefix}>" not in (config.get("subjects") or []):
        raise KVError(
            f"stream {stream!r} is not a KV bucket (no subject '{prefix}>')", bucket=bucket
        )
    max_age = int(config.get("max_age") or 0)
    metadata = config.get("metadata") or {}
    max_value: int | None
    if _META_MAX_VALUE in metadata:
        max_value = int(metadata[_META_MAX_VALUE])
    else:
        max_msg_size = int(config.get("max_msg_size") or -1)
        max_value = max_msg_size if max_msg_size > 0 else None
    storage: StorageType = "memory" if config.get("storage") == "memory" else "file"
    return _BucketInfo(
        bucket=bucket,
        stream=stream,
        prefix=prefix,
        history=int(config.get("max_msgs_per_subject") or 0),
        ttl=max_age / 1e9 if max_age > 0 else None,
        max_value_size=max_value,
        storage=storage,
        replicas=int(config.get("num_replicas") or 1),
        compression=config.get("compression") == "s2",
        direct=bool(config.get("allow_direct")),
    )


async def _bind_bucket(
    conn: _Connection, config: BucketConfig, timeout: float, create: bool = True
) -> _BucketInfo:
    bucket = config.bucket
    stream = f"KV_{bucket}"
    try:
        try:
            reply = await conn.api(f"$JS.API.STREAM.INFO.{stream}", None, timeout=timeout)
        except _ApiError as exc:
            if exc.err_code != _ERR_STREAM_NOT_FOUND:
                raise
            if not create:
                raise BucketNotFoundError(bucket) from None
            try:
                reply = await conn.api(
                    f"$JS.API.STREAM.CREATE.{stream}", _stream_config(config), timeout=timeout
                )
            except _ApiError as exc2:
                # Another process created it between our look-up and our create.
                if exc2.err_code != _ERR_STREAM_NAME_IN_USE:
                    raise
                reply = await conn.api(f"$JS.API.STREAM.INFO.{stream}", None, timeout=timeout)
    except _ApiError as exc:
        raise KVError(
            f"cannot open bucket {bucket!r} at {conn.shown}: {exc}", bucket=bucket
        ) from None
    except KVError as exc:
        exc.bucket = bucket
        raise
    return _bucket_info(bucket, reply["config"])
