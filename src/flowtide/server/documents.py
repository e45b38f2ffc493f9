"""What the API shows of the engine's values: events and report outcomes as JSON
documents (ids as strings: JSON numbers read as doubles lose snowflake ids)."""

from __future__ import annotations

from typing import Any

from flowtide.engine.events import Event
from flowtide.redaction import mask_event_doc
from flowtide.server.steps import SubmitResult

__all__ = ["event_document", "refused_stale", "submit_document"]

_ID_FIELDS = ("event_id", "execution_id", "parent_event_id", "command_id")


def event_document(e: Event, secrets: frozenset[str] = frozenset()) -> dict[str, Any]:
    """An event as the API shows it: ids as strings, payload and error masked with the
    execution's secret set `secrets`."""
    doc = e.to_dict()
    for key in _ID_FIELDS:
        if doc[key] is not None:
            doc[key] = str(doc[key])
    return mask_event_doc(doc, secrets)


def submit_document(result: SubmitResult) -> dict[str, Any]:
    """What a worker report's reply says of it (single or in a batch)."""
    return {
        "accepted": result.accepted,
        "duplicates": result.duplicates,
        "stale": result.stale,
        "status": result.status,
    }


def refused_stale(result: SubmitResult) -> bool:
    """A report whose every command was stale: answered 409."""
    return bool(result.stale and not result.accepted)
