"""The `nats` tool: NATS KV, object store, JetStream and core publish/request from a
playbook step.

The operations, their fields and their results are NoETL's (`noetl/tools/nats/
executor.py`, its OPERATIONS table), plus core NATS `publish` and `request`::

    kv_get     bucket, key          {status: success, bucket, key, value, revision, created}
                                    a missing key: {status: not_found, bucket, key, value: null}
    kv_put     bucket, key, value   {status: success, bucket, key, revision}
    kv_delete  bucket, key          {status: success, bucket, key}
    kv_keys    bucket [, pattern]   {status: success, bucket, keys, count}  (pattern: fnmatch)
    kv_purge   bucket, key          {status: success, bucket, key}
    object_get bucket, name [, encoding: utf-8|base64]  {status, bucket, name, data, size}
    object_put bucket, name, data [, encoding, description]  {status, bucket, name, size, digest}
    object_delete / object_info / object_list  (bucket [, name])
    js_publish subject, data [, stream, headers]   {status: success, stream, seq, duplicate}
    js_get_msg stream, seq | subject | last: true  {status, stream, subject, seq, data, time, headers}
    js_stream_info stream           {status, stream, config: {...}, state: {...}}
    publish    subject [, data, headers]            {status: success, subject}
    request    subject [, data, headers, timeout]   {status: success, subject, data, headers}

`auth` names the credential with the server (`flowtide.tools.nats_conn`). KV operations
go through flowtide's own KV port (`flowtide.kv`, its NATS JetStream adapter); the others
through nats-py on the same pooled connections.

Values: a string is stored as its UTF-8 bytes; anything else (a mapping, a list, a
number, a bool) as its JSON text (NoETL stores dicts and lists as JSON, and other values
as `str()`: a bool read back is then `True`, not `true`). Read back, a value that is JSON
is returned decoded, any other text as text, an empty value as null, bytes that are not
UTF-8 as base64 text (with `encoding: base64` in the result).

Where flowtide differs: `kv_put` and `object_put` create a missing bucket (a KV bucket
with `history` (default 1) and `ttl` seconds, the fields of the task); every other
operation on a missing bucket fails with kind `not_found`. Errors are `ToolError`s of
the kinds a policy tests: `not_found` (a bucket, object, stream; a `request` nobody
answers: code `no_responders`, retryable), `timeout` (retryable), `auth` (a refused
user, password or token, or a subject the user may not use), `connection`
(retryable), `config_error`. No message holds a password or token.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import fnmatch
import json
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from flowtide.errors import NatsError, ToolError
from flowtide.kv import (
    BucketNotFoundError,
    InvalidKeyError,
    KeyNotFoundError,
    KVError,
    ValueTooLargeError,
)
from flowtide.tools.base import ToolContext, positive_field, redact
from flowtide.tools.builtin import NATS_OPERATIONS
from flowtide.tools.nats_conn import Link, NatsTarget, run_on_loop, target_of
from flowtide.urls import scrub_url

__all__ = ["DEFAULT_REQUEST_TIMEOUT", "DEFAULT_TIMEOUT", "NatsTool"]

#: Seconds a nats task may take (its `timeout` when set).
DEFAULT_TIMEOUT = 30.0
#: Seconds `request` waits for its reply (its `timeout` when set).
DEFAULT_REQUEST_TIMEOUT = 5.0

_Op = Callable[[Link, Mapping[str, Any]], Coroutine[Any, Any, dict[str, Any]]]


def _invalid(message: str) -> ToolError:
    return ToolError(message, kind="config_error")


# ---------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------


def encode(value: Any, encoding: str = "utf-8") -> bytes:
    """What is stored for `value`: a string's bytes (`encoding: base64` decodes it),
    anything else as its JSON text."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        if encoding == "base64":
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise _invalid("data is not valid base64") from None
        return value.encode("utf-8")
    try:
        return json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise _invalid(f"the value cannot be written as JSON: {exc}") from None


def decode(data: bytes | None) -> tuple[Any, str | None]:
    """(the value, None), or (base64 text, "base64") for bytes that are not UTF-8."""
    if not data:
        return None, None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"
    try:
        return json.loads(text), None
    except ValueError:
        return text, None


def _headers(config: Mapping[str, Any]) -> dict[str, str] | None:
    headers = config.get("headers")
    if headers in (None, ""):
        return None
    if not isinstance(headers, Mapping):
        raise _invalid("`headers` must be a mapping of names to values")
    return {str(k): str(v) for k, v in headers.items()}


def _when(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat()


# ---------------------------------------------------------------------------------------
# KV, through flowtide's KV port
# ---------------------------------------------------------------------------------------


async def _kv_get(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    bucket, key = str(c["bucket"]), str(c["key"])
    kv = await link.bucket(bucket, create=False)
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return {"status": "not_found", "bucket": bucket, "key": key, "value": None}
    value, encoding = decode(entry.value)
    result = {
        "status": "success",
        "bucket": bucket,
        "key": key,
        "value": value,
        "revision": entry.revision,
        "created": _when(entry.created),
    }
    if encoding:
        result["encoding"] = encoding
    return result


async def _kv_put(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    bucket, key = str(c["bucket"]), str(c["key"])
    data = encode(c.get("value"))
    history = c.get("history")
    config = {"ttl": positive_field(c, "ttl"), "history": int(history) if history else 1}
    try:
        revision = await (await link.bucket(bucket, create=True, **config)).put(key, data)
    except BucketNotFoundError:
        # The handle was on a bucket deleted since: make it again.
        await link.forget(bucket)
        revision = await (await link.bucket(bucket, create=True, **config)).put(key, data)
    return {"status": "success", "bucket": bucket, "key": key, "revision": revision}


async def _kv_delete(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    bucket, key = str(c["bucket"]), str(c["key"])
    await (await link.bucket(bucket, create=False)).delete(key)
    return {"status": "success", "bucket": bucket, "key": key}


async def _kv_purge(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    bucket, key = str(c["bucket"]), str(c["key"])
    await (await link.bucket(bucket, create=False)).purge(key)
    return {"status": "success", "bucket": bucket, "key": key}


async def _kv_keys(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    bucket = str(c["bucket"])
    keys = await (await link.bucket(bucket, create=False)).keys()
    pattern = c.get("pattern")
    if pattern not in (None, ""):
        keys = [k for k in keys if fnmatch.fnmatchcase(k, str(pattern))]
    return {"status": "success", "bucket": bucket, "keys": keys, "count": len(keys)}


# ---------------------------------------------------------------------------------------
# Object store, JetStream and core NATS, through nats-py
# ---------------------------------------------------------------------------------------


async def _object_store(link: Link, bucket: str, *, create: bool = False) -> Any:
    from nats.js.errors import BucketNotFoundError as NoBucket

    js = (await link.client()).jetstream()
    try:
        return await js.object_store(bucket)
    except NoBucket:
        if not create:
            raise
        return await js.create_object_store(bucket)


def _object_fields(info: Any) -> dict[str, Any]:
    return {"size": info.size, "mtime": info.mtime, "digest": info.digest}


async def _object_get(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    bucket, name = str(c["bucket"]), str(c["name"])
    found = await (await _object_store(link, bucket)).get(name)
    data: bytes = found.data or b""
    encoding = str(c.get("encoding") or "utf-8")
    if encoding in ("base64", "binary"):
        value = base64.b64encode(data).decode("ascii")
    else:
        try:
            value = data.decode(encoding)
        except (LookupError, UnicodeDecodeError) as exc:
            raise _invalid(f"object {name!r} cannot be read as {encoding}: {exc}") from None
    return {"status": "success", "bucket": bucket, "name": name, "data": value, "size": len(data)}


async def _object_put(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    from nats.js.api import ObjectMeta

    bucket, name = str(c["bucket"]), str(c["name"])
    data = encode(c.get("data"), str(c.get("encoding") or "utf-8"))
    meta = (
        ObjectMeta(name=name, description=str(c["description"])) if c.get("description") else None
    )
    info = await (await _object_store(link, bucket, create=True)).put(name, data, meta=meta)
    return {
        "status": "success",
        "bucket": bucket,
        "name": name,
        "size": info.size,
        "digest": info.digest,
    }


async def _object_delete(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    bucket, name = str(c["bucket"]), str(c["name"])
    await (await _object_store(link, bucket)).delete(name)
    return {"status": "success", "bucket": bucket, "name": name}


async def _object_info(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    bucket, name = str(c["bucket"]), str(c["name"])
    info = await (await _object_store(link, bucket)).get_info(name)
    fields = {**_object_fields(info), "chunks": info.chunks}
    return {"status": "success", "bucket": bucket, "name": name, **fields}


async def _object_list(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    from nats.js.errors import NotFoundError

    bucket = str(c["bucket"])
    store = await _object_store(link, bucket)
    try:
        infos = await store.list(ignore_deletes=True)
    except NotFoundError:  # nats-py's word for an empty store
        infos = []
    objects = [{"name": info.name, **_object_fields(info)} for info in infos]
    return {"status": "success", "bucket": bucket, "objects": objects, "count": len(objects)}


async def _js_publish(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    js = (await link.client()).jetstream()
    stream = str(c["stream"]) if c.get("stream") else None
    payload = encode(c.get("data"))
    ack = await js.publish(str(c["subject"]), payload, stream=stream, headers=_headers(c))
    duplicate = bool(ack.duplicate)
    return {"status": "success", "stream": ack.stream, "seq": ack.seq, "duplicate": duplicate}


async def _js_get_msg(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    js = (await link.client()).jetstream()
    stream = str(c["stream"])
    if c.get("seq"):
        msg = await js.get_msg(stream, seq=int(c["seq"]))
    elif c.get("subject"):
        msg = await js.get_msg(stream, subject=str(c["subject"]))
    elif c.get("last"):
        info = await js.stream_info(stream)
        msg = await js.get_msg(stream, seq=info.state.last_seq)
    else:
        raise _invalid("js_get_msg needs `seq`, `subject` or `last: true`")
    data, _ = decode(msg.data)
    return {
        "status": "success",
        "stream": stream,
        "subject": msg.subject,
        "seq": msg.seq,
        "data": data,
        "time": str(msg.time) if getattr(msg, "time", None) else None,
        "headers": dict(msg.headers) if msg.headers else None,
    }


async def _js_stream_info(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    stream = str(c["stream"])
    info = await (await link.client()).jetstream().stream_info(stream)
    config, state = info.config, info.state
    return {
        "status": "success",
        "stream": stream,
        "config": {
            "name": config.name,
            "subjects": list(config.subjects or []),
            "retention": str(config.retention) if config.retention else None,
            "max_msgs": config.max_msgs,
            "max_bytes": config.max_bytes,
            "max_age": config.max_age,
        },
        "state": {
            "messages": state.messages,
            "bytes": state.bytes,
            "first_seq": state.first_seq,
            "last_seq": state.last_seq,
            "consumer_count": state.consumer_count,
        },
    }


async def _publish(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    nc = await link.client()
    payload = b"" if c.get("data") is None else encode(c["data"])
    await nc.publish(str(c["subject"]), payload, headers=_headers(c))
    await nc.flush(timeout=int(DEFAULT_REQUEST_TIMEOUT))
    return {"status": "success", "subject": str(c["subject"])}


async def _request(link: Link, c: Mapping[str, Any]) -> dict[str, Any]:
    nc = await link.client()
    payload = b"" if c.get("data") is None else encode(c["data"])
    wait = positive_field(c, "timeout", default=DEFAULT_REQUEST_TIMEOUT) or DEFAULT_REQUEST_TIMEOUT
    msg = await nc.request(str(c["subject"]), payload, timeout=wait, headers=_headers(c))
    data, encoding = decode(msg.data)
    result = {
        "status": "success",
        "subject": str(c["subject"]),
        "data": data,
        "headers": dict(msg.headers) if msg.headers else None,
    }
    if encoding:
        result["encoding"] = encoding
    return result


_OPERATIONS: dict[str, _Op] = {
    "kv_get": _kv_get,
    "kv_put": _kv_put,
    "kv_delete": _kv_delete,
    "kv_keys": _kv_keys,
    "kv_purge": _kv_purge,
    "object_get": _object_get,
    "object_put": _object_put,
    "object_delete": _object_delete,
    "object_list": _object_list,
    "object_info": _object_info,
    "js_publish": _js_publish,
    "js_get_msg": _js_get_msg,
    "js_stream_info": _js_stream_info,
    "publish": _publish,
    "request": _request,
}
assert set(_OPERATIONS) == set(NATS_OPERATIONS), "the spec and the tool disagree"


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def _error(exc: BaseException, what: str, target: NatsTarget, ctx: ToolContext) -> ToolError:
    """A NATS or KV failure as the ToolError a policy sees, without any secret."""
    import nats.errors
    import nats.js.errors

    def hidden(text: str) -> str:
        return redact(scrub_url(text, target.url), ctx.secrets)

    message = str(getattr(exc, "message", "") or exc) or type(exc).__name__
    text = f"{what}: {hidden(message)}"
    lowered = message.lower()
    if isinstance(exc, ToolError):
        exc.message = hidden(exc.message)
        return exc
    if isinstance(exc, nats.errors.NoRespondersError):
        return ToolError(
            f"{what}: no one answers on this subject",
            kind="not_found",
            retryable=True,
            code="no_responders",
        )
    if isinstance(exc, BucketNotFoundError | nats.js.errors.NotFoundError) or (
        isinstance(exc, nats.js.errors.NoStreamResponseError)
    ):
        return ToolError(text, kind="not_found", code="not_found")
    if isinstance(exc, InvalidKeyError | ValueTooLargeError):
        return ToolError(text, kind="config_error")
    if isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in lowered:
        return ToolError(
            f"{what}: NATS at {target.shown} refused the credentials (wrong user, password or"
            " token)",
            kind="auth",
            code="authorization_violation",
        )
    if "permissions violation" in lowered:
        return ToolError(text, kind="auth", code="permission_denied")
    if isinstance(exc, TimeoutError | nats.errors.TimeoutError) or "no reply" in lowered:
        return ToolError(text, kind="timeout", retryable=True, code="timeout")
    if isinstance(exc, KVError | NatsError | OSError | nats.errors.Error):
        retryable = "cannot connect" in lowered or isinstance(
            exc, OSError | nats.errors.ConnectionClosedError | nats.errors.NoServersError
        )
        kind = "connection" if retryable else "nats_error"
        return ToolError(text, kind=kind, retryable=retryable)
    return ToolError(text, kind="nats_error")


# ---------------------------------------------------------------------------------------
# The tool
# ---------------------------------------------------------------------------------------


class NatsTool:
    """NATS KV, object store, JetStream and core operations (tool kind `nats`); see the
    module docstring."""

    kind = "nats"

    def run(self, config: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        name = config.get("operation")
        if not isinstance(name, str) or name not in _OPERATIONS:
            raise _invalid(
                f"unknown nats operation {name!r}: expected one of {', '.join(_OPERATIONS)}"
            )
        for field in NATS_OPERATIONS[name]:
            if config.get(field) is None or (field != "value" and config.get(field) == ""):
                raise _invalid(f"nats operation '{name}' needs `{field}`")
        target = target_of(config, ctx)
        operation = _OPERATIONS[name]
        what = f"nats {name}"
        timeout = ctx.timeout or DEFAULT_TIMEOUT
        if name == "request":
            # The reply's own wait, and the connect before it.
            timeout = max(timeout, (positive_field(config, "timeout") or 0) + 10.0)
        try:
            return run_on_loop(
                lambda link: operation(link, config),
                target,
                timeout=timeout,
                cancelled=ctx.cancelled,
                what=what,
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes a ToolError here
            raise _error(exc, what, target, ctx) from None
