"""Starting, listing, reading and cancelling executions (runs of playbooks), and reading
their logs. The live event stream, finalize and variables are in
`flowtide.server.api_executions`."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse

from flowtide.auth.principal import Principal
from flowtide.errors import AuthError, NotFoundError, PlaybookError, TemplateError
from flowtide.playbook.loader import parse_playbook
from flowtide.redaction import mask_value
from flowtide.runtime.report import execution_document
from flowtide.server.access import caller
from flowtide.server.api_cluster import requested_playbook
from flowtide.server.coordinator import TERMINAL, ExecutionFinished
from flowtide.server.documents import event_document
from flowtide.server.fields import IdPath, Text
from flowtide.server.forwarding import LIST_TIMEOUT, gather_shards
from flowtide.server.problems import error_response, problem_responses
from flowtide.server.runtime import CoordinatorDep, RegistryDep, RuntimeDep
from flowtide.server.schemas import CancelRequest, ExecuteRequest, RerunRequest
from flowtide.store import pg
from flowtide.ui.details import CALL_TYPES, CALLS_SHOWN, step_document
from flowtide.ui.listing import (
    EventsQuery,
    ListQuery,
    events_query,
    execution_item,
    list_query,
    listed,
    read_events,
)
from flowtide.ui.summary import kept_summary, summary_document
from flowtide.ui.timeline import MAX_BUCKETS, execution_timeline
from flowtide.wire import (
    CANCELLATION_CHECK_PATH,
    CHILD_RESULT_PATH,
    EXECUTE_PATH,
)

__all__ = ["router"]

router = APIRouter()

Caller = Annotated[Principal, Depends(caller)]


@router.post(
    EXECUTE_PATH,
    status_code=201,
    responses=problem_responses(
        (400, "Not exactly one of path, catalog_id and playbook; or an invalid playbook."),
        (404, "No such catalog path or version, or no such parent execution."),
        (409, "The parent execution is ending: no sub-playbook starts under it."),
    ),
)
async def execute(
    body: ExecuteRequest,
    request: Request,
    who: Caller,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    workers: RegistryDep,
) -> dict[str, Any]:
    """Start an execution of a catalog playbook (path/version or catalog_id) or of an
    inline playbook. A worker may start only sub-playbooks of the commands it holds,
    on its own pool. A sub-playbook starts on its parent's shard (its cancel cascade and
    the parent's checks stay in one database)."""
    if body.parent_execution_id is not None:
        there = await runtime.elsewhere(request, body.parent_execution_id)
        if there is not None:
            return there  # type: ignore[return-value]
    if who.role == "worker" and not who.insecure:
        if body.parent_execution_id is None:
            raise AuthError("a worker starts sub-playbooks only (parent_execution_id)")
        if who.pool is not None and body.pool != who.pool:
            raise AuthError(f"{who.describe()} serves pool {who.pool!r}, not {body.pool!r}")
        await workers.require_holder(who, body.parent_execution_id)
    try:
        requested = await requested_playbook(runtime.store, body)
        if isinstance(requested, JSONResponse):
            return requested  # type: ignore[return-value]
        playbook, version = requested
        execution_id = await coord.execute(
            playbook,
            workload=body.payload,
            catalog_version=version,
            parent_execution_id=body.parent_execution_id,
            parent_command_id=body.parent_command_id,
            pool=body.pool,
        )
    except (PlaybookError, TemplateError) as exc:
        return error_response(400, str(exc), field="playbook")  # type: ignore[return-value]
    except ExecutionFinished as exc:
        # A sub-playbook of a parent that is ending: nothing may start under it.
        return error_response(  # type: ignore[return-value]
            409, f"parent {exc}: no sub-playbook starts under it", field="parent_execution_id"
        )
    return {"execution_id": str(execution_id), "status": "running"}


@router.get("/api/executions")
async def list_executions(
    request: Request,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    q: Annotated[ListQuery, Depends(list_query)],
) -> dict[str, Any]:
    """Executions newest first (by id: ids are snowflakes, in creation order across
    shards); pass `next_before` as `before` for the next page. Filters: `status`,
    `playbook` (text in the path or file), `parent`, `since`/`until` (creation time) and
    `min_seconds`/`max_seconds` (duration). An item's `progress` (loop iterations done
    of total) is there while this server holds the running execution's state, else
    null. In a cluster of several
    shards every shard is asked at once and the pages merged: a shard that does not
    answer in time is left out and named in `unavailable_shards` (its executions come
    in a later listing, never silently skipped on a page that says it is whole)."""
    limit = q.limit
    local = asyncio.to_thread(_listed, runtime, coord, q)
    everywhere = runtime.fan_out(request)
    if everywhere is None:
        items = await local
        return {"items": items, **_next(items, limit), "unavailable_shards": []}
    own, shards, server_id, peers = everywhere
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    mine, (answers, missing) = await asyncio.gather(
        local,
        gather_shards(
            peers, shards, own, server_id, target, list(request.headers.raw), timeout=LIST_TIMEOUT
        ),
    )
    items = list(mine)
    for answer in answers.values():
        items.extend(answer.get("items", []))
    items.sort(key=lambda item: int(item["execution_id"]), reverse=True)
    items = items[:limit]
    return {
        "items": items,
        **_next(items, limit),
        "unavailable_shards": [
            {"shard": shard, "error": why} for shard, why in sorted(missing.items())
        ],
    }


def _next(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    return {"next_before": items[-1]["execution_id"] if len(items) == limit and items else None}


def _listed(runtime: Any, coord: Any, q: ListQuery) -> list[dict[str, Any]]:
    rows = listed(runtime.store, q)
    return [execution_item(r, _progress(coord, r)) for r in rows]


def _progress(coord: Any, row: Any) -> dict[str, Any] | None:
    """A running execution's loop progress from the snapshot this server last took of
    its state (no read, no fold); None when it holds none."""
    if row.status in TERMINAL:
        return None
    snap = coord.cache.snapshot(row.execution_id)
    if snap is None:
        return None
    loops = list(snap.loops.values())
    return {
        "steps": None,
        "steps_finished": None,
        "iterations": sum(loop.size for loop in loops),
        "iterations_done": sum(loop.completed for loop in loops),
        "iterations_failed": sum(loop.failed for loop in loops),
    }


@router.get("/api/executions/{execution_id}", responses=problem_responses(404))
async def get_execution(
    execution_id: IdPath,
    who: Caller,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    workers: RegistryDep,
) -> dict[str, Any]:
    """The execution's document (the same as `flowtide run --json`): values of the
    execution's secret set are masked (`***`)."""
    await workers.require_holder(who, execution_id, parent=True)
    state = await coord.state(execution_id)
    doc: dict[str, Any] = mask_value(execution_document(state), state.secrets)
    row = await asyncio.to_thread(runtime.store.get_execution, execution_id)
    doc["playbook"] = row.playbook_path or row.playbook_file
    return doc


@router.get("/api/executions/{execution_id}/summary", responses=problem_responses(404))
async def get_execution_summary(
    execution_id: IdPath,
    who: Caller,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    workers: RegistryDep,
) -> dict[str, Any]:
    """An execution at a glance, for the UI: per step its status, runs, times, error and
    loop counts (`steps`), the arcs taken (`taken`), the progress, and the playbook's
    steps and arcs laid out in layers (`graph`). Its size follows the playbook's steps,
    not a loop's iterations; no step results (`GET /api/executions/{id}` has them).
    Values of the execution's secret set are masked."""
    await workers.require_holder(who, execution_id, parent=True)
    row = await asyncio.to_thread(runtime.store.get_execution, execution_id)
    # An ended execution's summary as kept when it ended: no fold of its log.
    kept = await asyncio.to_thread(kept_summary, runtime.store, row)
    if kept is not None:
        return kept
    state = await coord.state(execution_id)
    row = await asyncio.to_thread(runtime.store.get_execution, execution_id)
    return summary_document(state, row)


@router.get(
    "/api/executions/{execution_id}/steps/{step}",
    responses=problem_responses((404, "No such execution, or no such step in its playbook.")),
)
async def get_execution_step(
    execution_id: IdPath,
    step: Annotated[Text, PathParam(max_length=256)],
    who: Caller,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    workers: RegistryDep,
) -> dict[str, Any]:
    """One step of an execution, for the UI's step panel: status, runs, times, error
    with the playbook's file and line, the step's YAML source, its result (null with
    `result_truncated` past 256 KiB), its loop's counts, its newest calls, and for a
    Spark step the Spark run (master, app id, jobs, rows written) with the dataset's
    schema and preview rows. Values of the execution's secret set are masked."""
    await workers.require_holder(who, execution_id, parent=True)
    state = await coord.state(execution_id)
    if step not in state.playbook.steps:
        raise NotFoundError(f"execution {execution_id} has no step {step!r}")
    calls = await asyncio.to_thread(
        lambda: runtime.store.events(
            execution_id, types=CALL_TYPES, steps=[step], limit=CALLS_SHOWN, newest=True
        )
    )
    return step_document(state, step, calls)


@router.post(
    "/api/executions/{execution_id}/rerun",
    status_code=201,
    responses=problem_responses(
        (400, "A sub-playbook execution (re-run its parent), or the playbook no longer loads."),
        (404, "No such execution."),
    ),
)
async def rerun(
    execution_id: IdPath,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    body: RerunRequest | None = None,
) -> dict[str, Any]:
    """Start a new execution of the same playbook (the same catalog version, or the same
    inline text) with the same workload."""
    row = await asyncio.to_thread(runtime.store.get_execution, execution_id)
    if row.parent_execution_id is not None:
        return error_response(  # type: ignore[return-value]
            400,
            f"execution {execution_id} is a sub-playbook of {row.parent_execution_id}:"
            " re-run the parent",
        )
    try:
        playbook = parse_playbook(row.playbook_text, row.playbook_file)
        new_id = await coord.execute(
            playbook,
            workload=row.workload,
            catalog_version=row.playbook_version,
            pool=body.pool if body else "default",
        )
    except (PlaybookError, TemplateError) as exc:
        return error_response(400, str(exc), field="playbook")  # type: ignore[return-value]
    return {"execution_id": str(new_id), "status": "running", "rerun_of": str(execution_id)}


@router.get("/api/executions/{execution_id}/timeline", responses=problem_responses(404))
async def get_execution_timeline(
    execution_id: IdPath,
    who: Caller,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    workers: RegistryDep,
    buckets: Annotated[int, Query(ge=1, le=MAX_BUCKETS)] = 120,
) -> dict[str, Any]:
    """An execution's timeline, for the UI's Gantt chart: each step's runs, and its
    commands one by one (issued, started, ended, attempt) while it has at most 300, or
    as a density lane (commands completed and failed per time bucket) beyond that."""
    await workers.require_holder(who, execution_id, parent=True)
    state = await coord.state(execution_id)
    return await asyncio.to_thread(
        execution_timeline, runtime.store, state.playbook, execution_id, state.status, buckets
    )


@router.get(CHILD_RESULT_PATH, responses=problem_responses(404))
async def execution_result(
    execution_id: IdPath, who: Caller, coord: CoordinatorDep, workers: RegistryDep
) -> dict[str, Any]:
    """What a worker running a `playbook` step reads of the sub-playbook execution it
    started: status, error, result and each step's result, intact (not masked: the
    parent's step uses the data). For the worker holding the parent's command only,
    never for display."""
    await workers.require_holder(who, execution_id, parent=True)
    state = await coord.state(execution_id)
    doc = execution_document(state)
    return {
        "execution_id": doc["execution_id"],
        "status": doc["status"],
        "error": doc["error"],
        "result": doc["result"],
        "steps": {name: step["result"] for name, step in doc["steps"].items()},
    }


@router.get("/api/executions/{execution_id}/status", responses=problem_responses(404))
async def execution_status(
    execution_id: IdPath, who: Caller, runtime: RuntimeDep, workers: RegistryDep
) -> dict[str, Any]:
    await workers.require_holder(who, execution_id, parent=True)
    row = await asyncio.to_thread(runtime.store.get_execution, execution_id)
    return {
        "execution_id": str(execution_id),
        "status": row.status,
        "updated": row.updated,
        "terminal": row.status in TERMINAL,
    }


@router.post("/api/executions/{execution_id}/cancel", responses=problem_responses(404))
async def cancel(
    execution_id: IdPath, coord: CoordinatorDep, body: CancelRequest | None = None
) -> dict[str, Any]:
    """Stop issuing commands; running workers see it through cancellation-check."""
    result = await coord.cancel(execution_id, body.reason if body else "cancelled by user")
    return {"execution_id": str(execution_id), "status": result.status}


@router.get(CANCELLATION_CHECK_PATH, responses=problem_responses(404))
async def cancellation_check(
    execution_id: IdPath, who: Caller, runtime: RuntimeDep, workers: RegistryDep
) -> dict[str, Any]:
    await workers.require_holder(who, execution_id)

    def read() -> pg.executions.CancelState:
        with runtime.store.transaction("cancellation-check") as conn:
            row = pg.executions.read_cancel_state(conn, execution_id)
        if row is None:
            raise NotFoundError(f"execution {execution_id} not found")
        return row

    status, requested = await asyncio.to_thread(read)
    return {
        "execution_id": str(execution_id),
        "cancelled": requested is not None or status == "cancelled",
        "status": status,
    }


@router.get("/api/executions/{execution_id}/events")
async def execution_events(
    execution_id: IdPath,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    q: Annotated[EventsQuery, Depends(events_query)],
) -> list[dict[str, Any]]:
    """An execution's events in log order: the oldest `limit` after `after`, or with
    `newest` the newest ones (before `before`); `step` keeps one step's. Values of the
    execution's secret set are masked."""
    events = await asyncio.to_thread(read_events, runtime.store, execution_id, q)
    if not events:
        return []
    secrets = (await coord.state(execution_id)).secrets
    return [event_document(e, secrets) for e in events]
