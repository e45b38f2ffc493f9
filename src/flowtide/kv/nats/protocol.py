"""JetStream as the adapter speaks it: header names, API error codes, the parsing of
timestamps, markers, status replies and push deliveries, the reduction of key filters,
and the errors a request raises before its caller translates them into KVError.

No I/O here; every other module of the adapter imports from this one.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from nats.aio.msg import Msg

from flowtide.kv.base import Operation

DEFAULT_TIMEOUT: Final = 5.0

_HDR_EXPECTED_LAST: Final = "Nats-Expected-Last-Subject-Sequence"
_HDR_OPERATION: Final = "KV-Operation"
_HDR_ROLLUP: Final = "Nats-Rollup"
_HDR_MARKER_REASON: Final = "Nats-Marker-Reason"
_HDR_STATUS: Final = "Status"
_HDR_TTL: Final = "Nats-TTL"

_ERR_NO_MESSAGE: Final = 10037
_ERR_MESSAGE_TOO_LARGE: Final = 10054
_ERR_STREAM_NAME_IN_USE: Final = 10058
_ERR_STREAM_NOT_FOUND: Final = 10059
_ERR_WRONG_LAST_SEQUENCE: Final = 10071
_ERR_WRONG_LAST_SEQUENCE_CONSTANT: Final = 10164
_ERR_MAX_BYTES: Final = 10077
_ERR_MSG_TTL_DISABLED: Final = 10166
_WRONG_LAST_SEQUENCE: Final = frozenset(
    {_ERR_WRONG_LAST_SEQUENCE, _ERR_WRONG_LAST_SEQUENCE_CONSTANT}
)

_WRONG_LAST_RE: Final = re.compile(r"wrong last sequence: (\d+)")
_TS_RE: Final = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?"
)


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


class _Lost(Exception):
    """The connection dropped while the request waited for its reply: the reply may
    never come (the node that had it died), so the wait ends at once; the request may or
    may not have been applied."""


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


@dataclass(frozen=True, slots=True)
class _Stored:
    subject: str
    revision: int
    headers: dict[str, str] | None
    value: bytes
    created: float
