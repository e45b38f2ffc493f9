"""Lists of executions and pages of an execution's events: their queries (the list:
status, page, playbook, parent, time range, duration; the events: a page from either
end, one step), what they read from a store, and the list's items."""

from __future__ import annotations

import time
from dataclasses import dataclass

from typing_extensions import TypedDict

from flowtide.documents.summary import Progress
from flowtide.engine.events import Event
from flowtide.store.base import ENDED_STATUSES, INTERRUPTED, ExecutionRow, Store

__all__ = [
    "EventsQuery",
    "ExecutionItem",
    "ExecutionList",
    "ListQuery",
    "ShardMissing",
    "execution_item",
    "listed",
    "read_events",
]


class ExecutionItem(TypedDict):
    """An execution as a list shows it."""

    execution_id: str
    playbook: str | None
    version: int | None
    created: float
    updated: float
    #: When it ended (null while it runs).
    ended: float | None
    #: running, completed, failed, cancelled; `interrupted` for an embedded run whose
    #: process went away before it ended (resumable).
    status: str
    #: Seconds from its creation to its end (or to now, while it runs; to its last event
    #: when interrupted).
    duration: float
    parent_execution_id: str | None
    parent_command_id: str | None
    #: A running execution's progress when known cheaply, else null.
    progress: Progress | None
    #: What started it when a trigger did (see `ShownExecution.trigger`), else null.
    trigger: dict[str, str] | None


class ShardMissing(TypedDict):
    """A shard that did not answer a cluster-wide list in time."""

    shard: int
    error: str


class ExecutionList(TypedDict):
    """`GET /api/executions`: a page, newest first."""

    items: list[ExecutionItem]
    #: Pass as `before` for the next page (null on the last).
    next_before: str | None
    unavailable_shards: list[ShardMissing]


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
    trigger: str | None = None


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
        trigger=q.trigger,
    )


def execution_item(
    row: ExecutionRow,
    progress: Progress | None = None,
    now: float | None = None,
    stopped: float | None = None,
) -> ExecutionItem:
    """An execution as a list shows it: `progress` when known cheaply (see
    `flowtide.documents.summary.progress_of`), else None. `stopped`: when a running one's
    process went away (`flowtide.runlock.stopped_runs`): it is `interrupted`, its
    duration up to then."""
    ended = row.updated if row.status in ENDED_STATUSES else None
    status = row.status
    last = ended if ended is not None else (now or time.time())
    if stopped is not None and ended is None:
        status, last = INTERRUPTED, stopped
    return {
        "execution_id": str(row.execution_id),
        "playbook": row.playbook_path or row.playbook_file,
        "version": row.playbook_version,
        "status": status,
        "created": row.created,
        "updated": row.updated,
        "ended": ended,
        "duration": max(0.0, last - row.created),
        "parent_execution_id": str(row.parent_execution_id) if row.parent_execution_id else None,
        "parent_command_id": str(row.parent_command_id) if row.parent_command_id else None,
        "progress": progress,
        "trigger": row.trigger,
    }


@dataclass(frozen=True)
class EventsQuery:
    after: int | None = None
    before: int | None = None
    limit: int = 1000
    newest: bool = False
    step: str | None = None


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
