"""An execution's events as people and programs read them: JSON documents with ids as
strings (JSON numbers read as doubles lose snowflake ids), payload and error masked with
the execution's secret set; and the Server-Sent Events framing of a live event stream,
the same for every app that streams one."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

from typing_extensions import TypedDict

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import secret_values
from flowtide.redaction import mask_event_doc, mask_value

__all__ = [
    "SSE_RETRY",
    "EndDocument",
    "EventDocument",
    "event_document",
    "grown_secrets",
    "log_secrets",
    "sse_end",
    "sse_events",
]

_ID_FIELDS: Final = ("event_id", "execution_id", "parent_event_id", "command_id")

#: What a stream sends first: a client that loses it reconnects after a second.
SSE_RETRY: Final = "retry: 1000\n\n"
#: What an idle stream sends to keep proxies from closing it.
SSE_KEEPALIVE: Final = ": keepalive\n\n"


class EventDocument(TypedDict):
    """One event of an execution's log."""

    event_id: str
    execution_id: str
    type: str
    step: str | None
    status: str | None
    payload: dict[str, Any] | None
    error: dict[str, Any] | None
    parent_event_id: str | None
    command_id: str | None
    worker_id: str | None
    time: float


class EndDocument(TypedDict):
    """The last message of a live event stream (`event: end`): how the execution ended."""

    execution_id: str
    status: str
    error: Any


def event_document(e: Event, secrets: frozenset[str] = frozenset()) -> EventDocument:
    """An event as it is shown: ids as strings, payload and error masked with the
    execution's secret set `secrets`."""
    doc = e.to_dict()
    for key in _ID_FIELDS:
        if doc[key] is not None:
            doc[key] = str(doc[key])
    shown: EventDocument = mask_event_doc(doc, secrets)  # type: ignore[assignment]
    return shown


def log_secrets(events: Iterable[Event]) -> frozenset[str]:
    """The secret set a log's `secrets.added` events make up."""
    return frozenset().union(*(secret_values(e) for e in events if e.type == ev.SECRETS_ADDED))


def grown_secrets(secrets: frozenset[str], events: Iterable[Event]) -> frozenset[str]:
    """`secrets` with those the `secrets.added` events among `events` add (a stream
    meets them before the events that hold their values)."""
    found = log_secrets(events)
    return secrets | found if found else secrets


def sse_events(events: Iterable[Event], secrets: frozenset[str]) -> tuple[str, frozenset[str]]:
    """The stream messages of `events` (`id:` event id, `event:` type, `data:` its
    document), masked with `secrets` as grown by them; and the grown set."""
    parts = []
    for e in events:
        if e.type == ev.SECRETS_ADDED:
            secrets = secrets | secret_values(e)
        data = json.dumps(event_document(e, secrets), separators=(",", ":"))
        parts.append(f"id: {e.event_id}\nevent: {e.type}\ndata: {data}\n\n")
    return "".join(parts), secrets


def sse_end(execution_id: int, status: str, error: Any, secrets: frozenset[str]) -> str:
    """The stream's last message: `event: end` with the execution's terminal status."""
    end: EndDocument = {
        "execution_id": str(execution_id),
        "status": status,
        "error": mask_value(error, secrets),
    }
    return f"event: end\ndata: {json.dumps(end, separators=(',', ':'))}\n\n"
