"""NATS JetStream adapter of the KV port (`nats://`, `tls://`, `ws://`, `wss://` URLs).

A bucket is the stream `KV_<bucket>` listening on `$KV.<bucket>.>` (ADR-8): key `k` is
the subject `$KV.<bucket>.k` and a revision is a stream sequence. How the port maps
onto JetStream:

- put, create, update, delete and purge publish to the key's subject and wait for the
  stream's ack. Compare-and-set uses `Nats-Expected-Last-Subject-Sequence`; the server
  answers a lost race with error 10071 (`wrong last sequence: N`, single server) or
  10164 (`wrong last sequence`, clustered, no number). delete and purge are `DEL` /
  `PURGE` markers (`KV-Operation`), purge with `Nats-Rollup: sub`.
- get, history and get_last_many use Direct Get (`$JS.API.DIRECT.GET.KV_<bucket>`),
  including ADR-31 batch and multi-last requests, whose replies are a run of messages
  ended by a `204 EOB` status message. nats-py 2.16 has neither, so each connection keeps
  one wildcard reply inbox for these multi-message replies. A multi-last request may
  match at most 1024 subjects (413 otherwise); get_last_many then lists the subjects
  (`$JS.API.STREAM.INFO` with `subjects_filter`) and pages at one point in time.
- keys and watch use ordered push consumers (ephemeral, flow control, idle heartbeats)
  implemented here: nats-py's `kv.keys(filters=...)` raises NoKeysError with a filter,
  and its ordered consumer reports a failed re-creation only to the error callback.
  keys is ADR-8's headers-only consumer delivering the last message per subject.
- purge_all is one `$JS.API.STREAM.PURGE.KV_<bucket>` request per filter.

Connections: one NATS connection per (URL, event loop), shared by every handle opened
from that loop and closed with the last of them (or when the loop shuts down). A handle
must be used from the loop that opened it.

Server restarts and outages: once connected, the client reconnects forever (every
0.5 s). A request issued while the server is away is buffered and sent on reconnect; it
succeeds if the reply comes within the request timeout (5 s), else it fails with
KVError, as does a request lost with the dying socket. A write that timed out may still
have been applied. The handle itself needs nothing: it works again once the server is
back, and watchers re-create their consumer from the revision after the last one they
delivered (also after missed heartbeats). Nothing above this module sees a nats-py
exception.

Deviations from ADR-8, and why:

- Value size. JetStream counts headers in `max_msg_size`, so a stream created with
  `max_msg_size = max_value_size` (ADR-8) refuses a CAS write whose value is within ~70
  bytes of the limit, and even a delete marker when the limit is below ~90 bytes. The
  adapter creates the stream with `max_value_size + 128` and keeps the exact limit in the
  stream metadata (`flowtide.max_value_size`), which it enforces before sending. A bucket
  created by another client is bound with `max_value_size = max_msg_size`, headers
  included, as other clients do.
- Buckets without `allow_direct` (nats-py's `create_key_value` makes them by default)
  are bound too, but read through the stream leader and ordered consumers instead of
  Direct Get: get uses `$JS.API.STREAM.MSG.GET`; history and get_last_many use a
  consumer (no 1024-key cap, but a get_last_many at a past revision reads every stored
  message under the filters).
- Reads follow ADR-8's consistency: on a replicated bucket a Direct Get may be served by
  a replica that lags. Only the compare-and-set error paths (`current` of
  WrongRevisionError, create's check for a delete marker) read from the stream leader
  (`$JS.API.STREAM.MSG.GET`).
- `destroy()` ends the handles and watchers on that bucket that share its connection at
  once; handles elsewhere find out on their next call (BucketNotFoundError) and
  watchers elsewhere within a few heartbeats.
- get_last_many with `up_to_revision` also reads the headers of the messages written
  since that revision (an ordered consumer) to report `delta` exactly.

Needs nats-server 2.11 or newer (batch and multi-last Direct Get).
"""

from __future__ import annotations

import asyncio
import base64
import calendar
import json
import logging
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from flowtide.errors import NatsError
from flowtide.kv.base import (
    END_OF_WATCH,
    BucketConfig,
    BucketNotFoundError,
    Entry,
    KeyExistsError,
    KeyFilter,
    KeyNotFoundError,
    KVError,
    Operation,
    QueueWatcher,
    Status,
    StorageType,
    ValueTooLargeError,
    WrongRevisionError,
    as_bytes,
    validate_key,
)
from flowtide.natsauth import (
    NatsAuth,
    bounded_connect,
    close_quietly,
    is_refusal,
    is_tls_failure,
    tls_hint,
)

__all__ = ["DEFAULT_TIMEOUT", "NatsKeyValue", "NatsWatcher", "open_nats", "redact_url"]

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT: Final = 5.0
_CONNECT_TIMEOUT: Final = 2.0
_CONNECT_ATTEMPTS: Final = 2
_RECONNECT_WAIT: Final = 0.5
# Room for the headers of the largest conditional write or marker (~90 bytes).
_HEADER_ALLOWANCE: Final = 128
_META_MAX_VALUE: Final = "flowtide.max_value_size"
_MAX_DUPLICATE_WINDOW_NS: Final = 120 * 10**9
_MULTI_LAST_MAX: Final = 1024
_BATCH_MAX: Final = 1000
_HEARTBEAT: Final = 1.0
_MISSED_HEARTBEATS: Final = 3
_CONSUMER_INACTIVE_NS: Final = 60 * 10**9
_CREATE_ATTEMPTS: Final = 10
_SCAN_ATTEMPTS: Final = 3
# A watcher answers the server's flow control only while its reader keeps up.
_FLOW_CONTROL_BACKLOG: Final = 4096

_HDR_EXPECTED_LAST: Final = "Nats-Expected-Last-Subject-Sequence"
_HDR_OPERATION: Final = "KV-Operation"
_HDR_ROLLUP: Final = "Nats-Rollup"
_HDR_MARKER_REASON: Final = "Nats-Marker-Reason"
_HDR_STATUS: Final = "Status"

_ERR_NO_MESSAGE: Final = 10037
_ERR_MESSAGE_TOO_LARGE: Final = 10054
_ERR_STREAM_NAME_IN_USE: Final = 10058
_ERR_STREAM_NOT_FOUND: Final = 10059
_ERR_WRONG_LAST_SEQUENCE: Final = 10071
_ERR_WRONG_LAST_SEQUENCE_CONSTANT: Final = 10164
_WRONG_LAST_SEQUENCE: Final = frozenset(
    {_ERR_WRONG_LAST_SEQUENCE, _ERR_WRONG_LAST_SEQUENCE_CONSTANT}
)

_WRONG_LAST_RE: Final = re.compile(r"wrong last sequence: (\d+)")
_TS_RE: Final = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?"
)


# ------------------------------------------------------------------------- helpers


def redact_url(url: str) -> str:
    """Hide the password (or token) of each server in a NATS URL, for messages and reprs.

    Args:
        url: one URL or several separated by commas.
    Returns:
        The URL with `user:***@` (`***@` for a token) in place of the credentials.
    """
    return ",".join(_redact_one(part.strip()) for part in url.split(","))


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"
    return urlunsplit(parts._replace(netloc=f"{shown}@{hostport}"))


def _secrets(url: str) -> list[str]:
    found: list[str] = []
    for part in url.split(","):
        netloc = urlsplit(part.strip()).netloc
        if "@" in netloc:
            userinfo = netloc.rpartition("@")[0]
            user, colon, password = userinfo.partition(":")
            secret = password if colon else user
            if secret:
                found.append(secret)
    return found


def _parse_ts(text: str) -> float:
    """An RFC 3339 (or Go default format) timestamp as epoch seconds; 0.0 if unreadable."""
    m = _TS_RE.match(text)
    if m is None:
        return 0.0
    year, month, day, hour, minute, second, frac, zone = m.groups()
    secs: float = calendar.timegm(
        (int(year), int(month), int(day), int(hour), int(minute), int(second), 0, 0, 0)
    )
    if frac:
        secs += int(frac[:9].ljust(9, "0")) / 1e9
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        secs -= sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)
    return secs


def _operation(headers: dict[str, str] | None) -> Operation:
    if not headers:
        return Operation.PUT
    op = headers.get(_HDR_OPERATION)
    if op == "DEL":
        return Operation.DEL
    if op == "PURGE":
        return Operation.PURGE
    # Markers the server places itself (subject delete markers, server 2.11+).
    reason = headers.get(_HDR_MARKER_REASON)
    if reason == "Remove":
        return Operation.DEL
    if reason in ("MaxAge", "Purge"):
        return Operation.PURGE
    return Operation.PUT


def _status(msg: Msg) -> str | None:
    headers = msg.headers
    return headers.get(_HDR_STATUS) if headers else None


def _num_pending(msg: Msg) -> int:
    headers = msg.headers or {}
    return int(headers.get("Nats-Num-Pending") or 0)


def _idle_after(msg: Msg, delivered: int) -> bool | None:
    """For an idle heartbeat: True when the consumer delivered exactly `delivered`
    messages and has nothing more to send, False when it delivered more (one was lost),
    None when it says nothing (stalled on flow control, or no count)."""
    headers = msg.headers or {}
    last = headers.get("Nats-Last-Consumer")
    if msg.reply or headers.get("Nats-Consumer-Stalled") or last is None:
        return None
    return int(last) == delivered


def _is_auth_error(exc: BaseException) -> bool:
    return is_refusal(exc)


# nats-py lowercases the server's -ERR text, subject included: compared lowercased.
_DENIED_RE: Final = re.compile(
    r'permissions violation for (publish|subscription) to "?([^"\s]+)', re.IGNORECASE
)


def _tokens(pattern: str) -> list[str]:
    return pattern.split(".")


def _subsumes(wide: list[str], narrow: list[str]) -> bool:
    """Whether every subject `narrow` matches is matched by `wide` too."""
    for i, token in enumerate(wide):
        if token == ">":
            return len(narrow) > i
        if i >= len(narrow) or narrow[i] == ">":
            return False
        if token != "*" and token != narrow[i]:
            return False
    return len(narrow) == len(wide)


def _reduce(filters: Sequence[str]) -> tuple[str, ...]:
    """Drop duplicate filters and those another filter covers (fewer requests, and no
    overlapping consumer filters)."""
    unique = list(dict.fromkeys(filters))
    if ">" in unique:
        return (">",)
    kept: list[str] = []
    for i, f in enumerate(unique):
        tokens = _tokens(f)
        covered = any(
            _subsumes(_tokens(other), tokens) and (not _subsumes(tokens, _tokens(other)) or j < i)
            for j, other in enumerate(unique)
            if j != i
        )
        if not covered:
            kept.append(f)
    return tuple(kept)


def _parse_header_block(raw: bytes) -> dict[str, str]:
    """Headers of a `$JS.API.STREAM.MSG.GET` reply ("NATS/1.0\\r\\nKey: value\\r\\n...")."""
    headers: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n")[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip()] = value.strip()
    return headers


class _ApiError(Exception):
    """A JetStream API error reply; translated by the caller, never escapes the module."""

    def __init__(self, error: dict[str, Any]) -> None:
        self.code = int(error.get("code") or 0)
        self.err_code = int(error.get("err_code") or 0)
        self.description = str(error.get("description") or "unknown error")
        super().__init__(f"{self.description} (JetStream error {self.err_code})")


class _NoResponders(Exception):
    """Nobody subscribes to the subject: no stream (or JetStream) behind it."""


class _TooLarge(Exception):
    """The message exceeds the server's max_payload."""


class _WrongLast(Exception):
    def __init__(self, current: int | None) -> None:
        self.current = current
        super().__init__(f"wrong last sequence (current {current})")


@dataclass(frozen=True, slots=True)
class _Delivery:
    key: str
    revision: int
    dseq: int
    pending: int
    created: float
    operation: Operation
    value: bytes


def _parse_delivery(msg: Msg, prefix: str) -> _Delivery | None:
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>, or the v2 form
    # with <domain>.<account hash> after ACK and a random token at the end.
    tokens = msg.reply.split(".")
    if len(tokens) == 9:
        off = 2
    elif len(tokens) >= 11:
        off = 4
    else:
        return None
    if not msg.subject.startswith(prefix):
        return None
    return _Delivery(
        key=msg.subject[len(prefix) :],
        revision=int(tokens[off + 3]),
        dseq=int(tokens[off + 4]),
        pending=int(tokens[off + 6]),
        created=int(tokens[off + 5]) / 1e9,
        operation=_operation(msg.headers),
        value=msg.data,
    )


@dataclass(slots=True)
class _Scan:
    done: asyncio.Future[bool]
    found: list[_Delivery] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Stored:
    subject: str
    revision: int
    headers: dict[str, str] | None
    value: bytes
    created: float


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


# ----------------------------------------------------------------------- connections


class _Connection:
    """One NATS connection shared by every handle of one (URL, credentials, event loop)."""

    def __init__(
        self, url: str, loop: asyncio.AbstractEventLoop, auth: NatsAuth | None = None
    ) -> None:
        self.url = url
        self.auth = auth if auth is not None else NatsAuth()
        self.shown = redact_url(url)
        self.loop = loop
        self.nc: Client | None = None
        self.refs = 0
        self.closed = False
        self.handles: weakref.WeakSet[NatsKeyValue] = weakref.WeakSet()
        self.watchers: weakref.WeakSet[NatsWatcher] = weakref.WeakSet()
        self._secrets = _secrets(url) + self.auth.secrets()
        # Subjects the server refused this user ("publish" or "subscription" -> subjects):
        # a refused request gets no reply, only an asynchronous -ERR; its timeout then
        # says why.
        self._denied: dict[str, set[str]] = {"publish": set(), "subscription": set()}
        self._connecting: asyncio.Task[None] | None = None
        self._waiting = 0
        self._connected_once = False
        self._last_error: BaseException | None = None
        # Any connect attempt refused for credentials: later attempts of the same
        # connect may only see the server hang up, which would hide the reason.
        self._refused = False
        # One warning per outage: the client retries every 0.5 s and reports each failure.
        self._warned = False
        self._mux_prefix: str | None = None
        self._mux_lock = asyncio.Lock()
        self._mux_waiters: dict[str, _Replies] = {}
        self._mux_next = 0
        # Clean-up work (unsubscribe, consumer delete) that must not be cancelled with
        # the caller; awaited before the connection closes.
        self._tasks: set[asyncio.Task[Any]] = set()
        self._guard: asyncio.Task[None] | None = None

    # -- lifecycle

    async def acquire(self) -> None:
        if self._connecting is None:
            self._connecting = self.loop.create_task(self._connect())
        self._waiting += 1
        try:
            # Shielded: one caller giving up must not cancel the others' connect.
            await asyncio.shield(self._connecting)
        except BaseException:
            self._waiting -= 1
            if self._waiting == 0 and self.refs == 0:
                self._connecting.add_done_callback(self._close_if_unused)
            raise
        self._waiting -= 1
        self.refs += 1

    def _close_if_unused(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        if self.refs == 0 and self._waiting == 0 and not self.closed:
            _forget_connection(self)
            self.closed = True
            if self._guard is not None:
                self._guard.cancel()
            if self.nc is not None:
                self.spawn(self.nc.close())

    async def _connect(self) -> None:
        from nats.aio.client import Client

        try:
            credentials = self.auth.options(self.url)
        except NatsError as exc:
            raise KVError(f"NATS at {self.shown}: {exc.message}") from None
        # (nats-py annotates the timeouts as int; they are seconds as floats.)
        options: dict[str, Any] = {
            **credentials,
            "servers": [part.strip() for part in self.url.split(",")],
            "name": "flowtide",
            "allow_reconnect": True,
            "connect_timeout": _CONNECT_TIMEOUT,
            "reconnect_time_wait": _RECONNECT_WAIT,
            "max_reconnect_attempts": _CONNECT_ATTEMPTS,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "closed_cb": self._on_closed,
        }
        nc = Client()
        try:
            await bounded_connect(nc, options)
        except Exception as exc:
            # A failed connect leaves its transport open (a ws:// one holds an aiohttp
            # session that would otherwise be collected unclosed).
            await close_quietly(nc)
            # `from None`: a parser or transport error may quote the URL, password included.
            raise KVError(f"cannot connect to NATS at {self.shown}: {self._reason(exc)}") from None
        # The attempt limit is for the first connect only: a connection that worked
        # keeps trying, so a server restart never strands the handles.
        nc.options["max_reconnect_attempts"] = -1
        self.nc = nc
        self._connected_once = True
        self._guard = self.loop.create_task(self._close_with_loop())

    async def _close_with_loop(self) -> None:
        """Wait to be cancelled: by release(), or by the loop shutting down
        (asyncio.run cancels every task before it closes the loop). In the second case
        handles were dropped without close(); close the connection while the loop can
        still run, so its socket does not outlive the loop."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not self.closed:
                self.closed = True
                _forget_connection(self)
                if self.nc is not None:
                    try:
                        await self.nc.close()
                    except Exception as exc:  # the loop is going away: nothing else to do
                        _log.debug("closing NATS connection to %s: %s", self.shown, exc)
            raise

    def _reason(self, exc: BaseException) -> str:
        gave_up = isinstance(exc, nats.errors.NoServersError | TimeoutError)
        cause = self._last_error if gave_up else exc
        if cause is None:
            cause = exc
        if self._refused or _is_auth_error(cause):
            text = "authorization violation (wrong user, password or token)"
        elif is_tls_failure(cause):
            text = tls_hint(cause)
        elif isinstance(cause, ImportError):
            text = "ws:// and wss:// need aiohttp (pip install aiohttp)"
        else:
            text = str(cause) or type(cause).__name__
        return self.scrub(text)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    async def _on_error(self, exc: Exception) -> None:
        self._last_error = exc
        if not self._connected_once and _is_auth_error(exc):
            self._refused = True
        denied = _DENIED_RE.search(str(exc))
        if denied is not None:
            self._denied[denied.group(1).lower()].add(denied.group(2).lower())
            _log.warning("NATS at %s: %s", self.shown, self.scrub(str(exc)))
            return
        if self._connected_once:
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            _log.log(level, "NATS connection to %s: %s", self.shown, self.scrub(str(exc)))

    async def _on_disconnected(self) -> None:
        if self._connected_once and not self.closed:
            _log.info("NATS connection to %s lost; reconnecting", self.shown)

    async def _on_reconnected(self) -> None:
        _log.info("NATS connection to %s re-established", self.shown)
        self._warned = False
        # Ephemeral consumers may not have survived (a restarted server forgets them).
        for watcher in list(self.watchers):
            watcher._schedule_reset()

    async def _on_closed(self) -> None:
        self.closed = True
        _forget_connection(self)

    async def release(self) -> None:
        self.refs -= 1
        if self.refs > 0:
            return
        _forget_connection(self)
        self.closed = True
        if self._guard is not None:
            self._guard.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
        if self.nc is not None:
            try:
                await self.nc.close()
            except Exception as exc:  # closing a dead connection: nothing left to do
                _log.debug("closing NATS connection to %s: %s", self.shown, exc)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.debug("NATS clean-up on %s failed: %s", self.shown, task.exception())

    # -- requests

    @property
    def client(self) -> Client:
        if self.nc is None or self.closed or self.nc.is_closed:
            raise KVError(f"the NATS connection to {self.shown} is closed")
        return self.nc

    def _refusal(self, subject: str | None) -> str | None:
        """Why a request on `subject` got no reply, if the server refused it: publishing
        to the subject, or subscribing to the reply inbox."""
        if subject is not None and subject.lower() in self._denied["publish"]:
            return f"permissions violation: this NATS user may not publish to {subject}"
        if self._denied["subscription"]:
            inbox = sorted(self._denied["subscription"])[0]
            return (
                "permissions violation: this NATS user may not subscribe to its reply inbox"
                f" ({inbox})"
            )
        return None

    def transport_error(
        self, exc: BaseException, timeout: float, subject: str | None = None
    ) -> KVError:
        if isinstance(exc, nats.errors.TimeoutError | asyncio.TimeoutError):
            refusal = self._refusal(subject)
            if refusal is not None:
                return KVError(f"NATS at {self.shown} refused the request: {refusal}")
            state = " (disconnected, reconnecting)" if self.nc and self.nc.is_reconnecting else ""
            return KVError(f"no reply from NATS at {self.shown} within {timeout:g} s{state}")
        if isinstance(exc, nats.errors.ConnectionClosedError):
            return KVError(f"the NATS connection to {self.shown} is closed")
        if isinstance(exc, nats.errors.OutboundBufferLimitError):
            return KVError(f"NATS at {self.shown} is unreachable and the send buffer is full")
        return KVError(f"NATS request to {self.shown} failed: {self.scrub(str(exc) or repr(exc))}")

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> Msg:
        nc = self.client
        try:
            return await nc.request(subject, payload, timeout=timeout, headers=headers)
        except nats.errors.NoRespondersError:
            raise _NoResponders(subject) from None
        except nats.errors.MaxPayloadError:
            raise _TooLarge(subject) from None
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise self.transport_error(exc, timeout, subject) from exc

    async def api(self, subject: str, body: dict[str, Any] | None, *, timeout: float) -> Any:
        payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        try:
            msg = await self.request(subject, payload, timeout=timeout)
        except _NoResponders:
            raise KVError(f"JetStream is not enabled on the NATS server at {self.shown}") from None
        try:
            reply = json.loads(msg.data)
        except ValueError:
            raise KVError(f"unreadable JetStream reply on {subject}") from None
        if isinstance(reply, dict) and reply.get("error"):
            raise _ApiError(reply["error"])
        return reply

    async def _mux(self) -> str:
        if self._mux_prefix is None:
            async with self._mux_lock:
                if self._mux_prefix is None:
                    nc = self.client
                    prefix = nc.new_inbox() + "."
                    try:
                        await nc.subscribe(prefix + "*", cb=self._on_mux_msg)
                    except (nats.errors.Error, OSError) as exc:
                        raise self.transport_error(exc, 0) from exc
                    self._mux_prefix = prefix
        return self._mux_prefix

    async def _on_mux_msg(self, msg: Msg) -> None:
        prefix = self._mux_prefix or ""
        reply = self._mux_waiters.get(msg.subject[len(prefix) :])
        if reply is None or reply.done.done():
            return
        if _status(msg) is None:
            reply.msgs.append(msg)
        else:
            reply.end = msg
            reply.done.set_result(None)

    async def request_many(
        self, subject: str, body: dict[str, Any], *, timeout: float
    ) -> tuple[list[Msg], Msg]:
        """Send a request whose reply is several messages ended by a status message.

        Returns the data messages and the status message that ended them (204 EOB,
        404, 408, 413). Raises _NoResponders for a 503. Times out only when no
        message arrives for `timeout` seconds, however long the whole reply is.
        """
        prefix = await self._mux()
        self._mux_next += 1
        token = str(self._mux_next)
        reply = _Replies(self.loop.create_future())
        self._mux_waiters[token] = reply
        try:
            try:
                await self.client.publish(
                    subject, json.dumps(body, separators=(",", ":")).encode(), reply=prefix + token
                )
            except nats.errors.MaxPayloadError:
                raise _TooLarge(subject) from None
            except (nats.errors.Error, OSError) as exc:
                raise self.transport_error(exc, timeout) from exc
            await self.wait_progress(reply.done, reply.msgs.__len__, timeout, subject)
        finally:
            del self._mux_waiters[token]
        assert reply.end is not None
        if _status(reply.end) == "503":
            raise _NoResponders(subject)
        return reply.msgs, reply.end

    async def wait_progress(
        self,
        done: asyncio.Future[Any],
        progress: Callable[[], int],
        timeout: float,
        subject: str | None = None,
    ) -> None:
        """Wait for `done`; fail when `progress()` stays put for `timeout` seconds.

        One future for a whole run of messages: a wait per message (wait_for creates a
        task each time) cost more than handling the message."""
        seen = -1
        while not done.done():
            now = progress()
            if now == seen:
                raise self.transport_error(TimeoutError(), timeout, subject)
            seen = now
            await asyncio.wait((done,), timeout=timeout)


@dataclass(slots=True)
class _Replies:
    done: asyncio.Future[None]
    msgs: list[Msg] = field(default_factory=list)
    end: Msg | None = None


_POOL: dict[tuple[str, NatsAuth, asyncio.AbstractEventLoop], _Connection] = {}
# Handles on different threads (each with its own loop) share the pool dictionary.
_POOL_LOCK: Final = threading.Lock()


def _forget_connection(conn: _Connection) -> None:
    with _POOL_LOCK:
        key = (conn.url, conn.auth, conn.loop)
        if _POOL.get(key) is conn:
            del _POOL[key]


async def _acquire(url: str, auth: NatsAuth) -> _Connection:
    loop = asyncio.get_running_loop()
    key = (url, auth, loop)
    while True:
        with _POOL_LOCK:
            for stale in [k for k in _POOL if k[2].is_closed()]:
                del _POOL[stale]
            conn = _POOL.get(key)
            if conn is None or conn.closed:
                conn = _Connection(url, loop, auth)
                _POOL[key] = conn
        try:
            await conn.acquire()
        except KVError:
            _forget_connection(conn)
            raise
        if not conn.closed:
            return conn
        # It closed between connecting and now (server gone for good): start over.
        conn.refs -= 1


async def open_nats(
    url: str,
    config: BucketConfig,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    create: bool = True,
    auth: NatsAuth | None = None,
) -> NatsKeyValue:
    """Open bucket `config.bucket` on the NATS server at `url`, creating it if missing
    (unless `create` is False: then a missing bucket is BucketNotFoundError).

    An existing bucket is bound as it is (its configuration was fixed at creation).

    Args:
        url: `nats://`, `tls://`, `ws://` or `wss://` URL, optionally `user:password@`
            (or `token@`); several servers separated by commas.
        config: the validated bucket configuration, used only to create the bucket.
        timeout: seconds to wait for each server reply.
        auth: credentials for a URL without them (user/password or a .creds file).
    Returns:
        A handle on the bucket.
    Raises:
        KVError: the server cannot be reached or refuses the credentials (the message
            names the URL without its password), JetStream is not enabled, or the
            bucket cannot be created or the stream is not a KV bucket.
    """
    conn = await _acquire(url, auth if auth is not None else NatsAuth())
    try:
        info = await _bind_bucket(conn, config, timeout, create)
    except BaseException:
        await conn.release()
        raise
    handle = NatsKeyValue(conn, info, timeout)
    conn.handles.add(handle)
    return handle


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


# --------------------------------------------------------------------------- handle


class NatsKeyValue:
    """A handle on a JetStream KV bucket; implements `flowtide.kv.KeyValue`, whose
    docstrings hold the contract of each method (the module's docstring says how it maps
    onto JetStream). Every method may also raise KVError when the server cannot be
    reached (no reply within the timeout)."""

    def __init__(
        self, conn: _Connection, info: _BucketInfo, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self._conn = conn
        self._info = info
        self._timeout = timeout
        self._prefix = info.prefix
        self._stream = info.stream
        self._closed = False
        self._destroyed = False
        self._watchers: weakref.WeakSet[NatsWatcher] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"NatsKeyValue(bucket={self._info.bucket!r}, url={self._conn.shown!r})"

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._info.bucket

    # -- plumbing

    def _check(self) -> None:
        if self._closed:
            raise KVError(f"KV handle on bucket {self.bucket!r} is closed", bucket=self.bucket)
        if self._destroyed:
            raise BucketNotFoundError(self.bucket)
        if asyncio.get_running_loop() is not self._conn.loop:
            raise KVError(
                f"KV handle on bucket {self.bucket!r} used from another event loop than the "
                "one that opened it; open one handle per loop",
                bucket=self.bucket,
            )

    def _check_size(self, key: str, value: bytes) -> None:
        limit = self._info.max_value_size
        if limit is not None and len(value) > limit:
            raise ValueTooLargeError(self.bucket, key, size=len(value), max_size=limit)

    async def _missing_or(self, what: str) -> KVError:
        """The error for a request nobody answered: the bucket is gone, or not serving."""
        try:
            await self._conn.api(f"$JS.API.STREAM.INFO.{self._stream}", None, timeout=self._timeout)
        except _ApiError as exc:
            if exc.err_code == _ERR_STREAM_NOT_FOUND:
                return BucketNotFoundError(self.bucket)
            return KVError(f"{what} in bucket {self.bucket!r} failed: {exc}", bucket=self.bucket)
        return KVError(
            f"{what}: no JetStream responder for bucket {self.bucket!r}", bucket=self.bucket
        )

    async def _stream_api(
        self,
        what: str,
        subject: str,
        body: dict[str, Any] | None,
        *,
        none_on: int | None = None,
    ) -> Any:
        """A JetStream API request on this bucket's stream, its errors translated; None
        for the API error `none_on`."""
        try:
            return await self._conn.api(subject, body, timeout=self._timeout)
        except _ApiError as exc:
            if none_on is not None and exc.err_code == none_on:
                return None
            if exc.err_code == _ERR_STREAM_NOT_FOUND:
                raise BucketNotFoundError(self.bucket) from None
            raise KVError(
                f"{what} in bucket {self.bucket!r} failed: {exc}", bucket=self.bucket
            ) from None
        except KVError as exc:
            exc.bucket = self.bucket
            raise

    async def _direct_many(self, what: str, body: dict[str, Any]) -> tuple[list[Msg], Msg]:
        try:
            return await self._conn.request_many(
                f"$JS.API.DIRECT.GET.{self._stream}", body, timeout=self._timeout
            )
        except _NoResponders:
            raise await self._missing_or(what) from None
        except KVError as exc:
            exc.bucket = self.bucket
            raise

    def _direct_entry(self, msg: Msg, delta: int) -> Entry:
        headers = msg.headers or {}
        op = _operation(headers)
        return Entry(
            self.bucket,
            headers.get("Nats-Subject", "")[len(self._prefix) :],
            msg.data if op is Operation.PUT else b"",
            int(headers.get("Nats-Sequence") or 0),
            _parse_ts(headers.get("Nats-Time-Stamp", "")),
            delta,
            op,
        )

    def _direct_failure(self, what: str, end: Msg) -> KVError:
        headers = end.headers or {}
        # nats-py keys the status description by an enum member, not the plain string.
        desc = headers.get("Description") or next(
            (v for k, v in headers.items() if str(k).lower().endswith("description")), ""
        )
        return KVError(
            f"{what} in bucket {self.bucket!r}: Direct Get answered {_status(end)} {desc}".rstrip(),
            bucket=self.bucket,
        )

    async def _publish(self, key: str, value: bytes, headers: dict[str, str] | None) -> int:
        try:
            msg = await self._conn.request(
                self._prefix + key, value, timeout=self._timeout, headers=headers
            )
        except _NoResponders:
            raise await self._missing_or(f"write to {key!r}") from None
        except _TooLarge:
            limit = self._conn.client.max_payload
            raise ValueTooLargeError(self.bucket, key, size=len(value), max_size=limit) from None
        except KVError as exc:
            exc.bucket = self.bucket
            raise
        try:
            ack = json.loads(msg.data)
        except ValueError:
            raise KVError(f"unreadable JetStream ack for {key!r}", bucket=self.bucket) from None
        error = ack.get("error")
        if not error:
            return int(ack["seq"])
        api = _ApiError(error)
        if api.err_code in _WRONG_LAST_SEQUENCE:
            # 10071 carries the subject's last sequence; 10164 (clustered) does not.
            m = _WRONG_LAST_RE.search(api.description)
            raise _WrongLast(int(m.group(1)) if m else None)
        if api.err_code == _ERR_MESSAGE_TOO_LARGE:
            max_size = self._info.max_value_size or self._conn.client.max_payload
            raise ValueTooLargeError(self.bucket, key, size=len(value), max_size=max_size)
        raise KVError(
            f"JetStream refused the write to {key!r} in bucket {self.bucket!r}: {api}",
            bucket=self.bucket,
            key=key,
        )

    async def _msg_get(self, body: dict[str, Any]) -> _Stored | None:
        """A stored message through the stream leader (`$JS.API.STREAM.MSG.GET`):
        read-after-write, unlike Direct Get, and available without allow_direct."""
        reply = await self._stream_api(
            "read", f"$JS.API.STREAM.MSG.GET.{self._stream}", body, none_on=_ERR_NO_MESSAGE
        )
        if reply is None:
            return None
        message = reply["message"]
        hdrs = message.get("hdrs")
        data = message.get("data")
        return _Stored(
            subject=str(message["subject"]),
            revision=int(message["seq"]),
            headers=_parse_header_block(base64.b64decode(hdrs)) if hdrs else None,
            value=base64.b64decode(data) if data else b"",
            created=_parse_ts(str(message.get("time") or "")),
        )

    def _stored_entry(self, stored: _Stored, delta: int) -> Entry:
        op = _operation(stored.headers)
        return Entry(
            self.bucket,
            stored.subject[len(self._prefix) :],
            stored.value if op is Operation.PUT else b"",
            stored.revision,
            stored.created,
            delta,
            op,
        )

    async def _leader_last(self, key: str) -> tuple[int, Operation] | None:
        """The newest message of `key` as the stream leader sees it (read-after-write)."""
        stored = await self._msg_get({"last_by_subj": self._prefix + key})
        if stored is None:
            return None
        return stored.revision, _operation(stored.headers)

    async def _current_revision(self, key: str) -> int:
        last = await self._leader_last(key)
        return last[0] if last is not None else 0

    # -- the port

    async def get(self, key: str, revision: int | None = None) -> Entry:
        """See `KeyValue.get`. A Direct Get (a batch of one from `revision` for an older
        revision); without allow_direct, `$JS.API.STREAM.MSG.GET` on the stream leader
        (and for an older revision a consumer's pending count as `delta`)."""
        validate_key(key, bucket=self.bucket)
        self._check()
        if revision is not None and revision < 1:
            raise KeyNotFoundError(self.bucket, key, revision=revision)
        if self._info.direct:
            entry = await self._get_direct(key, revision)
        else:
            entry = await self._get_from_leader(key, revision)
        if entry is None:
            raise KeyNotFoundError(self.bucket, key, revision=revision)
        if entry.operation is not Operation.PUT:
            raise KeyNotFoundError(self.bucket, key, revision=revision, operation=entry.operation)
        return entry

    async def _get_direct(self, key: str, revision: int | None) -> Entry | None:
        subject = self._prefix + key
        if revision is None:
            try:
                msg = await self._conn.request(
                    f"$JS.API.DIRECT.GET.{self._stream}.{subject}", timeout=self._timeout
                )
            except _NoResponders:
                raise await self._missing_or(f"get {key!r}") from None
            except KVError as exc:
                exc.bucket = self.bucket
                raise
            status = _status(msg)
            if status == "404":
                return None
            if status is not None:
                raise self._direct_failure(f"get {key!r}", msg)
            return self._direct_entry(msg, 0)
        # A batch of one from `revision` on the key's subject: the message is ours when
        # its sequence is `revision`, and its pending count is the delta.
        msgs, end = await self._direct_many(
            f"get {key!r}", {"seq": revision, "next_by_subj": subject, "batch": 1}
        )
        if _status(end) not in ("204", "404"):
            raise self._direct_failure(f"get {key!r}", end)
        if not msgs or int((msgs[0].headers or {}).get("Nats-Sequence") or 0) != revision:
            return None
        return self._direct_entry(msgs[0], _num_pending(msgs[0]))

    async def _get_from_leader(self, key: str, revision: int | None) -> Entry | None:
        subject = self._prefix + key
        if revision is None:
            stored = await self._msg_get({"last_by_subj": subject})
            return None if stored is None else self._stored_entry(stored, 0)
        stored = await self._msg_get({"seq": revision})
        if stored is None or stored.subject != subject:
            return None
        return self._stored_entry(stored, await self._count_from(key, revision + 1))

    async def _count_from(self, key: str, start: int) -> int:
        """How many messages of `key` have a revision >= `start`: the pending count of a
        consumer nobody reads from."""
        nc = self._conn.client
        info = await self._create_consumer(
            nc.new_inbox(), (key,), policy="by_start_sequence", start_seq=start, headers_only=True
        )
        self._drop_consumer(None, str(info["name"]))
        return int(info.get("num_pending") or 0)

    async def put(self, key: str, value: bytes) -> int:
        """See `KeyValue.put`. ValueTooLargeError also when the message exceeds the
        server's max_payload."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        self._check()
        return await self._publish(key, data, None)

    async def create(self, key: str, value: bytes) -> int:
        """See `KeyValue.create`. A write expecting last subject sequence 0, or the
        revision of the key's newest message when that is a marker; KVError when the key
        kept changing under ten attempts in a row."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        self._check()
        last = 0
        for _ in range(_CREATE_ATTEMPTS):
            try:
                return await self._publish(key, data, {_HDR_EXPECTED_LAST: str(last)})
            except _WrongLast:
                # ADR-8: a key whose newest message is a marker may be re-created, with
                # the marker's revision as the expected last one.
                newest = await self._leader_last(key)
                if newest is None:
                    last = 0
                elif newest[1] is Operation.PUT:
                    raise KeyExistsError(self.bucket, key, revision=newest[0]) from None
                else:
                    last = newest[0]
        raise KVError(
            f"create of {key!r} in bucket {self.bucket!r} lost {_CREATE_ATTEMPTS} races "
            "against deletes and re-creates in a row",
            bucket=self.bucket,
            key=key,
        )

    async def update(self, key: str, value: bytes, last: int) -> int:
        """See `KeyValue.update`. WrongRevisionError's `current` is the revision the stream
        leader sees right after the refusal."""
        validate_key(key, bucket=self.bucket)
        data = as_bytes(value)
        self._check_size(key, data)
        self._check()
        return await self._conditional(key, data, None, last)

    async def _conditional(
        self, key: str, data: bytes, headers: dict[str, str] | None, last: int
    ) -> int:
        if last < 0:
            current = await self._current_revision(key)
            raise WrongRevisionError(self.bucket, key, expected=last, current=current)
        try:
            return await self._publish(
                key, data, {**(headers or {}), _HDR_EXPECTED_LAST: str(last)}
            )
        except _WrongLast as exc:
            if exc.current is not None:
                current = exc.current
            else:
                # 10164: another write to the key was in flight on the cluster; give the
                # leader a moment to apply it so `current` says where the key went.
                current = await self._current_revision(key)
                for _ in range(2):
                    if current != last:
                        break
                    await asyncio.sleep(0.005)
                    current = await self._current_revision(key)
            raise WrongRevisionError(self.bucket, key, expected=last, current=current) from None

    async def delete(self, key: str, last: int | None = None) -> None:
        """See `KeyValue.delete`."""
        validate_key(key, bucket=self.bucket)
        self._check()
        headers = {_HDR_OPERATION: "DEL"}
        if last is None:
            await self._publish(key, b"", headers)
        else:
            await self._conditional(key, b"", headers, last)

    async def purge(self, key: str) -> None:
        """See `KeyValue.purge`. A PURGE marker with `Nats-Rollup: sub`."""
        validate_key(key, bucket=self.bucket)
        self._check()
        await self._publish(key, b"", {_HDR_OPERATION: "PURGE", _HDR_ROLLUP: "sub"})

    async def purge_all(self, filter: str | Sequence[str]) -> int:
        """See `KeyValue.purge_all`. One `$JS.API.STREAM.PURGE` request per filter
        (filters covered by another one are dropped first), however many keys match;
        returns how many messages the server removed."""
        wanted = KeyFilter(filter, bucket=self.bucket)
        self._check()
        removed = 0
        for pattern in _reduce(wanted.filters):
            reply = await self._stream_api(
                "purge_all",
                f"$JS.API.STREAM.PURGE.{self._stream}",
                {"filter": self._prefix + pattern},
            )
            removed += int(reply.get("purged") or 0)
        return removed

    async def history(self, key: str) -> list[Entry]:
        """See `KeyValue.history`. Direct Get batches; without allow_direct, an ordered
        consumer."""
        validate_key(key, bucket=self.bucket)
        self._check()
        if not self._info.direct:
            found = await self._scan((key,), policy="all", values=True)
            if not found:
                raise KeyNotFoundError(self.bucket, key)
            return [self._delivery_entry(d, d.pending) for d in found]
        subject = self._prefix + key
        entries: list[Entry] = []
        seq = 1
        while True:
            msgs, end = await self._direct_many(
                f"history of {key!r}", {"seq": seq, "next_by_subj": subject, "batch": _BATCH_MAX}
            )
            status = _status(end)
            if status == "404":
                break
            if status != "204":
                raise self._direct_failure(f"history of {key!r}", end)
            entries.extend(self._direct_entry(m, _num_pending(m)) for m in msgs)
            # The server may stop a batch early (max bytes); the EOB says what is left.
            if not msgs or _num_pending(end) == 0:
                break
            seq = entries[-1].revision + 1
        if not entries:
            raise KeyNotFoundError(self.bucket, key)
        return entries

    async def keys(self, filter: str | Sequence[str] = ">") -> list[str]:
        """See `KeyValue.keys`. A headers-only ordered consumer delivering the last message
        per subject."""
        wanted = KeyFilter(filter, bucket=self.bucket)
        self._check()
        found = await self._scan(_reduce(wanted.filters), policy="last_per_subject")
        return sorted(d.key for d in found if d.operation is Operation.PUT)

    def watch(
        self,
        keys: str | Sequence[str] = ">",
        *,
        include_history: bool = False,
        ignore_deletes: bool = False,
        meta_only: bool = False,
        updates_only: bool = False,
    ) -> NatsWatcher:
        """See `KeyValue.watch`; `meta_only` makes a headers-only consumer."""
        return NatsWatcher(
            self,
            KeyFilter(keys, bucket=self.bucket),
            include_history=include_history,
            ignore_deletes=ignore_deletes,
            meta_only=meta_only,
            updates_only=updates_only,
        )

    async def get_last_many(
        self, filters: str | Sequence[str], up_to_revision: int | None = None
    ) -> dict[str, Entry]:
        """See `KeyValue.get_last_many`. More than 1024 matching keys are read in pages of
        1024 subjects, all at the same stream sequence."""
        wanted = KeyFilter(filters, bucket=self.bucket)
        if up_to_revision is not None and up_to_revision < 0:
            raise KVError(f"up_to_revision must be >= 0, got {up_to_revision}", bucket=self.bucket)
        self._check()
        # up_to_seq 0 would mean "unset" to the server.
        if up_to_revision == 0:
            return {}
        reduced = _reduce(wanted.filters)
        if not self._info.direct:
            entries = await self._last_many_by_scan(reduced, up_to_revision)
            entries.sort(key=lambda e: e.key)
            return {e.key: e for e in entries}
        subjects = [self._prefix + f for f in reduced]
        body: dict[str, Any] = {"multi_last": subjects}
        if up_to_revision is not None:
            body["up_to_seq"] = up_to_revision
        msgs, end = await self._direct_many("get_last_many", body)
        status = _status(end)
        if status == "404":
            msgs = []
        elif status == "413" or (status == "204" and _num_pending(end) > 0):
            msgs = await self._last_many_paged(subjects, up_to_revision)
        elif status != "204":
            raise self._direct_failure("get_last_many", end)
        entries = [
            e for e in (self._direct_entry(m, 0) for m in msgs) if e.operation is Operation.PUT
        ]
        if up_to_revision is not None and entries:
            newer = Counter(
                d.key
                for d in await self._scan(
                    reduced, policy="by_start_sequence", start_seq=up_to_revision + 1
                )
            )
            entries = [
                Entry(e.bucket, e.key, e.value, e.revision, e.created, newer[e.key], e.operation)
                for e in entries
            ]
        entries.sort(key=lambda e: e.key)
        return {e.key: e for e in entries}

    async def _last_many_by_scan(self, filters: Sequence[str], up_to: int | None) -> list[Entry]:
        """get_last_many for a bucket without Direct Get: one ordered consumer."""
        if up_to is None:
            found = await self._scan(filters, policy="last_per_subject", values=True)
            return [self._delivery_entry(d, 0) for d in found if d.operation is Operation.PUT]
        last: dict[str, _Delivery] = {}
        newer: Counter[str] = Counter()
        for d in await self._scan(filters, policy="all", values=True):
            if d.revision <= up_to:
                last[d.key] = d
            else:
                newer[d.key] += 1
        return [
            self._delivery_entry(d, newer[key])
            for key, d in last.items()
            if d.operation is Operation.PUT
        ]

    async def _last_many_paged(self, subjects: list[str], up_to: int | None) -> list[Msg]:
        listed: set[str] = set()
        point = up_to
        for subject in subjects:
            offset = 0
            while True:
                reply = await self._stream_api(
                    "get_last_many",
                    f"$JS.API.STREAM.INFO.{self._stream}",
                    {"subjects_filter": subject, "offset": offset},
                )
                state = reply.get("state") or {}
                if point is None:
                    # Fix the point in time before listing, so every page reads the same.
                    point = int(state.get("last_seq") or 0)
                page = state.get("subjects") or {}
                listed.update(page)
                offset += len(page)
                if not page or offset >= int(reply.get("total") or 0):
                    break
        if not listed or not point:
            return []
        ordered = sorted(listed)
        out: list[Msg] = []
        size = _MULTI_LAST_MAX
        i = 0
        while i < len(ordered):
            part = ordered[i : i + size]
            msgs, end = await self._direct_many(
                "get_last_many", {"multi_last": part, "up_to_seq": point}
            )
            status = _status(end)
            if status == "413" or (status == "204" and _num_pending(end) > 0):
                # Cut short by the server's byte limit: ask for fewer keys at a time.
                if size == 1:
                    raise self._direct_failure("get_last_many", end)
                size = max(1, size // 2)
                continue
            if status not in ("204", "404"):
                raise self._direct_failure("get_last_many", end)
            out.extend(msgs)
            i += len(part)
        return out

    async def status(self) -> Status:
        """See `KeyValue.status`. `bytes` is the stream's byte count (headers and subjects
        included); `backing_store` is "JetStream"."""
        self._check()
        reply = await self._stream_api("status", f"$JS.API.STREAM.INFO.{self._stream}", None)
        info = _bucket_info(self.bucket, reply["config"])
        state = reply.get("state") or {}
        return Status(
            bucket=self.bucket,
            values=int(state.get("messages") or 0),
            history=info.history,
            ttl=info.ttl,
            max_value_size=info.max_value_size,
            storage=info.storage,
            replicas=info.replicas,
            compression=info.compression,
            bytes=int(state.get("bytes") or 0),
            backing_store="JetStream",
        )

    async def destroy(self) -> None:
        """See `KeyValue.destroy`. Handles and watchers sharing this handle's connection
        end at once; other handles find out on their next call, other watchers within a
        few heartbeats."""
        self._check()
        await self._stream_api("destroy", f"$JS.API.STREAM.DELETE.{self._stream}", None)
        for handle in list(self._conn.handles):
            if handle.bucket == self.bucket:
                handle._destroyed = True
                for watcher in list(handle._watchers):
                    watcher._finish()

    async def close(self) -> None:
        """See `KeyValue.close`. The shared connection closes with its last handle."""
        if self._closed:
            return
        self._closed = True
        for watcher in list(self._watchers):
            watcher._finish()
        self._conn.handles.discard(self)
        await self._conn.release()

    # -- ordered consumers

    async def _create_consumer(
        self,
        deliver_subject: str,
        filters: Sequence[str],
        *,
        policy: str,
        start_seq: int | None,
        headers_only: bool,
    ) -> dict[str, Any]:
        config: dict[str, Any] = {
            "deliver_subject": deliver_subject,
            "deliver_policy": policy,
            "ack_policy": "none",
            "max_deliver": 1,
            "replay_policy": "instant",
            "flow_control": True,
            "idle_heartbeat": int(_HEARTBEAT * 1e9),
            "headers_only": headers_only,
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": _CONSUMER_INACTIVE_NS,
        }
        subjects = [self._prefix + f for f in filters]
        if len(subjects) == 1:
            config["filter_subject"] = subjects[0]
        else:
            config["filter_subjects"] = subjects
        if policy == "by_start_sequence":
            config["opt_start_seq"] = start_seq
        reply: dict[str, Any] = await self._stream_api(
            "reading",
            f"$JS.API.CONSUMER.CREATE.{self._stream}",
            {"stream_name": self._stream, "config": config},
        )
        return reply

    def _drop_consumer(self, sub: Subscription | None, name: str | None) -> None:
        """Unsubscribe and delete an ephemeral consumer, in the background."""

        async def drop() -> None:
            if sub is not None:
                try:
                    await sub.unsubscribe()
                except nats.errors.Error:
                    pass
            if name is not None:
                try:
                    await self._conn.api(
                        f"$JS.API.CONSUMER.DELETE.{self._stream}.{name}", None, timeout=1.0
                    )
                except (KVError, _ApiError):
                    # It goes away by itself once inactive (inactive_threshold).
                    pass

        self._conn.spawn(drop())

    async def _scan(
        self,
        filters: Sequence[str],
        *,
        policy: str,
        start_seq: int | None = None,
        values: bool = False,
    ) -> list[_Delivery]:
        """Read a snapshot through an ordered consumer (headers only unless `values`),
        until its first message with nothing pending."""
        nc = self._conn.client
        for _ in range(_SCAN_ATTEMPTS):
            scan = _Scan(self._conn.loop.create_future())

            async def on_msg(msg: Msg, scan: _Scan = scan) -> None:
                if scan.done.done():
                    return
                status = _status(msg)
                if status == "100":
                    await self._answer_control(msg)
                    idle = _idle_after(msg, len(scan.found))
                    if idle is not None:
                        # Idle with everything delivered means messages counted as
                        # pending at creation expired or were purged since; idle
                        # after more than we got means one was lost.
                        scan.done.set_result(idle)
                    return
                delivery = _parse_delivery(msg, self._prefix) if status is None else None
                if delivery is None or delivery.dseq != len(scan.found) + 1:
                    # A gap (slow consumer) or an unexpected status: start again.
                    scan.done.set_result(False)
                    return
                scan.found.append(delivery)
                if delivery.pending == 0:
                    scan.done.set_result(True)

            sub = await nc.subscribe(nc.new_inbox(), cb=on_msg)
            name: str | None = None
            try:
                info = await self._create_consumer(
                    sub.subject,
                    filters,
                    policy=policy,
                    start_seq=start_seq,
                    headers_only=not values,
                )
                name = str(info["name"])
                if int(info.get("num_pending") or 0) == 0:
                    return []
                try:
                    await self._conn.wait_progress(scan.done, scan.found.__len__, self._timeout)
                except KVError as exc:
                    exc.bucket = self.bucket
                    raise
                if scan.done.result():
                    return scan.found
            finally:
                self._drop_consumer(sub, name)
        raise KVError(
            f"could not read a consistent snapshot of bucket {self.bucket!r} "
            f"in {_SCAN_ATTEMPTS} attempts",
            bucket=self.bucket,
        )

    def _delivery_entry(self, d: _Delivery, delta: int) -> Entry:
        value = d.value if d.operation is Operation.PUT else b""
        return Entry(self.bucket, d.key, value, d.revision, d.created, delta, d.operation)

    async def _answer_control(self, msg: Msg) -> None:
        """Answer a flow-control request or a stalled-consumer heartbeat."""
        nc = self._conn.client
        headers = msg.headers or {}
        if msg.reply:
            await nc.publish(msg.reply, b"")
        stalled = headers.get("Nats-Consumer-Stalled")
        if stalled:
            await nc.publish(stalled, b"")


# -------------------------------------------------------------------------- watcher


class NatsWatcher(QueueWatcher):
    """A watch on a JetStream KV bucket; implements `flowtide.kv.KeyWatcher`.

    An ordered push consumer: it is re-created from the revision after the last one
    delivered when a delivery is missing (a gap), heartbeats stop, or the connection
    comes back after an outage. Iteration ends on `stop()`, when the handle is closed,
    or when the bucket is gone.
    """

    def __init__(
        self,
        handle: NatsKeyValue,
        keys: KeyFilter,
        *,
        include_history: bool,
        ignore_deletes: bool,
        meta_only: bool,
        updates_only: bool,
    ) -> None:
        super().__init__()
        self._handle = handle
        self._filters = _reduce(keys.filters)
        self._include_history = include_history
        self._ignore_deletes = ignore_deletes
        self._meta_only = meta_only
        self._updates_only = updates_only
        # With deletes filtered out here, the server's pending counts include entries
        # never delivered; initial data is held until the marker to number it exactly.
        self._held: list[Entry] | None = [] if ignore_deletes else None
        self._marker_queued = False
        self._ending = False
        self._gen = 0
        self._sub: Subscription | None = None
        self._consumer: str | None = None
        self._last_revision = 0
        self._next_dseq = 1
        self._last_seen = 0.0
        self._flow_reply: str | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._resetting: asyncio.Task[None] | None = None

    @property
    def _initial_policy(self) -> str:
        if self._updates_only:
            return "new"
        return "all" if self._include_history else "last_per_subject"

    async def start(self) -> None:
        """Create the consumer (idempotent).

        Raises:
            BucketNotFoundError: the bucket was destroyed.
            KVError: the handle is closed or the server cannot be reached.
        """
        if self._started or self._stopped:
            return
        handle = self._handle
        handle._check()
        self._started = True
        if self._updates_only:
            self._queue_marker()
        try:
            await self._open(self._initial_policy, None)
        except BaseException:
            self._stopped = True
            self._release()
            raise
        handle._watchers.add(self)
        handle._conn.watchers.add(self)
        self._monitor = handle._conn.loop.create_task(self._watch_heartbeats())

    async def _open(self, policy: str, start_seq: int | None) -> None:
        handle = self._handle
        nc = handle._conn.client
        self._gen += 1
        gen = self._gen

        async def on_msg(msg: Msg) -> None:
            await self._on_msg(msg, gen)

        sub = await nc.subscribe(nc.new_inbox(), cb=on_msg)
        self._sub = sub
        self._consumer = None
        self._next_dseq = 1
        self._last_seen = time.monotonic()
        try:
            info = await handle._create_consumer(
                sub.subject,
                self._filters,
                policy=policy,
                start_seq=start_seq,
                headers_only=self._meta_only,
            )
        except BaseException:
            if self._sub is sub:
                self._sub = None
            handle._drop_consumer(sub, None)
            raise
        if gen != self._gen:
            # Superseded (stopped or reset) while the server was answering.
            handle._drop_consumer(None, str(info["name"]))
            return
        self._consumer = str(info["name"])
        delivered = info.get("delivered") or {}
        self._last_revision = max(self._last_revision, int(delivered.get("stream_seq") or 0))
        if int(info.get("num_pending") or 0) == 0:
            self._queue_marker()

    async def _on_msg(self, msg: Msg, gen: int) -> None:
        if gen != self._gen or self._stopped or self._ending:
            return
        self._last_seen = time.monotonic()
        status = _status(msg)
        if status is not None:
            if status != "100":
                self._schedule_reset()
                return
            headers = msg.headers or {}
            if msg.reply:
                # Flow control: answer now while the reader keeps up, else when it has
                # caught up (__anext__), which is the back-pressure.
                if self._queue.qsize() < _FLOW_CONTROL_BACKLOG:
                    await self._publish(msg.reply)
                else:
                    self._flow_reply = msg.reply
                return
            stalled = headers.get("Nats-Consumer-Stalled")
            if stalled:
                await self._publish(stalled)
            idle = _idle_after(msg, self._next_dseq - 1)
            if idle is False:
                self._schedule_reset()
            elif idle and not self._marker_queued:
                # Initial data counted at creation that expired before delivery.
                self._queue_marker()
            return
        delivery = _parse_delivery(msg, self._handle._prefix)
        if delivery is None:
            return
        if delivery.dseq != self._next_dseq:
            self._schedule_reset()
            return
        self._next_dseq += 1
        self._last_revision = delivery.revision
        self._deliver(delivery)

    def _deliver(self, d: _Delivery) -> None:
        keep = not (self._ignore_deletes and d.operation is not Operation.PUT)
        if self._marker_queued:
            if keep:
                self._queue.put_nowait(self._entry(d, 0))
            return
        if keep:
            if self._held is not None:
                self._held.append(self._entry(d, 0))
            else:
                self._queue.put_nowait(self._entry(d, d.pending))
        if d.pending == 0:
            self._queue_marker()

    def _entry(self, d: _Delivery, delta: int) -> Entry:
        value = b"" if self._meta_only or d.operation is not Operation.PUT else d.value
        return Entry(self._handle.bucket, d.key, value, d.revision, d.created, delta, d.operation)

    def _queue_marker(self) -> None:
        if self._marker_queued:
            return
        self._marker_queued = True
        held, self._held = self._held or [], None
        total = len(held)
        for i, e in enumerate(held):
            self._queue.put_nowait(
                Entry(e.bucket, e.key, e.value, e.revision, e.created, total - i - 1, e.operation)
            )
        self._queue.put_nowait(None)

    async def _publish(self, subject: str) -> None:
        try:
            await self._handle._conn.client.publish(subject, b"")
        except (KVError, nats.errors.Error) as exc:
            _log.debug("watcher on %s could not answer %s: %s", self._handle.bucket, subject, exc)

    # -- recovery

    def _schedule_reset(self) -> None:
        if self._stopped or self._ending or not self._started:
            return
        if self._resetting is not None and not self._resetting.done():
            return
        # Ignore whatever the old consumer still delivers from now on.
        self._gen += 1
        self._resetting = self._handle._conn.loop.create_task(self._reset())

    async def _reset(self) -> None:
        handle = self._handle
        handle._drop_consumer(self._sub, self._consumer)
        self._sub = None
        self._consumer = None
        if self._marker_queued or self._last_revision > 0:
            policy, start = "by_start_sequence", self._last_revision + 1
        else:
            policy, start = self._initial_policy, None
        if handle._conn.closed:
            self._finish()
            return
        try:
            await self._open(policy, start)
        except BucketNotFoundError:
            self._finish()
        except KVError as exc:
            # The heartbeat monitor tries again.
            _log.debug("watcher on %s: re-creating its consumer failed: %s", handle.bucket, exc)

    async def _watch_heartbeats(self) -> None:
        while not (self._stopped or self._ending):
            await asyncio.sleep(_HEARTBEAT)
            if time.monotonic() - self._last_seen > _MISSED_HEARTBEATS * _HEARTBEAT:
                self._schedule_reset()

    # -- ending

    def _release(self) -> None:
        self._gen += 1
        current = asyncio.current_task()
        for task in (self._monitor, self._resetting):
            if task is not None and task is not current:
                task.cancel()
        self._monitor = self._resetting = None
        handle = self._handle
        if self._sub is not None or self._consumer is not None:
            handle._drop_consumer(self._sub, self._consumer)
        self._sub = None
        self._consumer = None
        handle._watchers.discard(self)
        handle._conn.watchers.discard(self)

    def _finish(self) -> None:
        """End iteration after the updates already queued (handle closed, bucket gone)."""
        if self._stopped or self._ending:
            return
        self._ending = True
        self._release()
        self._queue.put_nowait(END_OF_WATCH)

    async def __anext__(self) -> Entry | None:
        item = await super().__anext__()
        # The reader has caught up: answer the flow control held back (back-pressure).
        if self._flow_reply is not None and self._queue.qsize() < _FLOW_CONTROL_BACKLOG:
            reply, self._flow_reply = self._flow_reply, None
            await self._publish(reply)
        return item
