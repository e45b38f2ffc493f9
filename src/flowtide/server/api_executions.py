"""Execution-scoped endpoints: the live event stream (Server-Sent Events), finalize, and
execution variables.

Variables are the execution's `ctx`, what playbook templates read as `{{ vars.x }}` or
`{{ ctx.x }}` and `set:` blocks write. The API reads them from the folded state and writes
them as `ctx.updated` events through the coordinator, so the log records every change and
steps that start afterwards see it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Header, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AfterValidator, BaseModel, Field, WithJsonSchema

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import secret_values
from flowtide.errors import NotFoundError
from flowtide.redaction import mask_value
from flowtide.server.coordinator import TERMINAL, Coordinator, ExecutionFinished
from flowtide.server.documents import event_document
from flowtide.server.fields import INT64_MAX, IdPath, RequestBody
from flowtide.server.problems import error_response, problem_responses
from flowtide.server.runtime import CoordinatorDep, Runtime, RuntimeDep
from flowtide.store import pg
from flowtide.store.codec import load_json
from flowtide.store.pg.events import LogPosition

__all__ = ["router"]

#: How often an idle stream reads the log, and sends a comment to keep proxies from
#: closing it.
POLL_INTERVAL: Final = 0.25
KEEPALIVE: Final = 15.0
_BATCH: Final = 500

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_NAME_RULE: Final = "a variable name is a letter or _ then letters, digits or _ (max 128)"
#: A variable travels in every command's context: large data belongs in a result
#: reference, not here.
MAX_VALUE_BYTES: Final = 256 * 1024


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(_NAME_RULE)
    return name


def _check_value(value: Any) -> Any:
    try:
        size = len(json.dumps(value, allow_nan=False, separators=(",", ":")))
    except ValueError as exc:
        raise ValueError(f"not storable as JSON: {exc}") from None
    if size > MAX_VALUE_BYTES:
        raise ValueError(f"{size} bytes of JSON, at most {MAX_VALUE_BYTES}")
    return value


#: The rule of `_NAME` for the document; the server checks it itself, so that a 422 states
#: the rule rather than quoting a regex.
_NAME_SCHEMA: Final[dict[str, Any]] = {"type": "string", "pattern": f"^{_NAME.pattern}$"}
VarName = Annotated[str, AfterValidator(_check_name), WithJsonSchema(_NAME_SCHEMA)]
VarValue = Annotated[Any, AfterValidator(_check_value)]
#: Checked by `_bad_name`.
VarPath = Annotated[str, Path(description=_NAME_RULE, json_schema_extra=_NAME_SCHEMA)]


class FinalizeRequest(RequestBody):
    status: Literal["failed", "cancelled", "completed"] = Field(
        "failed", description="The terminal status to force."
    )
    reason: str = Field(
        min_length=1, max_length=1000, description="Why; recorded in the terminal event."
    )


class FinalizeResponse(BaseModel):
    execution_id: str
    status: str = Field(description="The status after the call.")
    previous_status: str
    changed: bool = Field(description="False: it was already terminal, nothing changed.")
    reason: str


class VariablesBody(RequestBody):
    variables: dict[VarName, VarValue] = Field(
        min_length=1,
        max_length=1000,
        description="name -> any JSON value",
        json_schema_extra={"propertyNames": _NAME_SCHEMA},
    )


class VariableBody(RequestBody):
    value: VarValue = Field(description="Any JSON value (null included).")


class Variable(BaseModel):
    value: Any
    updated: float | None = Field(description="Time of the event that last set it.")
    event_id: str | None = Field(description="That event.")
    source: str | None = Field(description="'api', or the step whose `set` wrote it.")


class VariablesResponse(BaseModel):
    execution_id: str
    status: str
    variables: dict[str, Variable]


class VariableResponse(Variable):
    execution_id: str
    name: str


class DeletedResponse(BaseModel):
    execution_id: str
    deleted: list[str]


# -- reading the log in commit-consistent order ----------------------------------------


@dataclass
class _Poll:
    events: list[tuple[Event, LogPosition]]
    status: str
    error: Any
    #: The execution is terminal and nothing is left to stream.
    finished: bool


def _open_stream(runtime: Runtime, execution_id: int, after: int | None) -> LogPosition:
    """The stream's starting position. Raises NotFoundError (no execution) or LookupError
    (`after` is not an event of it)."""
    with runtime.store.transaction("event stream") as conn:
        if not pg.executions.exists(conn, execution_id):
            raise NotFoundError(f"execution {execution_id} not found")
        if not after:
            return pg.events.START
        found = pg.events.position(conn, execution_id, after)
    if found is None:
        raise LookupError(after)
    return found


def _poll(runtime: Runtime, execution_id: int, cursor: LogPosition) -> _Poll:
    sealer = runtime.store.sealer
    with runtime.store.transaction("event stream") as conn:
        # One snapshot for the status, the horizon and the rows.
        pg.events.read_snapshot(conn)
        row = pg.executions.outcome(conn, execution_id)
        if row is None:
            raise NotFoundError(f"execution {execution_id} not found")
        events = pg.events.settled_after(conn, execution_id, cursor, _BATCH, sealer)
        finished = False
        if row.status in TERMINAL and len(events) < _BATCH:
            last = events[-1][1] if events else cursor
            finished = not pg.events.any_after(conn, execution_id, last)
    what = f"execution {execution_id}: error"
    error = load_json(row.error, sealer, what) if row.error else None
    return _Poll(events, row.status, error, finished)


def _message(event: Event, secrets: frozenset[str]) -> str:
    data = json.dumps(event_document(event, secrets), separators=(",", ":"))
    return f"id: {event.event_id}\nevent: {event.type}\ndata: {data}\n\n"


async def _follow(
    runtime: Runtime, execution_id: int, cursor: LogPosition, secrets: frozenset[str]
) -> AsyncIterator[str]:
    """The stream from `cursor` on, masked with the execution's secret set (`secrets` as
    known at the start, then grown by the `secrets.added` events streamed, which come
    before the events that hold their values)."""
    loop = asyncio.get_running_loop()
    yield "retry: 1000\n\n"
    last_sent = loop.time()
    while True:
        # A short transaction per read: no connection is held while waiting.
        poll = await asyncio.to_thread(_poll, runtime, execution_id, cursor)
        if poll.events:
            cursor = poll.events[-1][1]
            parts = []
            for e, _ in poll.events:
                if e.type == ev.SECRETS_ADDED:
                    secrets = secrets | secret_values(e)
                parts.append(_message(e, secrets))
            yield "".join(parts)
            last_sent = loop.time()
        if poll.finished:
            end = {
                "execution_id": str(execution_id),
                "status": poll.status,
                "error": mask_value(poll.error, secrets),
            }
            yield f"event: end\ndata: {json.dumps(end, separators=(',', ':'))}\n\n"
            return
        if len(poll.events) == _BATCH:
            continue
        if loop.time() - last_sent >= KEEPALIVE:
            yield ": keepalive\n\n"
            last_sent = loop.time()
        await asyncio.sleep(POLL_INTERVAL)


# -- variables ------------------------------------------------------------------------


async def _ctx_history(
    runtime: Runtime, execution_id: int
) -> dict[str, tuple[float, int, str | None]]:
    """name -> (time, event_id, source) of the last event that set each top-level ctx key
    (the events that can change ctx: `ctx.updated`, a step's `set` in `step.exit`, a
    policy's `set` in a command report)."""

    def read() -> list[pg.events.CtxWrite]:
        with runtime.store.transaction("variables") as conn:
            return pg.events.ctx_writes(conn, execution_id, runtime.store.sealer)

    writes = await asyncio.to_thread(read)
    out: dict[str, tuple[float, int, str | None]] = {}
    for w in writes:
        source = w.payload.get("source") if w.type == ev.CTX_UPDATED else w.step
        for name in w.payload.get("set") or w.payload.get("ctx") or {}:
            out[name] = (w.time, w.event_id, source)
        for name in w.payload.get("unset") or ():
            out.pop(name, None)
    return out


def _variables(
    ctx: dict[str, Any], history: dict[str, tuple[float, int, str | None]]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, value in ctx.items():
        found = history.get(name)
        out[name] = {
            "value": value,
            "updated": found[0] if found else None,
            "event_id": str(found[1]) if found else None,
            "source": found[2] if found else None,
        }
    return out


def _bad_name(name: str) -> None:
    try:
        _check_name(name)
    except ValueError as exc:
        raise RequestValidationError(
            [{"loc": ("path", "name"), "msg": str(exc), "type": "value_error"}]
        ) from None


async def _read_vars(
    runtime: Runtime, coord: Coordinator, execution_id: int
) -> tuple[str, dict[str, Any]]:
    state = await coord.state(execution_id)
    history = await _ctx_history(runtime, execution_id)
    # Shown, not used: masked with the execution's secret set.
    return state.status, _variables(mask_value(dict(state.ctx), state.secrets), history)


def _finished(exc: ExecutionFinished) -> JSONResponse:
    return error_response(409, f"{exc}: its variables are read-only", execution_status=exc.status)


router = APIRouter()


# -- event stream ------------------------------------------------------------------


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
    runtime: RuntimeDep,
    coord: CoordinatorDep,
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
        cursor = await asyncio.to_thread(_open_stream, runtime, execution_id, start)
        secrets = (await coord.state(execution_id)).secrets
    except LookupError:
        message = f"event {start} is not in execution {execution_id}"
        return error_response(  # type: ignore[return-value]
            422,
            f"{field}: {message}",
            fields=[{"field": field, "message": message}],
        )
    return StreamingResponse(
        _follow(runtime, execution_id, cursor, secrets),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# -- finalize ----------------------------------------------------------------------


@router.post(
    "/api/executions/{execution_id}/finalize",
    summary="Force an execution to a terminal status",
    responses=problem_responses((404, "No such execution.")),
)
async def finalize(
    execution_id: IdPath, body: FinalizeRequest, coord: CoordinatorDep
) -> FinalizeResponse:
    """An operator's tool for stuck executions (a lost worker, a pool nobody serves):
    records the engine's terminal events (`workflow.failed` + `playbook.failed`,
    `playbook.cancelled`, or `workflow.completed` + `playbook.completed`) with the
    reason, closes the open commands (later worker reports are rejected) and tells
    running workers to stop. Idempotent: an execution that is already terminal is
    left as it is (`changed: false`)."""
    result = await coord.finalize(execution_id, body.status, body.reason)
    return FinalizeResponse(
        execution_id=str(execution_id),
        status=result.status,
        previous_status=result.previous,
        changed=result.changed,
        reason=body.reason,
    )


# -- variables -----------------------------------------------------------------------


@router.get(
    "/api/vars/{execution_id}",
    summary="List an execution's variables",
    responses=problem_responses((404, "No such execution.")),
)
async def list_vars(
    execution_id: IdPath, runtime: RuntimeDep, coord: CoordinatorDep
) -> VariablesResponse:
    """Every variable (`ctx` key) with its value and the event that last set it."""
    status, variables = await _read_vars(runtime, coord, execution_id)
    return VariablesResponse(
        execution_id=str(execution_id),
        status=status,
        variables={name: Variable(**v) for name, v in variables.items()},
    )


@router.post(
    "/api/vars/{execution_id}",
    summary="Set several variables",
    responses=problem_responses((404, "No such execution."), (409, "The execution is terminal.")),
)
async def set_vars(
    execution_id: IdPath, body: VariablesBody, runtime: RuntimeDep, coord: CoordinatorDep
) -> VariablesResponse:
    """Set `variables` in one `ctx.updated` event; steps that start afterwards read
    them as `{{ vars.name }}`. Returns all variables."""
    try:
        await coord.update_ctx(execution_id, body.variables)
    except ExecutionFinished as exc:
        return _finished(exc)  # type: ignore[return-value]
    return await list_vars(execution_id, runtime, coord)


@router.delete(
    "/api/vars/{execution_id}",
    summary="Delete every variable",
    responses=problem_responses((404, "No such execution."), (409, "The execution is terminal.")),
)
async def delete_vars(execution_id: IdPath, coord: CoordinatorDep) -> DeletedResponse:
    state = await coord.state(execution_id)
    names = sorted(state.ctx)
    if names:
        try:
            await coord.update_ctx(execution_id, unset=names)
        except ExecutionFinished as exc:
            return _finished(exc)  # type: ignore[return-value]
    return DeletedResponse(execution_id=str(execution_id), deleted=names)


@router.get(
    "/api/vars/{execution_id}/{name}",
    summary="Read one variable",
    responses=problem_responses((404, "No such execution or variable.")),
)
async def get_var(
    execution_id: IdPath, name: VarPath, runtime: RuntimeDep, coord: CoordinatorDep
) -> VariableResponse:
    _bad_name(name)
    _, variables = await _read_vars(runtime, coord, execution_id)
    if name not in variables:
        raise NotFoundError(f"variable {name!r} not found in execution {execution_id}")
    return VariableResponse(execution_id=str(execution_id), name=name, **variables[name])


@router.put(
    "/api/vars/{execution_id}/{name}",
    summary="Set one variable",
    responses=problem_responses((404, "No such execution."), (409, "The execution is terminal.")),
)
async def put_var(
    execution_id: IdPath,
    name: VarPath,
    body: VariableBody,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
) -> VariableResponse:
    _bad_name(name)
    try:
        await coord.update_ctx(execution_id, {name: body.value})
    except ExecutionFinished as exc:
        return _finished(exc)  # type: ignore[return-value]
    return await get_var(execution_id, name, runtime, coord)


@router.delete(
    "/api/vars/{execution_id}/{name}",
    summary="Delete one variable",
    responses=problem_responses(
        (404, "No such execution or variable."), (409, "The execution is terminal.")
    ),
)
async def delete_var(execution_id: IdPath, name: VarPath, coord: CoordinatorDep) -> DeletedResponse:
    _bad_name(name)
    state = await coord.state(execution_id)
    if name not in state.ctx:
        raise NotFoundError(f"variable {name!r} not found in execution {execution_id}")
    try:
        await coord.update_ctx(execution_id, unset=[name])
    except ExecutionFinished as exc:
        return _finished(exc)  # type: ignore[return-value]
    return DeletedResponse(execution_id=str(execution_id), deleted=[name])
