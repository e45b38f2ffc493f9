"""Events and commands: the values the engine folds and emits.

Event type names follow NoETL (see DESIGN.md "Events"). Each type's payload is a
`TypedDict` below (`PAYLOADS` maps a type to it): `Event.payload` is their union, so mypy
checks what an emitter writes, and a reader that has dispatched on `Event.type` gets its
payload typed with `payload_of`. They are types only: an event's payload is the plain
dict that is stored, and nothing checks it at run time (`tests/unit/test_event_payloads.py`
checks the logs of real runs against them).
"""

# No `from __future__ import annotations` here: the payload types' `NotRequired` keys
# must be known at run time (`__optional_keys__`), which Python 3.11 cannot tell from
# string annotations.
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NotRequired, TypedDict, overload

PLAYBOOK_INITIALIZED: Final = "playbook.initialized"
WORKFLOW_INITIALIZED: Final = "workflow.initialized"
STEP_ENTER: Final = "step.enter"
STEP_EXIT: Final = "step.exit"
STEP_SKIPPED: Final = "step.skipped"
LOOP_STARTED: Final = "loop.started"
LOOP_ITEM: Final = "loop.item"
LOOP_CLAIMED: Final = "loop.claimed"  # a cursor loop's claim returned rows (or none: exhausted)
LOOP_DONE: Final = "loop.done"
COMMAND_ISSUED: Final = "command.issued"
COMMAND_CLAIMED: Final = "command.claimed"
COMMAND_STARTED: Final = "command.started"
COMMAND_HEARTBEAT: Final = "command.heartbeat"
# How far a command that runs many items in one go (a spark loop) is: written at a
# bounded rate while it runs, and once with the exact counts in its final report.
COMMAND_PROGRESS: Final = "command.progress"
COMMAND_COMPLETED: Final = "command.completed"
COMMAND_FAILED: Final = "command.failed"
CALL_DONE: Final = "call.done"
CALL_ERROR: Final = "call.error"
CTX_UPDATED: Final = "ctx.updated"
WORKFLOW_COMPLETED: Final = "workflow.completed"
WORKFLOW_FAILED: Final = "workflow.failed"
PLAYBOOK_COMPLETED: Final = "playbook.completed"
PLAYBOOK_FAILED: Final = "playbook.failed"
PLAYBOOK_CANCELLED: Final = "playbook.cancelled"
EXECUTION_CANCELLED: Final = "execution.cancelled"
# Values a tool touched (passwords, tokens, DSNs): they join the execution's secret set,
# which seals what is stored and masks what is shown. Always stored sealed.
SECRETS_ADDED: Final = "secrets.added"
# A playbook's `timeout:` or `sla:` passed (flowtide.triggers deadlines).
EXECUTION_DEADLINE_MISSED: Final = "execution.deadline_missed"
# An open execution had nothing in flight for too long and a re-drive found nothing to do
# (a server's stall watch): the engine fails it (`error.kind: stalled`).
EXECUTION_STALLED: Final = "execution.stalled"
# One attempt to deliver a notification (flowtide.notify): appended to the execution's
# log after the transition it reports (also after its terminal event); the fold ignores
# them, so they never change the execution's status.
NOTIFICATION_SENT: Final = "notification.sent"
NOTIFICATION_FAILED: Final = "notification.failed"

TERMINAL_TYPES = frozenset({PLAYBOOK_COMPLETED, PLAYBOOK_FAILED, PLAYBOOK_CANCELLED})


# -- payloads ----------------------------------------------------------------------------
# One TypedDict per event type, its keys those the emitters write (NotRequired: written
# only in some cases). `Any` is a JSON value a playbook or a tool chose.


class NoPayload(TypedDict):
    """The payload of an event that carries none (it is written as null): `step.enter`,
    `workflow.initialized`, `execution.cancelled` (its reason is its error)."""


class PlaybookRef(TypedDict):
    name: str
    path: str | None
    version: str | None
    file: str | None


class InitializedPayload(TypedDict):
    """`playbook.initialized` (`engine.start.initialized_event`)."""

    workload: dict[str, Any]
    playbook: PlaybookRef
    parent_execution_id: int | None
    parent_command_id: int | None
    #: The workers' pool that runs its commands (the server's executions only).
    pool: NotRequired[str]
    #: What the trigger that started it adds to the playbook's own `notify:` (a
    #: schedule's targets, as `NotifyTarget.to_json`); absent when nothing.
    notify: NotRequired[list[dict[str, Any]]]
    #: The W3C traceparent it was started under (a request's, a parent's command), kept
    #: when traces are on: its spans join that trace (`flowtide.tracing`).
    traceparent: NotRequired[str]


class StepExitPayload(TypedDict):
    """`step.exit`: where the step goes (`next`, taken arcs) and the `ctx` values its
    `set` and arcs assigned, decided once so that a replay renders no template."""

    next: list[str]
    set: NotRequired[dict[str, Any]]
    #: Why a step was skipped (its `admit` policy refused it).
    reason: NotRequired[str]


class LoopStartedPayload(TypedDict):
    instance: int
    iterator: str
    mode: str
    max_in_flight: int
    size: int
    collection: list[Any]
    #: A cursor loop: its rows come from claims (`loop.claimed`), `max_rows` at a time,
    #: each row an iteration (`process` "row") or each claim one (`process` "frame").
    cursor: NotRequired[bool]
    process: NotRequired[str]
    max_rows: NotRequired[int]


class LoopItemPayload(TypedDict):
    instance: int | None
    index: int


class LoopClaimedPayload(TypedDict):
    instance: int | None
    rows: list[Any]
    count: int
    exhausted: bool


class LoopStats(TypedDict):
    total: int
    success: int
    failed: int


class LoopDonePayload(TypedDict):
    instance: int
    stats: LoopStats


class CommandRef(TypedDict):
    """What every event of one command's run says of it (`command.started`; the base of
    `command.issued` and of `command.completed`/`command.failed`): its attempt, and the
    loop iteration it runs (`loop_instance`, `loop_index`) or the cursor claim it makes
    (`loop_instance`, `cursor`)."""

    attempt: int
    loop_instance: NotRequired[int | None]
    loop_index: NotRequired[int | None]
    cursor: NotRequired[bool]


CommandStartedPayload = CommandRef


class CommandProgressPayload(CommandRef):
    """`command.progress` (`runtime.command.progress_event`): items done of `total`, at
    `per_second` since the items began; `failed` in the last one (exact counts)."""

    done: int
    total: int
    per_second: float
    failed: NotRequired[int]


class CommandIssuedPayload(CommandRef):
    command_id: int
    #: Issued again by the server (`server.leases`): its lease ran out, or its worker
    #: handed it back (`reason`).
    reissued: NotRequired[bool]
    reason: NotRequired[str]
    #: A chunk: the iterations `loop_index` .. `loop_index + loop_count - 1`, run one
    #: after another by one worker, each reported with its own events (absent: one).
    loop_count: NotRequired[int]


class CommandClaimedPayload(TypedDict):
    attempt: int


class CommandResultPayload(CommandRef):
    """`command.completed` and `command.failed` (`runtime.command.outcome_events`)."""

    status: str  # ok | error
    result: Any
    #: What the step's policy decided: continue | break | fail | jump (to `jump_to`).
    action: str
    jump_to: NotRequired[str]
    #: `ctx` values the step's tasks set (top-level keys).
    ctx: NotRequired[dict[str, Any]]
    #: Each task's result, by task name (a step of several tasks).
    tasks: NotRequired[dict[str, Any]]


class CallMeta(TypedDict, total=False):
    """What a tool records of a call (`ToolContext.call_meta`; never results, never
    secrets). A plugin's tool may record keys of its own beside these."""

    #: What a failed call was given.
    input: Any
    spark: dict[str, Any]
    artifact: dict[str, Any]
    transfer: dict[str, Any]


class CallPayload(CallMeta):
    """`call.done` and `call.error`: one attempt of one task."""

    task: str
    attempt: int
    duration_ms: float
    stdout: NotRequired[str]


class CtxUpdatedPayload(TypedDict):
    """`ctx.updated`: top-level `ctx` keys set and removed from outside the playbook."""

    source: str
    set: NotRequired[dict[str, Any]]
    unset: NotRequired[list[str]]


class FinalizedPayload(TypedDict, total=False):
    """A terminal event an operator forced (`Coordinator.finalize`); the engine's own
    `workflow.failed`, `playbook.failed` and `playbook.cancelled` carry no payload."""

    finalized: bool
    reason: str


class WorkflowCompletedPayload(FinalizedPayload, total=False):
    last_step: str | None
    result: Any


class PlaybookCompletedPayload(FinalizedPayload):
    """`playbook.completed`: the execution's result, the last finished step's."""

    last_step: str | None
    result: Any


class SecretsAddedPayload(TypedDict):
    values: list[str]
    #: A sub-playbook's execution inherits its parent's secret set.
    parent_execution_id: NotRequired[int]


class DeadlineMissedPayload(TypedDict):
    """`execution.deadline_missed`: which deadline (`kind`: timeout | sla), its instant,
    the limit it came from (seconds) and how long the run had been going."""

    kind: str
    deadline: float
    limit: float
    elapsed: float


class StalledPayload(TypedDict):
    """`execution.stalled`: how long nothing was in flight (seconds) and since when."""

    idle: float
    since: float


class NotificationPayload(TypedDict):
    """`notification.sent` and `notification.failed`: one delivery attempt of one target
    of a playbook's `notify:` (or the server's default), never a secret: the target is
    shown masked (no query string, no credentials)."""

    #: The transition reported: completed | failed | cancelled | deadline_missed | interrupted.
    on: str
    #: webhook | slack | email | playbook
    target: str
    #: The target masked: a URL's scheme, host, port and path; an email's recipients.
    to: str
    attempt: int
    #: The HTTP status the target answered (webhook, slack).
    status_code: NotRequired[int]
    error: NotRequired[str]
    #: A failed attempt that is retried at this time (absent: the last attempt).
    retry_at: NotRequired[float]
    #: The execution a `playbook` target started.
    started_execution_id: NotRequired[int]


EventPayload = (
    NoPayload
    | InitializedPayload
    | StepExitPayload
    | LoopStartedPayload
    | LoopItemPayload
    | LoopClaimedPayload
    | LoopDonePayload
    | CommandRef
    | CommandIssuedPayload
    | CommandClaimedPayload
    | CommandResultPayload
    | CallPayload
    | CtxUpdatedPayload
    | FinalizedPayload
    | WorkflowCompletedPayload
    | PlaybookCompletedPayload
    | SecretsAddedPayload
    | DeadlineMissedPayload
    | NotificationPayload
)

#: Each event type's payload type.
PAYLOADS: Final[Mapping[str, type[Mapping[str, Any]]]] = {
    PLAYBOOK_INITIALIZED: InitializedPayload,
    WORKFLOW_INITIALIZED: NoPayload,
    STEP_ENTER: NoPayload,
    STEP_EXIT: StepExitPayload,
    STEP_SKIPPED: NoPayload,
    LOOP_STARTED: LoopStartedPayload,
    LOOP_ITEM: LoopItemPayload,
    LOOP_CLAIMED: LoopClaimedPayload,
    LOOP_DONE: LoopDonePayload,
    COMMAND_ISSUED: CommandIssuedPayload,
    COMMAND_CLAIMED: CommandClaimedPayload,
    COMMAND_STARTED: CommandStartedPayload,
    COMMAND_HEARTBEAT: NoPayload,
    COMMAND_PROGRESS: CommandProgressPayload,
    COMMAND_COMPLETED: CommandResultPayload,
    COMMAND_FAILED: CommandResultPayload,
    CALL_DONE: CallPayload,
    CALL_ERROR: CallPayload,
    CTX_UPDATED: CtxUpdatedPayload,
    WORKFLOW_COMPLETED: WorkflowCompletedPayload,
    WORKFLOW_FAILED: FinalizedPayload,
    PLAYBOOK_COMPLETED: PlaybookCompletedPayload,
    PLAYBOOK_FAILED: FinalizedPayload,
    PLAYBOOK_CANCELLED: FinalizedPayload,
    EXECUTION_CANCELLED: NoPayload,
    SECRETS_ADDED: SecretsAddedPayload,
    EXECUTION_DEADLINE_MISSED: DeadlineMissedPayload,
    EXECUTION_STALLED: StalledPayload,
    NOTIFICATION_SENT: NotificationPayload,
    NOTIFICATION_FAILED: NotificationPayload,
}


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of an execution's append-only event log.

    `payload` (its type's, see `PAYLOADS`) and `error` are JSON-serialisable mappings;
    `time` is Unix seconds.
    """

    event_id: int
    execution_id: int
    type: str
    step: str | None = None
    status: str | None = None
    payload: EventPayload | None = None
    error: dict[str, Any] | None = None
    parent_event_id: int | None = None
    command_id: int | None = None
    worker_id: str | None = None
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "execution_id": self.execution_id,
            "type": self.type,
            "step": self.step,
            "status": self.status,
            "payload": self.payload,
            "error": self.error,
            "parent_event_id": self.parent_event_id,
            "command_id": self.command_id,
            "worker_id": self.worker_id,
            "time": self.time,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Event":
        return cls(
            event_id=int(data["event_id"]),
            execution_id=int(data["execution_id"]),
            type=str(data["type"]),
            step=data.get("step"),
            status=data.get("status"),
            payload=data.get("payload"),
            error=data.get("error"),
            # The HTTP API writes snowflake ids as strings (JSON numbers lose them).
            parent_event_id=_opt_int(data.get("parent_event_id")),
            command_id=_opt_int(data.get("command_id")),
            worker_id=data.get("worker_id"),
            time=float(data.get("time") or 0.0),
        )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


# -- reading a payload ---------------------------------------------------------------------


@overload
def payload_of(event: Event, kind: Literal["playbook.initialized"]) -> InitializedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["step.exit"]) -> StepExitPayload: ...
@overload
def payload_of(event: Event, kind: Literal["loop.started"]) -> LoopStartedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["loop.item"]) -> LoopItemPayload: ...
@overload
def payload_of(event: Event, kind: Literal["loop.claimed"]) -> LoopClaimedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["loop.done"]) -> LoopDonePayload: ...
@overload
def payload_of(event: Event, kind: Literal["command.issued"]) -> CommandIssuedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["command.claimed"]) -> CommandClaimedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["command.started"]) -> CommandStartedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["command.progress"]) -> CommandProgressPayload: ...
@overload
def payload_of(
    event: Event, kind: Literal["command.completed", "command.failed"]
) -> CommandResultPayload: ...
@overload
def payload_of(event: Event, kind: Literal["call.done", "call.error"]) -> CallPayload: ...
@overload
def payload_of(event: Event, kind: Literal["ctx.updated"]) -> CtxUpdatedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["workflow.completed"]) -> WorkflowCompletedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["playbook.completed"]) -> PlaybookCompletedPayload: ...
@overload
def payload_of(
    event: Event,
    kind: Literal["workflow.failed", "playbook.failed", "playbook.cancelled"],
) -> FinalizedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["secrets.added"]) -> SecretsAddedPayload: ...
@overload
def payload_of(
    event: Event, kind: Literal["execution.deadline_missed"]
) -> DeadlineMissedPayload: ...
@overload
def payload_of(event: Event, kind: Literal["execution.stalled"]) -> StalledPayload: ...
@overload
def payload_of(
    event: Event, kind: Literal["notification.sent", "notification.failed"]
) -> NotificationPayload: ...
def payload_of(event: Event, kind: str) -> Any:
    """The payload of `event`, an event of type `kind` (one of them for the types that
    share a payload: `command.completed` for `command.failed` too), typed as `PAYLOADS`
    says; `{}` when it has none. The caller has dispatched on `event.type`: nothing is
    checked here (the engine's fold calls this for every event it applies).
    """
    return event.payload or {}


def payload_fields(event: Event) -> Mapping[str, Any]:
    """The payload of an event of any type as a plain mapping (`{}` when it has none),
    for code that reads keys it picks at run time (sizes, masking)."""
    return event.payload or {}


@dataclass(frozen=True, slots=True)
class Command:
    """Work for a worker: run `step` (one loop iteration when `loop_index` is set).

    A command names what to run, not how: the runtime builds the render context from
    the execution state when it dispatches, so a command stays small and replayable.
    """

    command_id: int
    execution_id: int
    step: str
    attempt: int = 1
    loop_instance: int | None = None
    loop_index: int | None = None
    issued_event_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "execution_id": self.execution_id,
            "step": self.step,
            "attempt": self.attempt,
            "loop_instance": self.loop_instance,
            "loop_index": self.loop_index,
            "issued_event_id": self.issued_event_id,
            "extra": self.extra,
        }
