"""What people and programs read about schedules: a schedule in a list (with its next
fire times), its full document (workload, policies, latest firings), a firing, and what a
backfill did. Shared by the server, `flowtide ui` and the CLI."""

from __future__ import annotations

import datetime
from typing import Any

from typing_extensions import TypedDict

from flowtide.store.triggers import FiringRow, TriggerRow
from flowtide.triggers.spec import ScheduleSpec
from flowtide.triggers.when import Cron, describe, next_slots

__all__ = [
    "FiringItem",
    "ScheduleDocument",
    "ScheduleItem",
    "firing_item",
    "iso",
    "schedule_document",
    "schedule_item",
]

#: How many next fire times a list and a document show.
NEXT_SHOWN = 5


class FiringItem(TypedDict):
    """One firing of a schedule: a slot that started a run, or was skipped or buffered."""

    key: str
    #: The slot's time (Unix seconds); null for a firing without one.
    slot: float | None
    #: started, skipped or buffered.
    status: str
    execution_id: str | None
    #: The status of the run it started (running, completed, failed, cancelled).
    execution_status: str | None
    #: When it was recorded.
    time: float
    #: Why a slot was skipped: overlap (a run still going) or missed (outside catchup).
    reason: str | None


class ScheduleItem(TypedDict):
    """A schedule as a list shows it."""

    name: str
    #: Catalog path (or, on a local store, a file).
    playbook: str
    version: int | None
    #: One line: `cron '0 2 * * *' Europe/Berlin`, `every 15m (offset 30s)`.
    when: str
    cron: str | None
    every: float | None
    offset: float | None
    #: The zone cron times are read in (UTC for `every`).
    timezone: str
    overlap: str
    catchup: float
    jitter: float
    paused: bool
    start: float | None
    end: float | None
    #: The next fire times (Unix seconds; none while paused or past `end`).
    next: list[float]
    description: str
    created: float
    updated: float


class ScheduleDocument(ScheduleItem):
    """`GET /api/schedules/{name}`: the schedule, its workload, notifications, the runs it
    started that have not ended, and its latest firings (newest first)."""

    workload: dict[str, Any]
    notify: list[dict[str, Any]]
    running: list[str]
    firings: list[FiringItem]


def iso(at: float, zone: datetime.tzinfo = datetime.UTC) -> str:
    """ISO 8601 of a Unix time in `zone` (UTC: with `Z`)."""
    text = datetime.datetime.fromtimestamp(at, zone).isoformat(timespec="seconds")
    return text.replace("+00:00", "Z") if zone is datetime.UTC else text


def schedule_item(row: TriggerRow, spec: ScheduleSpec, *, now: float) -> ScheduleItem:
    """A schedule as a list shows it, its next fire times counted from `now`."""
    when = spec.when
    upcoming: list[float] = []
    if not row.paused:
        after = max(now, spec.start - 1e-6) if spec.start is not None else now
        upcoming = [
            t for t in next_slots(when, after, NEXT_SHOWN) if spec.end is None or t <= spec.end
        ]
    return {
        "name": row.name,
        "playbook": spec.playbook,
        "version": spec.version,
        "when": describe(when),
        "cron": when.expr if isinstance(when, Cron) else None,
        "every": None if isinstance(when, Cron) else when.every,
        "offset": None if isinstance(when, Cron) else when.offset,
        "timezone": when.timezone if isinstance(when, Cron) else "UTC",
        "overlap": spec.overlap,
        "catchup": spec.catchup,
        "jitter": spec.jitter,
        "paused": row.paused,
        "start": spec.start,
        "end": spec.end,
        "next": upcoming,
        "description": spec.description,
        "created": row.created,
        "updated": row.updated,
    }


def firing_item(firing: FiringRow) -> FiringItem:
    return {
        "key": firing.key,
        "slot": firing.slot,
        "status": firing.status,
        "execution_id": None if firing.execution_id is None else str(firing.execution_id),
        "execution_status": firing.execution_status,
        "time": firing.time,
        "reason": firing.reason,
    }


def schedule_document(
    row: TriggerRow,
    spec: ScheduleSpec,
    *,
    now: float,
    firings: list[FiringRow],
    running: list[int],
) -> ScheduleDocument:
    """The schedule's whole document (see `ScheduleDocument`)."""
    item = schedule_item(row, spec, now=now)
    return {
        **item,
        "workload": dict(spec.workload),
        "notify": list(spec.notify),
        "running": [str(r) for r in running],
        "firings": [firing_item(f) for f in firings],
    }
