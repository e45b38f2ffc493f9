"""A bucket's stream (`KV_<bucket>`): the configuration a new bucket gets (ADR-8, with
the value-size deviation; ADR-8 topologies: mirror and sources; ADR-48 limit markers),
what an existing stream's configuration says about its bucket, binding a bucket (look
the stream up, create it if allowed and missing) and changing an existing bucket's
settings in place (`$JS.API.STREAM.UPDATE`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from flowtide.kv.base import (
    BucketConfig,
    BucketNotFoundError,
    KVError,
    Placement,
    Republish,
    StorageType,
)
from flowtide.kv.nats.connection import _Connection
from flowtide.kv.nats.protocol import _ERR_STREAM_NAME_IN_USE, _ERR_STREAM_NOT_FOUND, _ApiError
from flowtide.kv.options import SETTINGS, as_found, check_changes

#: "replicas > 1 not supported in non-clustered mode".
_ERR_NOT_CLUSTERED: Final = 10074

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
    max_bytes: int | None = None
    placement: Placement | None = None
    republish: Republish | None = None
    # The origin bucket of a mirror: its keys are `$KV.<origin>.<key>`, and reads go to
    # the origin's Direct Get subject, which the origin and its mirrors answer.
    mirror: str | None = None
    sources: tuple[str, ...] = ()
    limit_marker_ttl: float | None = None
    # The stream whose Direct Get subject reads use.
    direct_stream: str = ""


def _ns(seconds: float | None) -> int:
    return round(seconds * 1e9) if seconds is not None else 0


def _set_fields(stream: dict[str, Any], config: BucketConfig, fields: frozenset[str]) -> None:
    """Write the settings `fields` of `config` into the stream configuration `stream`."""
    b = config.bucket
    if "history" in fields:
        stream["max_msgs_per_subject"] = config.history
    if "ttl" in fields:
        ttl_ns = _ns(config.ttl)
        stream["max_age"] = ttl_ns
        # ADR-8: the duplicate window is max_age when that is under two minutes.
        stream["duplicate_window"] = (
            min(ttl_ns, _MAX_DUPLICATE_WINDOW_NS) if ttl_ns else _MAX_DUPLICATE_WINDOW_NS
        )
    if "max_value_size" in fields:
        metadata = dict(stream.get("metadata") or {})
        if config.max_value_size is None:
            stream["max_msg_size"] = -1
            metadata.pop(_META_MAX_VALUE, None)
        else:
            stream["max_msg_size"] = config.max_value_size + _HEADER_ALLOWANCE
            metadata[_META_MAX_VALUE] = str(config.max_value_size)
        if metadata:
            stream["metadata"] = metadata
        else:
            stream.pop("metadata", None)
    if "max_bytes" in fields:
        stream["max_bytes"] = config.max_bytes if config.max_bytes is not None else -1
    if "storage" in fields:
        stream["storage"] = config.storage
    if "replicas" in fields:
        stream["num_replicas"] = config.replicas
    if "compression" in fields:
        stream["compression"] = "s2" if config.compression else "none"
    if "placement" in fields:
        if config.placement is None:
            stream.pop("placement", None)
        else:
            placement: dict[str, Any] = {}
            if config.placement.cluster:
                placement["cluster"] = config.placement.cluster
            if config.placement.tags:
                placement["tags"] = list(config.placement.tags)
            stream["placement"] = placement
    if "republish" in fields:
        rp = config.republish
        if rp is None:
            stream.pop("republish", None)
        else:
            stream["republish"] = {
                "src": f"$KV.{b}.{rp.source}",
                "dest": rp.destination,
                "headers_only": rp.headers_only,
            }
    if "sources" in fields:
        # ADR-8 aggregates: each origin's `$KV.<origin>.>` lands as `$KV.<bucket>.>`.
        stream["sources"] = [
            {
                "name": f"KV_{src}",
                "subject_transforms": [{"src": f"$KV.{src}.>", "dest": f"$KV.{b}.>"}],
            }
            for src in config.sources
        ]
        if not config.sources:
            stream.pop("sources", None)
    if "limit_marker_ttl" in fields and config.limit_marker_ttl is not None:
        stream["allow_msg_ttl"] = True
        stream["subject_delete_marker_ttl"] = _ns(config.limit_marker_ttl)


def _stream_config(config: BucketConfig) -> dict[str, Any]:
    """The configuration of a new bucket's stream."""
    stream: dict[str, Any] = {
        "name": f"KV_{config.bucket}",
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": -1,
        "discard": "new",
        "deny_delete": True,
        "deny_purge": False,
        "allow_direct": True,
    }
    if config.mirror is None:
        stream["subjects"] = [f"$KV.{config.bucket}.>"]
        stream["allow_rollup_hdrs"] = True
    else:
        # ADR-8 read replica: no subjects (writes go to the origin), no purges, and it
        # answers Direct Gets sent to the origin (mirror_direct).
        stream["mirror"] = {"name": f"KV_{config.mirror}"}
        stream["mirror_direct"] = True
        stream["deny_purge"] = True
    _set_fields(stream, config, frozenset(SETTINGS) - {"mirror"})
    return stream


def _bucket_info(bucket: str, config: dict[str, Any]) -> _BucketInfo:
    stream = f"KV_{bucket}"
    mirror_of = (config.get("mirror") or {}).get("name") or ""
    origin = mirror_of[3:] if mirror_of.startswith("KV_") else None
    source_bucket = origin or bucket
    prefix = f"$KV.{source_bucket}."
    if origin is None and f"{prefix}>" not in (config.get("subjects") or []):
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
    max_bytes = int(config.get("max_bytes") or -1)
    raw_placement = config.get("placement") or {}
    placement = (
        as_found(
            Placement,
            cluster=raw_placement.get("cluster") or None,
            tags=tuple(raw_placement.get("tags") or ()),
        )
        if raw_placement.get("cluster") or raw_placement.get("tags")
        else None
    )
    raw_rp = config.get("republish") or {}
    republish: Republish | None = None
    if raw_rp.get("dest"):
        src = str(raw_rp.get("src") or ">")
        republish = as_found(
            Republish,
            destination=str(raw_rp["dest"]),
            source=src[len(prefix) :] if src.startswith(prefix) else src,
            headers_only=bool(raw_rp.get("headers_only")),
        )
    sources = tuple(
        str(s["name"])[3:]
        for s in config.get("sources") or []
        if str(s.get("name") or "").startswith("KV_")
    )
    marker_ns = int(config.get("subject_delete_marker_ttl") or 0)
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
        max_bytes=max_bytes if max_bytes > 0 else None,
        placement=placement,
        republish=republish,
        mirror=origin,
        sources=sources,
        limit_marker_ttl=marker_ns / 1e9 if config.get("allow_msg_ttl") and marker_ns else None,
        direct_stream=mirror_of if origin else stream,
    )


async def _require_msg_ttl(conn: _Connection, bucket: str, timeout: float) -> None:
    """Refuse limit markers on a server without per-message TTL (API level < 1: before
    nats-server 2.11), which would ignore the setting (ADR-48)."""
    reply = await conn.api("$JS.API.INFO", None, timeout=timeout)
    level = int((reply.get("api") or {}).get("level") or 0)
    if level < 1:
        raise KVError(
            f"the NATS server at {conn.shown} does not support per-value TTL "
            "(limit_marker_ttl needs nats-server 2.11 or newer); upgrade it, or leave "
            "limit_marker_ttl unset",
            bucket=bucket,
        )


async def _require_sources(conn: _Connection, config: BucketConfig, timeout: float) -> None:
    """KVError naming the first of `config.sources` that is no bucket: JetStream would
    accept it and source nothing until such a bucket appears."""
    for name in config.sources:
        try:
            await conn.api(f"$JS.API.STREAM.INFO.KV_{name}", None, timeout=timeout)
        except _ApiError as exc:
            if exc.err_code != _ERR_STREAM_NOT_FOUND:
                raise
            raise KVError(
                f"bucket {config.bucket!r} cannot source {name!r}: no bucket {name!r} at "
                f"{conn.shown}; create it first (`flowtide kv add {name}`) or fix the name",
                bucket=config.bucket,
            ) from None


async def _apply(
    conn: _Connection,
    config: BucketConfig,
    current: dict[str, Any],
    fields: frozenset[str],
    timeout: float,
) -> dict[str, Any]:
    """Change the settings `fields` of `config` that differ from the bucket's (stream
    configuration `current`) with `$JS.API.STREAM.UPDATE`; returns the stream info to
    bind with (the update's reply, or none when nothing changed)."""
    bucket = config.bucket
    info = _bucket_info(bucket, current)
    changes: dict[str, tuple[Any, Any]] = {
        name: (getattr(info, name), getattr(config, name))
        for name in SETTINGS
        if name in fields and getattr(info, name) != getattr(config, name)
    }
    if not changes:
        return {}
    check_changes(bucket, changes)
    if info.mirror is not None and changes.keys() & {"republish", "sources", "limit_marker_ttl"}:
        raise KVError(
            f"bucket {bucket!r} is a mirror of {info.mirror!r}: set republish, sources and "
            f"limit_marker_ttl on {info.mirror!r}",
            bucket=bucket,
        )
    if "limit_marker_ttl" in changes:
        await _require_msg_ttl(conn, bucket, timeout)
    if "sources" in changes:
        await _require_sources(conn, config, timeout)
    stream = dict(current)
    _set_fields(stream, config, frozenset(changes))
    return dict(await conn.api(f"$JS.API.STREAM.UPDATE.KV_{bucket}", stream, timeout=timeout))


async def _bind_bucket(
    conn: _Connection,
    config: BucketConfig,
    timeout: float,
    create: bool = True,
    apply: frozenset[str] | None = None,
) -> _BucketInfo:
    bucket = config.bucket
    stream = f"KV_{bucket}"
    try:
        try:
            reply = await conn.api(f"$JS.API.STREAM.INFO.{stream}", None, timeout=timeout)
            if apply:
                reply = await _apply(conn, config, reply["config"], apply, timeout) or reply
        except _ApiError as exc:
            if exc.err_code != _ERR_STREAM_NOT_FOUND:
                raise
            if not create:
                raise BucketNotFoundError(bucket) from None
            if config.limit_marker_ttl is not None:
                await _require_msg_ttl(conn, bucket, timeout)
            await _require_sources(conn, config, timeout)
            if config.mirror is not None:
                # ADR-8: a read replica needs Direct Get on its origin.
                try:
                    origin = await conn.api(
                        f"$JS.API.STREAM.INFO.KV_{config.mirror}", None, timeout=timeout
                    )
                except _ApiError as exc3:
                    if exc3.err_code != _ERR_STREAM_NOT_FOUND:
                        raise
                    raise KVError(
                        f"cannot create bucket {bucket!r} as a mirror of {config.mirror!r}: "
                        f"no bucket {config.mirror!r} at {conn.shown}",
                        bucket=bucket,
                    ) from None
                if not origin["config"].get("allow_direct"):
                    raise KVError(
                        f"bucket {config.mirror!r} has no Direct Get (allow_direct), so a "
                        "mirror of it could not serve its reads",
                        bucket=bucket,
                    ) from None
                # Reads of the origin may be answered by the mirror: it keeps at least
                # the origin's history per key, so history() does not depend on which.
                origin_history = int(origin["config"].get("max_msgs_per_subject") or 1)
                config = replace(config, history=max(config.history, origin_history))
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
        hint = ""
        if exc.err_code == _ERR_NOT_CLUSTERED:
            hint = (
                f"; {config.replicas} replicas need a NATS cluster of at least"
                f" {config.replicas} nodes, and this NATS server is not clustered"
            )
        raise KVError(
            f"cannot open bucket {bucket!r} at {conn.shown}: {exc}{hint}", bucket=bucket
        ) from None
    except KVError as exc:
        exc.bucket = bucket
        raise
    return _bucket_info(bucket, reply["config"])
