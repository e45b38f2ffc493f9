"""The server's own routes about executions, beside the executions API that
`flowtide ui` serves too (`flowtide.web.executions`): what workers ask of an execution
(its status, whether it was cancelled, a sub-playbook's result) and an admin's finalize.
Execution variables are `flowtide.server.api_vars`."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from flowtide.auth.principal import Principal
from flowtide.documents.execution import ChildResult, child_result
from flowtide.errors import NotFoundError
from flowtide.server.coordinator import TERMINAL
from flowtide.server.runtime import CoordinatorDep, RegistryDep, RuntimeDep
from flowtide.store import pg
from flowtide.web.access import caller
from flowtide.web.fields import IdPath, RequestBody
from flowtide.web.problems import problem_responses
from flowtide.wire import CANCELLATION_CHECK_PATH, CHILD_RESULT_PATH

__all__ = ["router"]

Caller = Annotated[Principal, Depends(caller)]


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


router = APIRouter()


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


@router.get(CHILD_RESULT_PATH, responses=problem_responses(404))
async def execution_result(
    execution_id: IdPath, who: Caller, coord: CoordinatorDep, workers: RegistryDep
) -> ChildResult:
    """What a worker running a `playbook` step reads of the sub-playbook execution it
    started: status, error, result and each step's result, intact (not masked: the
    parent's step uses the data). For the worker holding the parent's command only,
    never for display."""
    await workers.require_holder(who, execution_id, parent=True)
    return child_result(await coord.state(execution_id))


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
        # An ended run's commands stop too (a run failed past its timeout, or by
        # another branch): nothing they report can change it any more.
        "cancelled": requested is not None or status in ("cancelled", "failed"),
        "status": status,
    }
