"""The schedules API of both apps (the server and `flowtide ui`), and the scheduler that
each long-running app runs while it serves (`scheduling`).

Readers list and read schedules; operators add, replace, pause, resume, delete, trigger
and backfill them. A trigger or a backfill runs on the shard that owns the schedule (the
request is forwarded there), where its runs and firings are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from pydantic import Field
from typing_extensions import TypedDict

from flowtide.documents.schedules import (
    ScheduleDocument,
    ScheduleItem,
    iso,
    schedule_document,
    schedule_item,
)
from flowtide.errors import (
    ExecutionFinished,
    FlowtideError,
    NotFoundError,
    PlaybookError,
    TemplateError,
    TriggerError,
)
from flowtide.ids import default_generator
from flowtide.store.base import Store
from flowtide.store.triggers import Firing, TriggerRow
from flowtide.triggers.scheduler import Scheduler, fire_now, run_backfill
from flowtide.triggers.schedules import define_schedule, schedule_from_fields
from flowtide.triggers.spec import ScheduleSpec, parse_time, spec_from_json
from flowtide.triggers.targets import TriggeredRun
from flowtide.web.fields import INT32_MAX, RequestBody
from flowtide.web.problems import RequestError, problem_responses
from flowtide.web.reads import ExecutionReads, reads_of

__all__ = ["ReadsFirer", "router", "scheduling"]

log = logging.getLogger("flowtide.scheduler")

Reads = Annotated[ExecutionReads, Depends(reads_of)]
Name = Annotated[str, PathParam(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]

router = APIRouter(tags=["schedules"])

#: The most slots one backfill request may start or record.
MAX_BACKFILL = 1000


class ReadsFirer:
    """The scheduler's `Firer` over an app's read port: its store, the shard it owns,
    and starting and cancelling runs."""

    def __init__(self, reads: ExecutionReads) -> None:
        self.reads = reads
        #: Runs started one by one (a read port without `start_many`), 16 at a time
        #: across all batches.
        self._gate = asyncio.Semaphore(16)

    @property
    def store(self) -> Store:
        return self.reads.store

    def owns(self, trigger_id: int) -> bool:
        return self.reads.owns(trigger_id)

    async def start(
        self,
        playbook: Any,
        *,
        workload: dict[str, Any],
        version: int | None,
        firing: Firing,
        notify: Sequence[dict[str, Any]] = (),
    ) -> int:
        return await self.reads.start(
            playbook, workload=workload, catalog_version=version, firing=firing, notify=notify
        )

    async def start_many(self, runs: Sequence[TriggeredRun]) -> list[int | FlowtideError]:
        batched = getattr(self.reads, "start_many", None)
        if batched is not None:
            # A server: the runs created together, a few commits for a burst.
            found: list[int | FlowtideError] = await batched(runs)
            return found

        async def one(run: TriggeredRun) -> int | FlowtideError:
            async with self._gate:
                try:
                    return await self.reads.start(
                        run.playbook,
                        workload=run.workload,
                        catalog_version=run.catalog_version,
                        firing=run.firing,
                        notify=run.notify,
                    )
                except FlowtideError as exc:
                    return exc

        return list(await asyncio.gather(*(one(run) for run in runs)))

    async def cancel(self, execution_id: int, reason: str) -> None:
        with contextlib.suppress(RequestError, ExecutionFinished, NotFoundError):
            await self.reads.cancel(execution_id, reason)


@contextlib.asynccontextmanager
async def scheduling(app: FastAPI, reads: ExecutionReads) -> AsyncIterator[Scheduler]:
    """Run a scheduler over `reads` while the app serves (`app.state.scheduler`)."""
    scheduler = Scheduler(ReadsFirer(reads))
    app.state.scheduler = scheduler
    task = asyncio.create_task(scheduler.run(), name="flowtide-scheduler")
    try:
        yield scheduler
    finally:
        scheduler.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        app.state.scheduler = None


def _poke(request: Request) -> None:
    """The app's own scheduler reads the definitions again now (the others within
    seconds)."""
    scheduler = getattr(request.app.state, "scheduler", None)
    if scheduler is not None:
        scheduler.changed()


class ScheduleRequest(RequestBody):
    """A schedule: the fields of a `kind: Schedule` document's `spec:`, and its name."""

    name: str = Field(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    playbook: str = Field(max_length=4096, description="Catalog path of the playbook.")
    version: int | None = Field(
        None, ge=1, le=INT32_MAX, description="Catalog version (default: the latest)."
    )
    cron: str | None = Field(None, max_length=256, description="5 fields (or 6, seconds first).")
    every: str | float | None = Field(None, description="An interval: `2s`, `15m`, `1h`.")
    offset: str | float | None = Field(None, description="Offset of `every`'s slots.")
    timezone: str | None = Field(None, max_length=64, description="IANA zone of `cron`.")
    workload: dict[str, Any] | None = Field(
        None, description="The run's workload; templates see `schedule.time`, `.name`, `.slot`."
    )
    overlap: str | None = Field(None, description="skip|buffer_one|buffer_all|cancel_other|allow")
    catchup: str | float | None = Field(None, description="Window of missed slots to run.")
    jitter: str | float | None = Field(None, description="Delay each run by up to this.")
    paused: bool | None = None
    start: str | float | None = Field(None, description="No slot before (ISO 8601 or Unix s).")
    end: str | float | None = Field(None, description="No slot after (ISO 8601 or Unix s).")
    notify: list[dict[str, Any]] | None = None
    description: str | None = Field(None, max_length=1000)
    replace: bool = Field(False, description="Replace a schedule of this name.")


class BackfillRequest(RequestBody):
    start: str | float = Field(description="First slot time (ISO 8601 with a zone, or Unix s).")
    end: str | float = Field(description="Last slot time (inclusive).")


class ScheduleList(TypedDict):
    items: list[ScheduleItem]


class Started(TypedDict):
    execution_id: str
    status: str


class BackfillDocument(TypedDict):
    """What a backfill did, by slot key."""

    started: dict[str, str]
    buffered: list[str]
    skipped: list[str]
    #: Slots that had started a run before: left alone.
    already: list[str]


async def _row(reads: ExecutionReads, name: str) -> tuple[TriggerRow, ScheduleSpec]:
    try:
        row = await asyncio.to_thread(reads.store.get_trigger, "schedule", name)
    except NotFoundError:
        raise RequestError(404, f"no schedule named {name!r}") from None
    return row, spec_from_json(row.spec)


def _refused(exc: FlowtideError) -> RequestError:
    field = getattr(exc, "field", None) or "schedule"
    message = getattr(exc, "message", None) or str(exc)
    return RequestError(400, str(message), field=field)


@router.get("/api/schedules")
async def list_schedules(reads: Reads) -> ScheduleList:
    """Every schedule by name, each with its next five fire times."""
    rows = await asyncio.to_thread(reads.store.list_triggers, "schedule")
    now = time.time()
    return {"items": [schedule_item(r, spec_from_json(r.spec), now=now) for r in rows]}


@router.post(
    "/api/schedules",
    status_code=201,
    responses=problem_responses((400, "An invalid field, named."), 409),
)
async def add_schedule(body: ScheduleRequest, request: Request, reads: Reads) -> ScheduleDocument:
    """Add a schedule (or replace one, with `replace`). The playbook must be in the
    catalog. Its first slot is the first one after now."""
    fields = body.model_dump(exclude={"name", "replace"})
    try:
        spec = schedule_from_fields(body.name, fields)
    except TriggerError as exc:
        raise _refused(exc) from None

    def define() -> TriggerRow:
        return define_schedule(
            reads.store,
            spec,
            new_id=default_generator().next_id,
            now=time.time(),
            local=False,
            replace_existing=body.replace,
        )

    try:
        row = await asyncio.to_thread(define)
    except TriggerError as exc:
        if exc.field == "name":
            raise RequestError(409, str(exc), field="name") from None
        raise _refused(exc) from None
    _poke(request)
    return schedule_document(row, spec_from_json(row.spec), now=time.time(), firings=[], running=[])


@router.get("/api/schedules/{name}", responses=problem_responses(404))
async def get_schedule(name: Name, request: Request, reads: Reads) -> ScheduleDocument:
    """A schedule: its definition, next fire times, runs still going and latest firings
    (read on the shard that owns it)."""
    row, spec = await _row(reads, name)
    there = await reads.route_to(request, row.trigger_id)
    if there is not None:
        return there  # type: ignore[return-value]  # the owning shard's answer

    def read() -> tuple[list[Any], list[int]]:
        return reads.store.firings(row.trigger_id, limit=50), reads.store.trigger_running(
            row.trigger_id
        )

    firings, running = await asyncio.to_thread(read)
    return schedule_document(row, spec, now=time.time(), firings=firings, running=running)


@router.delete("/api/schedules/{name}", status_code=204, responses=problem_responses(404))
async def delete_schedule(name: Name, request: Request, reads: Reads) -> Response:
    """Delete a schedule (the runs it started stay, and say it started them)."""
    try:
        await asyncio.to_thread(reads.store.delete_trigger, "schedule", name)
    except NotFoundError:
        raise RequestError(404, f"no schedule named {name!r}") from None
    _poke(request)
    return Response(status_code=204)


async def _set_paused(
    name: str, paused: bool, request: Request, reads: ExecutionReads
) -> ScheduleItem:
    try:
        row = await asyncio.to_thread(
            reads.store.set_trigger_paused, "schedule", name, paused, now=time.time()
        )
    except NotFoundError:
        raise RequestError(404, f"no schedule named {name!r}") from None
    _poke(request)
    return schedule_item(row, spec_from_json(row.spec), now=time.time())


@router.post("/api/schedules/{name}/pause", responses=problem_responses(404))
async def pause_schedule(name: Name, request: Request, reads: Reads) -> ScheduleItem:
    """Pause a schedule: no slot fires until it is resumed."""
    return await _set_paused(name, True, request, reads)


@router.post("/api/schedules/{name}/resume", responses=problem_responses(404))
async def resume_schedule(name: Name, request: Request, reads: Reads) -> ScheduleItem:
    """Resume a schedule: the slots after now fire (those while it was paused do not;
    `backfill` runs them)."""
    return await _set_paused(name, False, request, reads)


@router.post(
    "/api/schedules/{name}/trigger",
    status_code=202,
    responses=problem_responses(400, 404),
)
async def trigger_schedule(name: Name, request: Request, reads: Reads) -> Started:
    """One run of the schedule now (paused or not, whatever its overlap policy)."""
    row, _ = await _row(reads, name)
    there = await reads.route_to(request, row.trigger_id)
    if there is not None:
        return there  # type: ignore[return-value]  # the owning shard's answer
    now = time.time()
    key = f"manual-{default_generator().next_id()}"
    try:
        execution_id = await fire_now(ReadsFirer(reads), row, now=now, key=key)
    except (PlaybookError, TemplateError, NotFoundError) as exc:
        raise RequestError(400, str(exc), field="playbook") from None
    return {"execution_id": str(execution_id), "status": "running"}


@router.post(
    "/api/schedules/{name}/backfill",
    responses=problem_responses((400, "A bad range, or more slots than allowed."), 404),
)
async def backfill_schedule(
    name: Name, body: BackfillRequest, request: Request, reads: Reads
) -> BackfillDocument:
    """Every slot of the schedule from `start` to `end` (inclusive) by its overlap
    policy, catchup aside, at most 1,000 slots: slots that started a run before are left
    alone, so a backfill repeated starts nothing twice."""
    row, _ = await _row(reads, name)
    there = await reads.route_to(request, row.trigger_id)
    if there is not None:
        return there  # type: ignore[return-value]
    try:
        start = parse_time(body.start, "start")
        end = parse_time(body.end, "end")
        if end < start:
            raise TriggerError(f"end {iso(end)} is before start {iso(start)}", field="end")
        result = await run_backfill(
            ReadsFirer(reads), row, start=start, end=end, now=time.time(), limit=MAX_BACKFILL
        )
    except TriggerError as exc:
        raise _refused(exc) from None
    except (PlaybookError, TemplateError, NotFoundError) as exc:
        raise RequestError(400, str(exc), field="playbook") from None
    _poke(request)
    return {
        "started": {k: str(v) for k, v in result.started.items()},
        "buffered": result.buffered,
        "skipped": result.skipped,
        "already": result.already,
    }
