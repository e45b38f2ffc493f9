"""Execution variables: the execution's `ctx`, what playbook templates read as
`{{ vars.x }}` or `{{ ctx.x }}` and `set:` blocks write. The API reads them from the
folded state and writes them as `ctx.updated` events through the coordinator, so the log
records every change and steps that start afterwards see it.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Annotated, Any, Final

from fastapi import APIRouter, Path
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, Field, WithJsonSchema

from flowtide.engine import events as ev
from flowtide.errors import NotFoundError
from flowtide.redaction import mask_value
from flowtide.server.coordinator import Coordinator, ExecutionFinished
from flowtide.server.runtime import CoordinatorDep, Runtime, RuntimeDep
from flowtide.store import pg
from flowtide.web.fields import IdPath, RequestBody
from flowtide.web.problems import RequestError, problem_responses

__all__ = ["router"]

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


def _finished(exc: ExecutionFinished) -> RequestError:
    return RequestError(409, f"{exc}: its variables are read-only", execution_status=exc.status)


router = APIRouter()


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
        raise _finished(exc) from None
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
            raise _finished(exc) from None
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
        raise _finished(exc) from None
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
        raise _finished(exc) from None
    return DeletedResponse(execution_id=str(execution_id), deleted=[name])
