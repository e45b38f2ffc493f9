"""The executions API, one router for both apps that serve it (the server and
`flowtide ui`): start, list, read (the document, its summary, a step, the timeline, the
events, the live stream), cancel and re-run executions; and, where the app runs them
itself, resume (`resume_router`).

Every route reads through the app's read port (`flowtide.web.reads.ExecutionReads`) and
builds its answer with `flowtide.documents`, so a document is written once: what the
server answers and what `flowtide ui` answers differ only where their stores do. Values
of an execution's secret set are masked in every document.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import partial
from typing import Annotated, Final

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse
from typing_extensions import TypedDict

from flowtide import tracing
from flowtide.auth.principal import Principal
from flowtide.documents.events import (
    SSE_KEEPALIVE,
    SSE_RETRY,
    EventDocument,
    event_document,
    sse_end,
    sse_events,
)
from flowtide.documents.execution import ShownExecution, as_interrupted, shown
from flowtide.documents.listing import (
    EventsQuery,
    ExecutionItem,
    ExecutionList,
    ListQuery,
    execution_item,
    listed,
    read_events,
)
from flowtide.documents.notifications import notifications_of
from flowtide.documents.step import CALL_TYPES, CALLS_SHOWN, StepDocument, step_document
from flowtide.documents.summary import SummaryDocument, kept_summary, summary_document
from flowtide.documents.summary import as_interrupted as summary_interrupted
from flowtide.documents.timeline import MAX_BUCKETS, TimelineDocument, execution_timeline
from flowtide.errors import ExecutionFinished, NotFoundError, PlaybookError, TemplateError
from flowtide.logread import read_logs
from flowtide.playbook.loader import parse_playbook
from flowtide.store.base import ENDED_STATUSES, INTERRUPTED
from flowtide.web.access import caller
from flowtide.web.bodies import CancelRequest, ExecuteRequest, RerunRequest
from flowtide.web.catalog import requested_playbook, sql_refused, sql_strict
from flowtide.web.fields import INT64_MAX, IdPath, Text
from flowtide.web.problems import RequestError, problem_responses
from flowtide.web.queries import events_query, list_query
from flowtide.web.reads import EventFeed, ExecutionReads, ResumableReads, reads_of
from flowtide.wire import EXECUTE_PATH, TRACEPARENT_HEADER

__all__ = ["STREAM_KEEPALIVE", "STREAM_POLL", "resume_router", "router", "sse_stream"]

#: How often a live stream reads the log while it is caught up; a keep-alive comment
#: after this long idle (proxies close silent connections).
STREAM_POLL: Final = 0.25
STREAM_KEEPALIVE: Final = 15.0

Caller = Annotated[Principal, Depends(caller)]
Reads = Annotated[ExecutionReads, Depends(reads_of)]
StepName = Annotated[Text, PathParam(max_length=256)]


class Started(TypedDict):
    execution_id: str
    #: running
    status: str


class Rerun(Started):
    #: The execution re-run.
    rerun_of: str


class Cancelled(TypedDict):
    execution_id: str
    #: The status after the call (cancelled, or cancelling while it stops).
    status: str


router = APIRouter()


@router.post(
    EXECUTE_PATH,
    status_code=201,
    responses=problem_responses(
        (400, "Not exactly one of path, catalog_id and playbook; or an invalid playbook."),
        (404, "No such catalog path or version, or no such parent execution."),
        (409, "The parent execution is ending: no sub-playbook starts under it."),
    ),
)
async def execute(body: ExecuteRequest, request: Request, who: Caller, reads: Reads) -> Started:
    """Start an execution of a catalog playbook (path/version or catalog_id) or of an
    inline playbook, with `payload` as workload overrides. A worker may start only
    sub-playbooks of the commands it holds, on its own pool. A sub-playbook starts on its
    parent's shard (its cancel cascade and the parent's checks stay in one database).
    With traces on, a W3C `traceparent` header makes the run part of that trace."""
    answered = await reads.admit(body, who, request)
    if answered is not None:
        return answered  # type: ignore[return-value]  # the owning shard's reply
    try:
        playbook, version = await requested_playbook(reads.store, body)
        if body.playbook and sql_strict(request):
            refused = await asyncio.to_thread(sql_refused, playbook, None)
            if refused is not None:
                raise refused
        execution_id = await reads.start(
            playbook,
            workload=body.payload,
            catalog_version=version,
            parent_execution_id=body.parent_execution_id,
            parent_command_id=body.parent_command_id,
            pool=body.pool,
            traceparent=tracing.incoming(request.headers.get(TRACEPARENT_HEADER)),
        )
    except (PlaybookError, TemplateError) as exc:
        raise RequestError(400, str(exc), field="playbook") from None
    except ExecutionFinished as exc:
        # A sub-playbook of a parent that is ending: nothing may start under it.
        raise RequestError(
            409, f"parent {exc}: no sub-playbook starts under it", field="parent_execution_id"
        ) from None
    return {"execution_id": str(execution_id), "status": "running"}


@router.get("/api/executions")
async def list_executions(
    request: Request, reads: Reads, q: Annotated[ListQuery, Depends(list_query)]
) -> ExecutionList:
    """Executions newest first (by id: ids are snowflakes, in creation order across
    shards); pass `next_before` as `before` for the next page. Filters: `status`,
    `playbook` (text in the path or file), `parent`, `since`/`until` (creation time) and
    `min_seconds`/`max_seconds` (duration). An item's `progress` (loop iterations done
    of total) is there where it is cheap to know (a server: while it holds the running
    execution's state), else null. In a cluster of several shards every shard is asked
    at once and the pages merged: a shard that does not answer in time is left out and
    named in `unavailable_shards` (its executions come in a later listing, never
    silently skipped on a page that says it is whole)."""

    async def page() -> list[ExecutionItem]:
        wanted = q.status
        if wanted in (INTERRUPTED, "running"):
            # Rows say running; which of them stopped is known when read.
            rows = await asyncio.to_thread(listed, reads.store, replace(q, status="running"))
        else:
            rows = await asyncio.to_thread(listed, reads.store, q)
        running = [r.execution_id for r in rows if r.status not in ENDED_STATUSES]
        stopped = await reads.stopped(running)
        known = await reads.progress([i for i in running if i not in stopped])
        items = [
            execution_item(r, known.get(r.execution_id), stopped=stopped.get(r.execution_id))
            for r in rows
        ]
        if wanted in (INTERRUPTED, "running"):
            items = [item for item in items if item["status"] == wanted]
        return items

    items, missing = await reads.merge_shards(page(), q.limit, request)
    last = items[-1]["execution_id"] if len(items) == q.limit and items else None
    return {"items": items, "next_before": last, "unavailable_shards": missing}


@router.get("/api/executions/{execution_id}", responses=problem_responses(404))
async def get_execution(execution_id: IdPath, who: Caller, reads: Reads) -> ShownExecution:
    """The execution's document (the same as `flowtide run --json`): values of the
    execution's secret set are masked (`***`)."""
    await reads.check(who, execution_id)
    state = await reads.state(execution_id)
    row = await reads.row(execution_id)
    doc = shown(state)
    if await _stopped(reads, state.terminal, execution_id) is not None:
        doc = as_interrupted(doc)
    return {**doc, "playbook": row.playbook_path or row.playbook_file, "trigger": row.trigger}


async def _stopped(reads: ExecutionReads, terminal: bool, execution_id: int) -> float | None:
    """When an execution that has not ended stopped, when no process runs it any more
    (it is shown `interrupted`); None while it runs (or once it ended)."""
    if terminal:
        return None
    return (await reads.stopped([execution_id])).get(execution_id)


@router.get("/api/executions/{execution_id}/summary", responses=problem_responses(404))
async def get_execution_summary(execution_id: IdPath, who: Caller, reads: Reads) -> SummaryDocument:
    """An execution at a glance, for the UI: per step its status, runs, times, error and
    loop counts (`steps`), the arcs taken (`taken`), the progress, the playbook's
    steps and arcs laid out in layers (`graph`), and its notification deliveries
    (`notifications`: on which transition, the masked target, sent or not, attempts).
    Its size follows the playbook's steps, not a loop's iterations; no step results
    (`GET /api/executions/{id}` has them).
    Values of the execution's secret set are masked."""
    await reads.check(who, execution_id)
    row = await reads.row(execution_id)
    # An ended execution's summary as kept when it ended: no fold of its log.
    doc = await asyncio.to_thread(kept_summary, reads.store, row)
    if doc is None:
        state = await reads.state(execution_id)
        notes = await asyncio.to_thread(notifications_of, reads.store, execution_id)
        doc = summary_document(state, await reads.row(execution_id), notes)
        stopped = await _stopped(reads, state.terminal, execution_id)
        if stopped is not None:
            doc = summary_interrupted(doc, stopped)
    if reads.local:
        doc["run_here"] = reads.runs_here(execution_id)
    return doc


@router.get(
    "/api/executions/{execution_id}/steps/{step}",
    responses=problem_responses((404, "No such execution, or no such step in its playbook.")),
)
async def get_execution_step(
    execution_id: IdPath, step: StepName, who: Caller, reads: Reads
) -> StepDocument:
    """One step of an execution, for the UI's step panel: status, runs, times, error
    with the playbook's file and line, the step's YAML source, its result (null with
    `result_truncated` past 256 KiB), its loop's counts, its newest calls, and for a
    Spark step the Spark run (master, app id, jobs, rows written) with the dataset's
    schema and preview rows. Values of the execution's secret set are masked."""
    await reads.check(who, execution_id)
    state = await reads.state(execution_id)
    if step not in state.playbook.steps:
        raise NotFoundError(f"execution {execution_id} has no step {step!r}")
    store = reads.store
    calls = await asyncio.to_thread(
        lambda: store.events(
            execution_id, types=CALL_TYPES, steps=[step], limit=CALLS_SHOWN, newest=True
        )
    )
    interrupted = await _stopped(reads, state.terminal, execution_id) is not None
    return step_document(state, step, calls, interrupted)


@router.get("/api/executions/{execution_id}/timeline", responses=problem_responses(404))
async def get_execution_timeline(
    execution_id: IdPath,
    who: Caller,
    reads: Reads,
    buckets: Annotated[int, Query(ge=1, le=MAX_BUCKETS)] = 120,
) -> TimelineDocument:
    """An execution's timeline, for the UI's Gantt chart: each step's runs, and its
    commands one by one (issued, started, ended, attempt) while it has at most 300, or
    as a density lane (commands completed and failed per time bucket) beyond that."""
    await reads.check(who, execution_id)
    state = await reads.state(execution_id)
    status = state.status
    if await _stopped(reads, state.terminal, execution_id) is not None:
        status = INTERRUPTED
    return await asyncio.to_thread(
        execution_timeline, reads.store, state.playbook, execution_id, status, buckets
    )


@router.get("/api/executions/{execution_id}/events", responses=problem_responses(404))
async def execution_events(
    execution_id: IdPath, reads: Reads, q: Annotated[EventsQuery, Depends(events_query)]
) -> list[EventDocument]:
    """An execution's events in log order: the oldest `limit` after `after`, or with
    `newest` the newest ones (before `before`); `step` keeps one step's. Values of the
    execution's secret set are masked."""
    events = await asyncio.to_thread(read_events, reads.store, execution_id, q)
    if not events:
        await reads.row(execution_id)  # 404 when there is no such execution
        return []
    secrets = (await reads.state(execution_id)).secrets
    return [event_document(e, secrets) for e in events]


@router.get(
    "/api/executions/{execution_id}/events/stream",
    summary="Follow an execution's events (Server-Sent Events)",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`id:` event id, `event:` event type, `data:` the event "
            "document; a final `event: end` carries the terminal status.",
        },
        **problem_responses(
            (404, "No such execution."),
            (422, "`after` / `Last-Event-ID` is not an event of it."),
        ),
    },
)
async def stream_events(
    execution_id: IdPath,
    reads: Reads,
    after: Annotated[
        int | None,
        Query(ge=0, le=INT64_MAX, description="Start after this event id (0: from the start)."),
    ] = None,
    last_event_id: Annotated[
        int | None,
        Header(
            ge=0,
            le=INT64_MAX,
            description="Sent by a reconnecting EventSource; wins over `after`.",
        ),
    ] = None,
) -> StreamingResponse:
    """The execution's events in log order, each once, as they are written: the
    documents of `GET /api/executions/{id}/events`. Ends with `event: end` once the
    execution is completed, failed or cancelled; idle streams get a `: keepalive`
    comment every 15 s. A client that reconnects with `Last-Event-ID` (or `?after=`)
    resumes right after that event, without gaps or repeats."""
    start = last_event_id if last_event_id is not None else after
    field = "Last-Event-ID" if last_event_id is not None else "after"
    try:
        feed = await reads.feed(execution_id, start or None)
    except LookupError:
        message = f"event {start} is not in execution {execution_id}"
        raise RequestError.of_field(field, message) from None
    secrets = (await reads.state(execution_id)).secrets
    return StreamingResponse(
        sse_stream(feed, execution_id, secrets),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def sse_stream(
    feed: EventFeed, execution_id: int, secrets: frozenset[str]
) -> AsyncIterator[str]:
    """The stream of `feed` as Server-Sent Events, masked with the execution's secret
    set (`secrets` as known at the start, then grown by the `secrets.added` events
    streamed, which come before the events that hold their values)."""
    loop = asyncio.get_running_loop()
    yield SSE_RETRY
    last_sent = loop.time()
    while True:
        got = await feed.read()
        if got.events:
            text, secrets = sse_events(got.events, secrets)
            yield text
            last_sent = loop.time()
        if got.ended is not None:
            yield sse_end(execution_id, *got.ended, secrets)
            return
        if got.more:
            continue
        if loop.time() - last_sent >= STREAM_KEEPALIVE:
            yield SSE_KEEPALIVE
            last_sent = loop.time()
        await asyncio.sleep(STREAM_POLL)


#: Log streams (`GET /api/executions/{id}/logs`) one process serves at once.
MAX_LOG_STREAMS: Final = 64
#: Log reads without `follow` one process serves at once (apart from the streams: a
#: page that reads a log while others follow is not refused for them). Each read may
#: hold megabytes of a running execution's rings: without a cap, many requests at once
#: would hold any amount.
MAX_LOG_READS: Final = 16


class _Slots:
    """Following log streams held now. A slot is taken when the route answers (not when
    its body starts: requests in flight together all passed a check made before any
    body ran) and given back once, when the stream ends or, if its body never ran (the
    client went away first), when the stream is dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, owner: object) -> Callable[[], None] | None:
        if self.held >= self.limit:
            return None
        self.held += 1
        given = False

        def give() -> None:
            nonlocal given
            if not given:
                given = True
                self.held -= 1

        weakref.finalize(owner, give)
        return give


_log_streams = _Slots(MAX_LOG_STREAMS)
_log_reads = _Slots(MAX_LOG_READS)


@router.get(
    "/api/executions/{execution_id}/logs",
    summary="What an execution's steps printed, live while they run",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/x-ndjson": {}},
            "description": "One JSON document per line: `command_id`, `step`, `loop_index`, "
            "`offset` (bytes into the command's output), `dropped` (bytes before it no "
            "longer kept), `text`, `running`. With `follow`, an empty line is a keep-alive.",
        },
        **problem_responses(
            (404, "No such execution, or no such step in its playbook."),
            (503, "Too many log streams (or reads) are open on this server."),
        ),
    },
)
async def execution_logs(
    execution_id: IdPath,
    who: Caller,
    reads: Reads,
    step: Annotated[str | None, Query(max_length=256, description="Only this step's.")] = None,
    follow: Annotated[bool, Query(description="Keep streaming until the run ends.")] = False,
) -> StreamingResponse:
    """What the execution's steps wrote (python prints, shell and script output, spark
    driver messages): ended commands first, then the running ones; with `follow`, what
    they write next, until the execution ends. A running command keeps its newest 64 KiB
    (`dropped` says what a slow reader missed). Values of the execution's secret set are
    masked."""
    await reads.check(who, execution_id)
    state = await reads.state(execution_id)
    if step is not None and step not in state.playbook.steps:
        raise NotFoundError(f"execution {execution_id} has no step {step!r}")

    async def status() -> str:
        status = (await reads.row(execution_id)).status
        if status == "running" and await _stopped(reads, False, execution_id) is not None:
            return "interrupted"  # no process runs it (`flowtide ui`): nothing more comes
        return status

    async def secrets() -> frozenset[str]:
        return (await reads.state(execution_id)).secrets

    async def lines() -> AsyncIterator[str]:
        try:
            async for piece in read_logs(
                reads.store,
                execution_id,
                live=partial(reads.live_logs, execution_id),
                status=status,
                secrets=secrets,
                step=step,
                follow=follow,
                idle=STREAM_KEEPALIVE,
            ):
                yield "\n" if piece is None else json.dumps(piece) + "\n"
        finally:
            give()

    body = lines()
    slots = _log_streams if follow else _log_reads
    taken = slots.take(body)
    if taken is None:
        what = "log streams" if follow else "log reads"
        raise RequestError(503, f"{slots.limit} {what} are open: try again later")
    give: Callable[[], None] = taken
    return StreamingResponse(
        body,
        media_type="application/x-ndjson",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/api/executions/{execution_id}/cancel",
    responses=problem_responses(
        (404, "No such execution."),
        (409, "It has ended, or another process runs it (`flowtide ui`)."),
    ),
)
async def cancel(
    execution_id: IdPath, reads: Reads, body: CancelRequest | None = None
) -> Cancelled:
    """Stop issuing commands; running workers see it through cancellation-check."""
    status = await reads.cancel(execution_id, body.reason if body else "cancelled by user")
    return {"execution_id": str(execution_id), "status": status}


@router.post(
    "/api/executions/{execution_id}/rerun",
    status_code=201,
    responses=problem_responses(
        (400, "A sub-playbook execution (re-run its parent), or the playbook no longer loads."),
        (404, "No such execution."),
    ),
)
async def rerun(execution_id: IdPath, reads: Reads, body: RerunRequest | None = None) -> Rerun:
    """Start a new execution of the same playbook (the same catalog version, or the same
    inline text) with the same workload."""
    row = await reads.row(execution_id)
    if row.parent_execution_id is not None:
        raise RequestError(
            400,
            f"execution {execution_id} is a sub-playbook of {row.parent_execution_id}:"
            " re-run the parent",
        )
    try:
        playbook = await asyncio.to_thread(parse_playbook, row.playbook_text, row.playbook_file)
        new_id = await reads.start(
            playbook,
            workload=row.workload,
            catalog_version=row.playbook_version,
            pool=body.pool if body else "default",
        )
    except (PlaybookError, TemplateError) as exc:
        raise RequestError(400, str(exc), field="playbook") from None
    return {"execution_id": str(new_id), "status": "running", "rerun_of": str(execution_id)}


#: Only an app that runs executions itself mounts it (`flowtide ui`).
resume_router = APIRouter()


@resume_router.post(
    "/api/executions/{execution_id}/resume",
    responses=problem_responses(
        (404, "No such execution."),
        (409, "It has ended, or a live process runs it."),
    ),
)
async def resume(execution_id: IdPath, reads: Reads) -> Started:
    """Carry on a run that stopped (its process ended before it did) in this process,
    from its log: finished steps and iterations are kept."""
    resumable: ResumableReads = reads  # type: ignore[assignment]  # mounted by such apps only
    await resumable.resume(execution_id)
    return {"execution_id": str(execution_id), "status": "running"}
