"""What workers send about commands: claims, and reports of the events of the commands
they run. A worker speaks only as a worker id its own credential registered
(`WorkerRegistry.acting`), and reports only the kinds of events a worker reports."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from flowtide import trace
from flowtide.auth.principal import Principal
from flowtide.engine.events import Event
from flowtide.errors import NotFoundError
from flowtide.server.coordinator import WORKER_EVENTS, Coordinator, SubmitResult
from flowtide.server.runtime import CoordinatorDep, RegistryDep, RuntimeDep
from flowtide.server.schemas import ClaimMany, ClaimRequest, EventBatch, EventBody, WorkerReports
from flowtide.server.steps import Handed, Taker
from flowtide.server.worker_registry import WorkerRegistry
from flowtide.web.access import caller
from flowtide.web.errors import batch_item
from flowtide.web.fields import INT64_MAX, IdPath
from flowtide.web.problems import RequestError, problem_responses
from flowtide.wire import (
    CLAIM_PATH,
    REPORTS_PATH,
    Claimed,
    ClaimItem,
    ClaimRefused,
    ClaimReply,
    ReportResult,
)

__all__ = ["router", "worker_events"]

#: A report's events that close its command (the trace's "arrived" mark).
WORKER_OUTCOMES = ("command.completed", "command.failed")

router = APIRouter()

Caller = Annotated[Principal, Depends(caller)]


def worker_events(
    events: list[EventBody], worker_id: str, field: str
) -> tuple[list[Event], dict[str, str] | None]:
    """A worker's events, stamped with the worker id its credential speaks for (an
    event naming another worker is refused); only the kinds a worker reports, each of
    a command. Else the problem (field, message) of the first other one."""
    out = []
    for i, e in enumerate(events):
        where = f"{field}.{i}"
        message = None
        if e.type not in WORKER_EVENTS or e.command_id is None:
            message = (
                f"{where}: a worker reports {', '.join(sorted(WORKER_EVENTS))} events of"
                f" a command, not {e.type!r}"
                + ("" if e.command_id is not None else " without command_id")
            )
        elif e.worker_id is not None and e.worker_id != worker_id:
            where += ".worker_id"
            message = f"{where}: {e.worker_id!r} is not the reporting worker {worker_id!r}"
        if message is not None:
            return [], {"field": where, "message": message}
        out.append(replace(e.to_event(), worker_id=worker_id))
    return out, None


async def _submit_batch(
    body: EventBatch, who: Principal, coord: Coordinator, workers: WorkerRegistry
) -> dict[str, Any]:
    for i, e in enumerate(body.events):
        if e.execution_id != body.execution_id:
            field = f"events.{i}.execution_id"
            message = f"{field}: {e.execution_id} is not the batch's {body.execution_id}"
            raise RequestError(422, message, fields=[{"field": field, "message": message}])
    worker_id = await workers.acting(who, body.worker_id)
    events, problem = worker_events(body.events, worker_id, "events")
    if problem is not None:
        raise RequestError(422, problem["message"], fields=[problem])
    result = await coord.submit(body.execution_id, events)
    doc = result.reply()
    if result.all_stale:
        return JSONResponse({"error": {"status": 409, "message": "stale report"}, **doc}, 409)  # type: ignore[return-value]
    return doc


@router.post(
    "/api/events/batch",
    responses=problem_responses(
        (404, "The worker id was never registered."),
        (409, "Every report is stale: the worker no longer holds the command."),
    ),
)
async def post_events(
    body: EventBatch,
    request: Request,
    who: Caller,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    workers: RegistryDep,
) -> dict[str, Any]:
    """Worker reports for one execution; idempotent (known event ids are skipped).
    409 when every report is stale (the worker no longer holds the command)."""
    there = await runtime.elsewhere(request, body.execution_id)
    if there is not None:
        return there  # type: ignore[return-value]
    return await _submit_batch(body, who, coord, workers)


@router.post(
    REPORTS_PATH,
    response_model=dict[str, Any],
    responses=problem_responses((404, "The worker id was never registered.")),
)
async def post_reports(
    body: WorkerReports, who: Caller, coord: CoordinatorDep, workers: RegistryDep
) -> JSONResponse:
    """Several worker reports at once (each one command's events), of any executions.

    `results` has one entry per report, in order: `{"code": 200, "accepted",
    "duplicates", "stale", "status"}`, with code 409 when the report is stale (as
    `POST /api/events/batch` answers it), or `{"code": 4xx|5xx, "error": ...}`; a
    report with code 500 or above was not taken and may be sent again. The events
    are taken as the worker's whose id the request names, which must be one the
    caller's credential registered."""
    if trace.enabled:
        trace.marks(
            [
                e.command_id
                for r in body.reports
                for e in r.events
                if e.command_id is not None and e.type in WORKER_OUTCOMES
            ],
            "arrived",
        )
    worker_id = await workers.acting(who, body.worker_id)
    pool: str | None = None
    if any(r.take for r in body.reports):
        row = await workers.require(who, worker_id)
        pool = row.pool if row is not None else None
    results: list[dict[str, Any]] = [{} for _ in body.reports]
    by_execution: dict[int, list[int]] = {}
    parts: dict[int, list[Event]] = {}
    for i, report in enumerate(body.reports):
        wrong = next((e for e in report.events if e.execution_id != report.execution_id), None)
        if wrong is not None:
            message = (
                f"reports.{i}: event {wrong.event_id} belongs to execution"
                f" {wrong.execution_id}, not {report.execution_id}"
            )
            results[i] = {"code": 422, "error": {"message": message}}
            continue
        events, problem = worker_events(report.events, worker_id, f"reports.{i}.events")
        if problem is not None:
            results[i] = {"code": 422, "error": {"message": problem["message"]}}
            continue
        parts[i] = events
        by_execution.setdefault(report.execution_id, []).append(i)

    async def one(execution_id: int, indexes: list[int]) -> list[Any]:
        takers = [
            Taker(worker_id, pool) if body.reports[i].take and pool else None for i in indexes
        ]
        try:
            return await coord.submit_many(execution_id, [parts[i] for i in indexes], takers)
        except Exception as exc:  # noqa: BLE001 - every report of it gets the error
            return [exc] * len(indexes)

    groups = list(by_execution.items())
    outcomes = await asyncio.gather(*(one(eid, idx) for eid, idx in groups))
    handed: list[tuple[int, Handed]] = []
    for (_, indexes), got in zip(groups, outcomes, strict=True):
        for i, outcome in zip(indexes, got, strict=True):
            if isinstance(outcome, SubmitResult):
                code = 409 if outcome.all_stale else 200
                doc = ReportResult(code, **outcome.reply()).to_dict()
                if outcome.handed is not None:
                    handed.append((i, outcome.handed))
            else:
                doc = batch_item(outcome, {})
            results[i] = doc
    reply: dict[str, Any] = {"results": results}
    if handed:
        # The next commands, claimed for this worker in the slots its reports freed.
        batch = await coord.handed_replies([h for _, h in handed])
        for (i, _), won in zip(handed, batch.results, strict=True):
            if isinstance(won, Claimed):
                results[i]["claimed"] = won.to_dict()
                if trace.enabled:
                    trace.mark("claimed", won.command.command_id)
        shares = batch.shares_for(body.known_revisions())
        reply["executions"] = {str(k): v.to_dict() for k, v in shares.items()}
    # JSON types only: encoded as is, not through the response model's validation (a
    # worker's busiest request).
    return JSONResponse(reply)


@router.post(
    "/api/events",
    responses=problem_responses(
        (404, "The worker id was never registered."),
        (409, "The report is stale: the worker no longer holds the command."),
    ),
)
async def post_event(
    body: EventBody,
    request: Request,
    who: Caller,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    workers: RegistryDep,
) -> dict[str, Any]:
    there = await runtime.elsewhere(request, body.execution_id)
    if there is not None:
        return there  # type: ignore[return-value]
    batch = EventBatch(execution_id=body.execution_id, worker_id=body.worker_id, events=[body])
    return await _submit_batch(batch, who, coord, workers)


@router.post(
    "/api/commands/{event_id:int}/claim",
    responses=problem_responses(
        (404, "No such command, or the worker id was never registered."),
        (409, "Another worker holds the command, it is closed, or `event_id` is stale."),
    ),
)
async def claim(
    event_id: IdPath,
    body: ClaimRequest,
    request: Request,
    who: Caller,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    workers: RegistryDep,
) -> dict[str, Any]:
    """Claim the command issued by event `event_id`: exactly one worker wins; others
    get 409 (ack the notification and move on)."""
    there = await runtime.elsewhere(request, body.execution_id)
    if there is not None:
        return there  # type: ignore[return-value]
    row = await workers.require(who, body.worker_id)
    return await coord.claim(
        body.execution_id,
        body.command_id,
        event_id,
        body.worker_id,
        pool=row.pool if row else None,
    )


@router.post(
    CLAIM_PATH,
    responses=problem_responses((404, "The worker id was never registered.")),
)
async def claim_many(
    body: ClaimMany, who: Caller, coord: CoordinatorDep, workers: RegistryDep
) -> dict[str, Any]:
    """Claim several commands in one transaction (a worker's batch of notifications).

    `results` has one entry per claim, in order: `{"code": 200, "command": ...,
    "iterator": ..., "element": ..., "lease": ...}` for a command won (and `size`, the
    collection's size, with the element of a loop that knows it), or `{"code":
    403|404|409, "error": ...}` as `POST /api/commands/{event_id}/claim` would have
    answered (403: a command of another pool than the worker's). `executions` holds,
    once per execution, what its commands share: `playbook`, `context`, `cancelled`
    and the context's `revision`; only `revision`, `cancelled` and `held: true` when
    `known` names that revision (the worker holds the rest)."""
    row = await workers.require(who, body.worker_id)
    batch = await coord.claim_many(
        body.worker_id,
        [ClaimItem(c.execution_id, c.command_id, c.event_id) for c in body.claims],
        pool=row.pool if row else None,
    )
    results = [
        r if isinstance(r, Claimed) else ClaimRefused(**batch_item(r, {})) for r in batch.results
    ]
    if trace.enabled:
        trace.marks([r.command.command_id for r in results if isinstance(r, Claimed)], "claimed")
    return ClaimReply(results, batch.shares_for(body.known_revisions())).to_dict()


@router.get("/api/commands/{event_id:int}", responses=problem_responses(404))
async def get_command(
    event_id: IdPath,
    execution_id: Annotated[int, Query(ge=0, le=INT64_MAX)],
    command_id: Annotated[int, Query(ge=0, le=INT64_MAX)],
    request: Request,
    runtime: RuntimeDep,
) -> dict[str, Any]:
    there = await runtime.elsewhere(request, execution_id)
    if there is not None:
        return there  # type: ignore[return-value]
    row = await asyncio.to_thread(runtime.store.get_command, command_id)
    if row.execution_id != execution_id:
        raise NotFoundError(f"command {command_id} not found in execution {execution_id}")
    return {
        "command_id": str(row.command_id),
        "execution_id": str(row.execution_id),
        "step": row.step,
        "status": row.status,
        "attempt": row.attempt,
        "worker_id": row.worker_id,
        "loop_index": row.loop_index,
        "issued_event_id": str((row.payload or {}).get("issued_event_id")),
    }
