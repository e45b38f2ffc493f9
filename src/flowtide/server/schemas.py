"""The request and response bodies of the server's own routes (worker events, claims,
the worker pool, the outbox, readiness). Those that `flowtide ui` accepts too (starting,
cancelling, re-running executions; the catalog's) are in `flowtide.web.bodies`.

Bodies are strict (`flowtide.web.fields.RequestBody`); the routes of the keychain,
tokens and execution variables keep theirs beside them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, StringConstraints

from flowtide.engine.events import Event
from flowtide.web.fields import INT32_MAX, INTEGRAL, Id, Int, PositiveId, RequestBody

__all__ = [
    "ClaimMany",
    "ClaimManyItem",
    "ClaimRequest",
    "CommandRelease",
    "CredentialGrant",
    "EventBatch",
    "EventBody",
    "Heartbeat",
    "OutboxClaim",
    "OutboxMark",
    "PoolRegister",
    "Readiness",
    "WorkerReport",
    "WorkerReports",
]


class EventBody(RequestBody):
    event_id: Id
    execution_id: Id
    type: str = Field(min_length=1, max_length=64)
    step: str | None = None
    status: str | None = None
    payload: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    parent_event_id: Id | None = None
    command_id: Id | None = None
    worker_id: str | None = None
    time: float = 0.0

    def to_event(self) -> Event:
        return Event(**self.model_dump())


class EventBatch(RequestBody):
    execution_id: Id
    worker_id: str | None = None
    events: list[EventBody] = Field(max_length=10_000)


class ClaimRequest(RequestBody):
    worker_id: str = Field(min_length=1, max_length=200)
    execution_id: Id
    command_id: Id


class ClaimManyItem(RequestBody):
    event_id: Id
    execution_id: Id
    command_id: Id


#: Execution id -> the revision of its context the worker holds (`wire.ExecutionShare`).
Known = Annotated[
    dict[Annotated[str, StringConstraints(pattern=r"^[0-9]{1,19}$")], Id],
    Field(
        max_length=1000,
        description="Execution id -> the revision of the execution's share (`executions`"
        " in the reply) this worker holds. The reply leaves out the playbook and context"
        " of a share whose revision is the one named (`held: true`).",
    ),
]


class ClaimMany(RequestBody):
    worker_id: str = Field(min_length=1, max_length=200)
    claims: list[ClaimManyItem] = Field(min_length=1, max_length=1000)
    known: Known = Field(default_factory=dict)

    def known_revisions(self) -> dict[int, int]:
        return {int(k): v for k, v in self.known.items()}


class WorkerReport(RequestBody):
    execution_id: Id
    events: list[EventBody] = Field(max_length=10_000)
    take: bool = Field(
        False,
        description="The worker runs a next command of the execution in the slot this"
        " report frees: one the step issues is claimed for it and answered with the report.",
    )


class WorkerReports(RequestBody):
    worker_id: str | None = None
    reports: list[WorkerReport] = Field(min_length=1, max_length=1000)
    known: Known = Field(default_factory=dict)

    def known_revisions(self) -> dict[int, int]:
        return {int(k): v for k, v in self.known.items()}


class PoolRegister(RequestBody):
    worker_id: str = Field(min_length=1, max_length=200)
    pool: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    hostname: str | None = Field(None, max_length=255)
    pid: Annotated[int, Field(ge=0, le=INT32_MAX), INTEGRAL] | None = None
    concurrency: Int = Field(1, ge=1, le=10_000)


class MachineHeld(RequestBody):
    """A worker's snowflake machine-id lease, as the register reply gave it."""

    machine_id: Int = Field(ge=0, le=1023)
    holder: str = Field(min_length=1, max_length=300)
    issued_until_ms: Int = Field(0, ge=0, le=2**53 - 1)


class Heartbeat(RequestBody):
    worker_id: str = Field(min_length=1, max_length=200)
    running: Int = Field(0, ge=0, le=INT32_MAX)
    commands: list[Id] | None = Field(
        None,
        max_length=100_000,
        description="Commands the worker is working on; only their leases are extended "
        "(all of the worker's when absent).",
    )
    machine: MachineHeld | None = Field(
        None, description="The snowflake machine id the worker holds, to renew (or release)."
    )


class CommandRelease(RequestBody):
    worker_id: str = Field(min_length=1, max_length=200)
    commands: list[Id] = Field(
        max_length=10_000,
        description="Commands the worker holds and will not finish (it is stopping): they "
        "are issued again at once instead of when their lease runs out.",
    )


class CredentialGrant(RequestBody):
    worker_id: str = Field(min_length=1, max_length=200)
    execution_id: Id
    command_id: Id
    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")


class OutboxClaim(RequestBody):
    limit: Int = Field(100, ge=1, le=10_000)
    lease: float = Field(10.0, gt=0, le=3600)


class OutboxMark(RequestBody):
    ids: list[PositiveId] = Field(max_length=10_000, description="Outbox row ids.")
    error: str | None = None


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, str] = Field(description="database, nats, kv: `ok` or what is wrong.")
