"""`GET /api/executions`'s query (status, page, playbook, parent, time range, duration)
and `GET /api/executions/{id}/events`'s (a page from either end, one step), the same on
a server and in `flowtide ui`, and the list's items."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Query

from flowtide.engine.events import Event
from flowtide.server.fields import IdQuery, Text
from flowtide.store.base import ENDED_STATUSES, ExecutionRow, Store

__all__ = [
    "EventsQuery",
    "ListQuery",
    "events_query",
    "execution_item",
    "list_query",
    "listed",
    "read_events",
]

#: Seconds: up to year 9999 (bounds that every store's REAL/DOUBLE column holds).
_MAX_SECONDS = 253_402_300_800.0


@dataclass(frozen=True)
class ListQuery:
    status: str | None = None
    limit: int = 50
    before: int | None = None
    playbook: str | None = None
    parent: int | None = None
    since: float | None = None
    until: float | None = None
    min_seconds: float | None = None
    max_seconds: float | None = None


def list_query(
    status: Annotated[Text | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=0, le=1000)] = 50,
    before: IdQuery = None,
    playbook: Annotated[
        Text | None,
        Query(max_length=4096, description="Only playbook paths or files containing this."),
    ] = None,
    parent: Annotated[
        IdQuery, Query(description="Only sub-playbook executions of this execution.")
    ] = None,
    since: Annotated[
        float | None,
        Query(ge=0, le=_MAX_SECONDS, description="Only executions created at or after (epoch s)."),
    ] = None,
    until: Annotated[
        float | None,
        Query(ge=0, le=_MAX_SECONDS, description="Only executions created before (epoch s)."),
    ] = None,
    min_seconds: Annotated[
        float | None,
        Query(
            ge=0,
            le=_MAX_SECONDS,
            description="Only executions that lasted at least this long (running ones: so far).",
        ),
    ] = None,
    max_seconds: Annotated[
        float | None,
        Query(ge=0, le=_MAX_SECONDS, description="Only executions that lasted at most this long."),
    ] = None,
) -> ListQuery:
    """The list's query parameters (a FastAPI dependency)."""
    return ListQuery(
        status, limit, before, playbook or None, parent, since, until, min_seconds, max_seconds
    )


def listed(store: Store, q: ListQuery) -> list[ExecutionRow]:
    """The rows `q` selects, newest first (blocks on the store: run it in a thread)."""
    return store.list_executions(
        status=q.status,
        limit=q.limit,
        before_id=q.before,
        playbook=q.playbook,
        parent_id=q.parent,
        created_since=q.since,
        created_until=q.until,
        min_seconds=q.min_seconds,
        max_seconds=q.max_seconds,
    )


def execution_item(
    row: ExecutionRow, progress: dict[str, Any] | None = None, now: float | None = None
) -> dict[str, Any]:
    """An execution as the list shows it: `progress` when known cheaply (see
    `flowtide.ui.summary.execution_summary`), else None."""
    ended = row.updated if row.status in ENDED_STATUSES else None
    return {
        "execution_id": str(row.execution_id),
        "playbook": row.playbook_path or row.playbook_file,
        "version": row.playbook_version,
        "status": row.status,
        "created": row.created,
        "updated": row.updated,
        "ended": ended,
        "duration": max(0.0, (ended if ended is not None else (now or time.time())) - row.created),
        "parent_execution_id": str(row.parent_execution_id) if row.parent_execution_id else None,
        "parent_command_id": str(row.parent_command_id) if row.parent_command_id else None,
        "progress": progress,
    }


@dataclass(frozen=True)
class EventsQuery:
    after: int | None = None
    before: int | None = None
    limit: int = 1000
    newest: bool = False
    step: str | None = None


def events_query(
    after: Annotated[IdQuery, Query(description="Only events after this event id.")] = None,
    before: Annotated[IdQuery, Query(description="Only events before this event id.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    newest: Annotated[
        bool,
        Query(
            description="The newest `limit` events (of those `after`/`before` allow) instead "
            "of the oldest; still in log order. A viewer opens a long log at its end and "
            "pages back with `before`."
        ),
    ] = False,
    step: Annotated[
        Text | None, Query(max_length=256, description="Only this step's events.")
    ] = None,
) -> EventsQuery:
    """The events page's query parameters (a FastAPI dependency)."""
    return EventsQuery(after, before, limit, newest, step)


def read_events(store: Store, execution_id: int, q: EventsQuery) -> list[Event]:
    """The events `q` selects (blocks on the store: run it in a thread)."""
    return store.events(
        execution_id,
        after_event_id=q.after,
        before_event_id=q.before,
        limit=q.limit,
        newest=q.newest,
        steps=[q.step] if q.step is not None else None,
    )
