"""The contract between the server and its workers: names, paths and the messages that
travel between them, with their JSON round-trips.

    NATS JetStream
      COMMAND_STREAM                  FLOWTIDE_COMMANDS (work queue)
      command_subject(pool, eid, shard)
                                      flowtide.commands.<pool>.<shard>.<eid>: one
                                      Notification per issued command
      pool_consumer(pool)             flowtide-<pool>: the durable pull consumer a pool's
                                      workers share
      worker_inbox(pool)              _WORKER_INBOX.<pool>: replies to a worker of <pool>
    HTTP
      CLAIM_PATH      ClaimRequest -> ClaimReply (per item: Claimed or ClaimRefused, and
                      once per execution an ExecutionShare)
      REPORTS_PATH    reports_body(Report...) -> ReportsReply
      REGISTER_PATH, HEARTBEAT_PATH, DEREGISTER_PATH, RELEASE_PATH, CREDENTIALS_PATH,
      EXECUTE_PATH, CANCELLATION_CHECK_PATH, CHILD_RESULT_PATH
      EXECUTION_HEADER, SHARD_HEADER   which execution / shard a request is for (routing)
      FORWARDED_HEADER                 a request one server forwarded to another
      TRACEPARENT_HEADER               the W3C trace context a sub-playbook starts under

Both `flowtide.server` and `flowtide.worker` import this module; it imports neither (the
engine's `Command` is the only flowtide type it carries). The server parses requests with
its own pydantic models: the types here are what it writes and a worker reads and writes.
They hold what they are given, no copies: a claim reply's context is the server's state
snapshot, a report's events are the dicts the worker made once.

Ids the server writes are strings (JSON numbers lose int64 precision in many clients);
ids a worker writes are numbers, which the server accepts as well.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from flowtide.engine.events import Command

__all__ = [
    "CANCELLATION_CHECK_PATH",
    "CHILD_RESULT_PATH",
    "CLAIM_PATH",
    "COMMAND_PREFIX",
    "COMMAND_STREAM",
    "CREDENTIALS_PATH",
    "DEREGISTER_PATH",
    "EXECUTE_PATH",
    "EXECUTION_HEADER",
    "FORWARDED_HEADER",
    "HEARTBEAT_PATH",
    "LOG_PREFIX",
    "LOG_STREAM",
    "REGISTER_PATH",
    "RELEASE_PATH",
    "REPORTS_PATH",
    "SHARD_HEADER",
    "TRACEPARENT_HEADER",
    "ClaimItem",
    "ClaimRefused",
    "ClaimReply",
    "ClaimRequest",
    "Claimed",
    "ExecutionShare",
    "Notification",
    "Report",
    "ReportResult",
    "ReportsReply",
    "command_filter",
    "command_subject",
    "log_filter",
    "log_subject",
    "pool_consumer",
    "read_reports_body",
    "reports_body",
    "worker_inbox",
]

# -- NATS names -----------------------------------------------------------------------------

COMMAND_STREAM: Final = "FLOWTIDE_COMMANDS"
#: Notifications are published to COMMAND_PREFIX.<pool>.<shard>.<execution_id>.
COMMAND_PREFIX: Final = "flowtide.commands"
_POOL: Final = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)


def _pool(pool: str) -> str:
    # A pool name becomes a subject token and part of a permission: a dot or a wildcard
    # in it would widen what a worker of that pool may do.
    if not isinstance(pool, str) or not _POOL.fullmatch(pool):
        raise ValueError(f"invalid pool name {pool!r}: expected [A-Za-z0-9_-]{{1,64}}")
    return pool


def command_subject(pool: str, execution_id: int, shard: int = 0) -> str:
    """The subject of a notification of `pool` for `execution_id`, which `shard` owns
    (`pool` is one the API checked: this is on every issue's path, so it is not checked
    again). A pool's consumer takes every shard's (`command_filter`)."""
    return f"{COMMAND_PREFIX}.{pool}.{shard}.{execution_id}"


def command_filter(pool: str) -> str:
    """The subjects of `pool`'s notifications (its consumer's filter)."""
    return f"{COMMAND_PREFIX}.{_pool(pool)}.>"


def pool_consumer(pool: str) -> str:
    """The durable pull consumer shared by the workers of `pool`."""
    return f"flowtide-{_pool(pool)}"


def worker_inbox(pool: str) -> str:
    """The inbox prefix of a worker of `pool` (nats-py's `inbox_prefix`)."""
    return f"_WORKER_INBOX.{_pool(pool)}"


#: What running steps print (`flowtide.logs`): LOG_PREFIX.<pool>.<execution_id>.<command_id>,
#: kept by the stream LOG_STREAM (the newest messages of each command).
LOG_STREAM: Final = "FLOWTIDE_LOGS"
LOG_PREFIX: Final = "flowtide.logs"


def log_subject(pool: str, execution_id: int, command_id: int) -> str:
    """Where a worker of `pool` publishes what command `command_id` prints."""
    return f"{LOG_PREFIX}.{_pool(pool)}.{execution_id}.{command_id}"


def log_filter(pool: str, execution_id: int) -> str:
    """The subjects of what `pool`'s workers print of execution `execution_id`."""
    return f"{LOG_PREFIX}.{_pool(pool)}.{int(execution_id)}.*"


# -- HTTP paths ------------------------------------------------------------------------------

#: The execution a request is about, when neither its path nor a single-execution body
#: says so to a gateway (flowtide.gateway routes on it).
EXECUTION_HEADER: Final = "X-Flowtide-Execution"
#: The shard a batch is for (a worker splits its claims, reports and heartbeats per shard
#: and says which; any server forwards it to that shard's, a gateway routes on it).
SHARD_HEADER: Final = "X-Flowtide-Shard"
#: Set by a server on a request it forwards to another shard's server (which answers it
#: itself or refuses it with 421: a request is forwarded once at most).
FORWARDED_HEADER: Final = "X-Flowtide-Forwarded"
#: W3C trace context: a worker's sub-playbook starts under its command's span, as any
#: `POST /api/execute` or webhook delivery carrying it does (flowtide.tracing).
TRACEPARENT_HEADER: Final = "traceparent"
CLAIM_PATH: Final = "/api/commands/claim"
REPORTS_PATH: Final = "/api/events/reports"
REGISTER_PATH: Final = "/api/worker/pool/register"
HEARTBEAT_PATH: Final = "/api/worker/pool/heartbeat"
DEREGISTER_PATH: Final = "/api/worker/pool/deregister"
RELEASE_PATH: Final = "/api/worker/commands/release"
CREDENTIALS_PATH: Final = "/api/worker/credentials"
#: Starts an execution (a worker: the sub-playbook of a `playbook` step it runs).
EXECUTE_PATH: Final = "/api/execute"
#: Path templates: `.format(execution_id=...)` for a request.
CANCELLATION_CHECK_PATH: Final = "/api/executions/{execution_id}/cancellation-check"
CHILD_RESULT_PATH: Final = "/api/internal/executions/{execution_id}/result"


# -- the notification ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Notification:
    """What the server publishes on `command_subject` for each issued command: enough to
    claim it (the three ids), never what it runs."""

    event_id: int
    execution_id: int
    command_id: int
    attempt: int | None = None
    step: str | None = None

    @classmethod
    def of(cls, command: Command) -> Notification:
        """The notification of an issued command.

        Raises:
            ValueError: the command has no issue event (it was never issued).
        """
        if command.issued_event_id is None:
            raise ValueError(f"command {command.command_id} was never issued")
        return cls(
            command.issued_event_id,
            command.execution_id,
            command.command_id,
            command.attempt,
            command.step,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "event_id": str(self.event_id),
                "execution_id": str(self.execution_id),
                "command_id": str(self.command_id),
                "attempt": self.attempt,
                "step": self.step,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> Notification:
        """Raises:
        ValueError: `data` is not a notification (not JSON, or an id missing)."""
        doc = json.loads(data)
        try:
            attempt = doc.get("attempt")
            # Ids as either side writes them: a number, or the string of its digits.
            return cls(
                int(doc["event_id"]),
                int(doc["execution_id"]),
                int(doc["command_id"]),
                None if attempt is None else int(attempt),
                doc.get("step"),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a notification: {exc!r}") from None

    def claim_item(self) -> ClaimItem:
        return ClaimItem(self.execution_id, self.command_id, self.event_id)


# -- claims ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimItem:
    """One command a worker asks for, named as its notification names it."""

    execution_id: int
    command_id: int
    event_id: int

    def to_dict(self) -> dict[str, int]:
        return {
            "event_id": self.event_id,
            "execution_id": self.execution_id,
            "command_id": self.command_id,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ClaimItem:
        return cls(int(doc["execution_id"]), int(doc["command_id"]), int(doc["event_id"]))


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """The body of CLAIM_PATH: the notifications that arrived together, claimed at once."""

    worker_id: str
    claims: Sequence[ClaimItem]
    #: Execution id -> the revision of its share the worker holds (`known_revisions`).
    known: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "worker_id": self.worker_id,
            "claims": [c.to_dict() for c in self.claims],
        }
        if self.known:
            body["known"] = dict(self.known)
        return json.dumps(body).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> ClaimRequest:
        doc = json.loads(data)
        return cls(
            str(doc["worker_id"]),
            [ClaimItem.from_dict(c) for c in doc["claims"]],
            dict(doc.get("known") or {}),
        )


@dataclass(slots=True)
class Claimed:
    """A command a claim won: what runs (`command`), the loop element it runs for (and
    `size`, its collection's size), and the lease (seconds) the worker holds it for
    without a heartbeat. A chunk of iterations (`chunk`) lists the (index, element) of
    each iteration it runs, in order: those its command has not reported yet."""

    command: Command
    iterator: str | None = None
    element: Any = None
    lease: float = 30.0
    size: int | None = None
    chunk: list[tuple[int, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return self._into({})

    def _into(self, doc: dict[str, Any]) -> dict[str, Any]:
        c = self.command
        issued = c.issued_event_id
        doc["command"] = {
            "command_id": str(c.command_id),
            "execution_id": str(c.execution_id),
            "step": c.step,
            "attempt": c.attempt,
            "loop_instance": c.loop_instance,
            "loop_index": c.loop_index,
            "issued_event_id": None if issued is None else str(issued),
            "extra": c.extra,
        }
        doc["iterator"] = self.iterator
        doc["element"] = self.element
        doc["lease"] = self.lease
        if self.size is not None:
            doc["size"] = self.size
        if self.chunk is not None:
            doc["chunk"] = self.chunk
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Claimed:
        raw = doc["command"]
        issued = raw.get("issued_event_id")
        command = Command(
            int(raw["command_id"]),
            int(raw["execution_id"]),
            raw["step"],
            int(raw["attempt"]),
            raw.get("loop_instance"),
            raw.get("loop_index"),
            int(issued) if issued else None,
            raw.get("extra") or {},
        )
        size = doc.get("size")
        chunk = doc.get("chunk")
        return cls(
            command,
            doc.get("iterator"),
            doc.get("element"),
            float(doc.get("lease", 30.0)),
            None if size is None else int(size),
            None if chunk is None else [(int(i), element) for i, element in chunk],
        )


@dataclass(frozen=True, slots=True)
class ClaimRefused:
    """A claim that did not win: `code` is the status its own request would have got (403
    another pool's command, 404 no such command, 409 held, closed or a stale
    notification; 5xx not judged, may be tried again); `error` holds `message` (and
    `holder` for a 409)."""

    code: int
    error: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "error": self.error}


@dataclass(slots=True)
class ExecutionShare:
    """What the commands of one execution in a claim reply share: the playbook they run,
    the execution's context parts (`ExecutionState.context_parts`) as of `revision`
    (`ExecutionState.context_rev`), and whether it is being cancelled.

    A worker names the revisions it holds (`known` in a claim or reports request); when
    the server's is the same, the reply carries only the revision and the cancelled flag
    (`held`), and the worker runs the command against the share it has (`ShareCache`):
    a loop over a long list is not sent the list again with every iteration."""

    playbook_text: str
    playbook_file: str | None
    context: dict[str, Any]
    cancelled: bool = False
    revision: int = 0
    #: Only the revision and the flag were sent: the worker holds the rest.
    held: bool = False
    #: The W3C traceparent the execution started under, with traces on (`flowtide.tracing`).
    traceparent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.held:
            return {"revision": str(self.revision), "held": True, "cancelled": self.cancelled}
        doc = {
            "playbook": {"text": self.playbook_text, "file": self.playbook_file},
            "context": self.context,
            "cancelled": self.cancelled,
            "revision": str(self.revision),
        }
        if self.traceparent is not None:
            doc["traceparent"] = self.traceparent
        return doc

    def as_held(self) -> ExecutionShare:
        """This share as sent to a worker that holds its revision."""
        return ExecutionShare("", None, {}, self.cancelled, self.revision, held=True)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ExecutionShare:
        revision = int(doc.get("revision") or 0)
        cancelled = bool(doc.get("cancelled"))
        if doc.get("held"):
            return cls("", None, {}, cancelled, revision, held=True)
        playbook = doc["playbook"]
        return cls(
            playbook["text"],
            playbook.get("file"),
            doc["context"],
            cancelled,
            revision,
            traceparent=doc.get("traceparent"),
        )


@dataclass(slots=True)
class ClaimReply:
    """The reply of CLAIM_PATH: one result per claim, in order; each execution's share
    once."""

    results: list[Claimed | ClaimRefused]
    executions: dict[int, ExecutionShare]

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": [
                r._into({"code": 200}) if isinstance(r, Claimed) else r.to_dict()
                for r in self.results
            ],
            "executions": {str(k): v.to_dict() for k, v in self.executions.items()},
        }

    @classmethod
    def from_json(cls, data: bytes | str) -> ClaimReply:
        """Raises:
        ValueError: `data` is not a claim reply."""
        doc = json.loads(data)
        try:
            results: list[Claimed | ClaimRefused] = [
                Claimed.from_dict(r)
                if r.get("code") == 200
                else ClaimRefused(int(r.get("code", 500)), r.get("error") or {})
                for r in doc["results"]
            ]
            shared = {int(k): ExecutionShare.from_dict(v) for k, v in doc["executions"].items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a claim reply: {exc!r}") from None
        return cls(results, shared)


# -- reports ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    """One command's events (`Event.to_dict()` each), reported by the worker that ran it.
    `take`: the worker runs a next command of the execution in the slot this one frees,
    if the step that takes the report issues one (the server then claims it for the
    worker and answers it with the report, instead of publishing it)."""

    execution_id: int
    events: list[dict[str, Any]]
    take: bool = False

    def to_json(self) -> bytes:
        """Encoded once: a batch (`reports_body`) is joined from these."""
        doc: dict[str, Any] = {"execution_id": str(self.execution_id), "events": self.events}
        if self.take:
            doc["take"] = True
        return json.dumps(doc).encode()

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Report:
        return cls(int(doc["execution_id"]), list(doc["events"]), bool(doc.get("take")))


def reports_body(
    worker_id: str, encoded: Sequence[bytes], known: Mapping[str, str] | None = None
) -> bytes:
    """The body of REPORTS_PATH from reports already encoded (`Report.to_json`);
    `known` as a claim's (`ClaimRequest.known`)."""
    return b"".join(
        (
            b'{"worker_id":',
            json.dumps(worker_id).encode(),
            b',"known":' + json.dumps(dict(known)).encode() if known else b"",
            b',"reports":[',
            b",".join(encoded),
            b"]}",
        )
    )


def read_reports_body(data: bytes | str) -> tuple[str | None, list[Report]]:
    """(worker id, reports) of a REPORTS_PATH body."""
    doc = json.loads(data)
    return doc.get("worker_id"), [Report.from_dict(r) for r in doc["reports"]]


@dataclass(frozen=True, slots=True)
class ReportResult:
    """What the server did with one report: `code` 200 (taken: how many events were new,
    already known, or dropped as stale, and the execution's status after), 409 (every
    command of it stale), 4xx (refused: never sent again) or 5xx (not taken: may be
    sent again); `error` holds `message` when it was not 200."""

    code: int
    accepted: int = 0
    duplicates: int = 0
    stale: int = 0
    status: str = ""
    error: dict[str, Any] | None = None
    #: The next command, claimed for the worker in the slot the report freed (`take`).
    claimed: Claimed | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.error is not None:
            return {"code": self.code, "error": self.error}
        doc: dict[str, Any] = {
            "code": self.code,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "stale": self.stale,
            "status": self.status,
        }
        if self.claimed is not None:
            doc["claimed"] = self.claimed.to_dict()
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ReportResult:
        claimed = doc.get("claimed")
        return cls(
            int(doc.get("code", 500)),
            int(doc.get("accepted", 0)),
            int(doc.get("duplicates", 0)),
            int(doc.get("stale", 0)),
            str(doc.get("status", "")),
            doc.get("error"),
            Claimed.from_dict(claimed) if isinstance(claimed, Mapping) else None,
        )

    @property
    def message(self) -> str:
        return str((self.error or {}).get("message", ""))


@dataclass(frozen=True, slots=True)
class ReportsReply:
    """The reply of REPORTS_PATH: one result per report, in order; the share of each
    execution whose next command a result hands over (`ReportResult.claimed`)."""

    results: list[ReportResult]
    executions: dict[int, ExecutionShare] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"results": [r.to_dict() for r in self.results]}
        if self.executions:
            doc["executions"] = {str(k): v.to_dict() for k, v in self.executions.items()}
        return doc

    @classmethod
    def from_json(cls, data: bytes | str) -> ReportsReply:
        doc = json.loads(data)
        shared = {
            int(k): ExecutionShare.from_dict(v) for k, v in (doc.get("executions") or {}).items()
        }
        return cls([ReportResult.from_dict(r) for r in doc["results"]], shared)
