"""The query parameters of the executions list and of an execution's events page, as
FastAPI dependencies that give the documents' query values (`flowtide.documents.listing`)
and say their bounds to the validator and the OpenAPI document."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from flowtide.documents.listing import EventsQuery, ListQuery
from flowtide.web.fields import IdQuery, Text

__all__ = ["events_query", "list_query"]

#: Seconds: up to year 9999 (bounds that every store's REAL/DOUBLE column holds).
_MAX_SECONDS = 253_402_300_800.0


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
    trigger: Annotated[
        Text | None,
        Query(
            max_length=300,
            pattern=r"^(schedule|hook|subscription)(:[^:]+)?$",
            description="Only executions a trigger started: its kind (`schedule`, `hook`, "
            "`subscription`) or `kind:name` for one trigger.",
        ),
    ] = None,
) -> ListQuery:
    """The list's query parameters (a FastAPI dependency)."""
    return ListQuery(
        status,
        limit,
        before,
        playbook or None,
        parent,
        since,
        until,
        min_seconds,
        max_seconds,
        trigger or None,
    )


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
