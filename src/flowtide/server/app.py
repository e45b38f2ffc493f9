"""The HTTP API (FastAPI). Stateless: state lives in PostgreSQL (event log, commands,
outbox) and the KV (loop state); any process of any server answers any request.

Configuration comes from `ServerSettings` (the `flowtide server` command fills it from
flags and FLOWTIDE_* variables, so `uvicorn --workers N` processes share it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from flowtide.engine.events import Event
from flowtide.errors import FlowtideError, NotFoundError, PlaybookError, StoreError, TemplateError
from flowtide.playbook.loader import parse_playbook
from flowtide.redaction import install_log_masking, known, mask_event_doc, mask_text, mask_value
from flowtide.runtime.report import execution_document
from flowtide.server import metrics
from flowtide.server.api_cluster import cluster_router, parse_catalog_id
from flowtide.server.coordinator import (
    TERMINAL,
    ClaimConflict,
    ClaimItem,
    Coordinator,
    ExecutionFinished,
    SubmitResult,
)
from flowtide.server.outbox import OutboxRelay, OutboxStore
from flowtide.urls import redact_url

__all__ = ["ServerSettings", "create_app"]

log = logging.getLogger("flowtide.server")

#: Connections per pool of one server process (PostgreSQL's default max_connections is
#: 100: mind --workers N times this, times the number of servers).
_POOL_SIZE = 16

# Snowflake ids exceed 2**53: JSON carries them as strings; int or digit strings are accepted.
Id = Annotated[int, Field(ge=0, le=2**63 - 1)]


@dataclass
class ServerSettings:
    db: str
    nats: str | None = None
    kv: str = "memory://"
    kv_bucket: str = "flowtide_state"
    cluster_db: str | None = None
    lease: float = 30.0
    reap_interval: float = 2.0
    worker_timeout: float = 30.0

    @classmethod
    def from_env(cls) -> ServerSettings:
        db = os.environ.get("FLOWTIDE_DB")
        if not db:
            raise FlowtideError("FLOWTIDE_DB must name the PostgreSQL database")
        return cls(
            db=db,
            nats=os.environ.get("FLOWTIDE_NATS") or None,
            kv=os.environ.get("FLOWTIDE_KV", "memory://"),
            kv_bucket=os.environ.get("FLOWTIDE_KV_BUCKET", "flowtide_state"),
            cluster_db=os.environ.get("FLOWTIDE_CLUSTER_DB") or None,
            lease=float(os.environ.get("FLOWTIDE_LEASE", "30")),
        )


# -- request bodies ---------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExecuteRequest(_Body):
    path: str | None = Field(None, description="Catalog path of the playbook.")
    version: int | None = Field(
        None, ge=1, le=2**31 - 1, description="Catalog version (default: latest)."
    )
    catalog_id: str | None = Field(None, description="`path@version` or `path`.")
    playbook: str | None = Field(None, description="Inline playbook YAML.")
    payload: dict[str, Any] = Field(default_factory=dict, description="Workload overrides.")
    pool: str = Field("default", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    parent_execution_id: Id | None = None
    parent_command_id: Id | None = None


class EventBody(_Body):
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


class EventBatch(_Body):
    execution_id: Id
    worker_id: str | None = None
    events: list[EventBody] = Field(max_length=10_000)


class ClaimRequest(_Body):
    worker_id: str = Field(min_length=1, max_length=200)
    execution_id: Id
    command_id: Id


class ClaimManyItem(_Body):
    event_id: Id
    execution_id: Id
    command_id: Id


class ClaimMany(_Body):
    worker_id: str = Field(min_length=1, max_length=200)
    claims: list[ClaimManyItem] = Field(min_length=1, max_length=1000)


class WorkerReport(_Body):
    execution_id: Id
    events: list[EventBody] = Field(max_length=10_000)


class WorkerReports(_Body):
    worker_id: str | None = None
    reports: list[WorkerReport] = Field(min_length=1, max_length=1000)


class CancelRequest(_Body):
    reason: str = Field("cancelled by user", max_length=1000)


class PoolRegister(_Body):
    worker_id: str = Field(min_length=1, max_length=200)
    pool: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    hostname: str | None = None
    pid: int | None = None
    concurrency: int = Field(1, ge=1, le=10_000)


class Heartbeat(_Body):
    worker_id: str = Field(min_length=1, max_length=200)
    running: int = Field(0, ge=0)
    commands: list[Id] | None = Field(
        None,
        max_length=100_000,
        description="Commands the worker is working on; only their leases are extended "
        "(all of the worker's when absent).",
    )


class OutboxClaim(_Body):
    limit: int = Field(100, ge=1, le=10_000)
    lease: float = Field(10.0, gt=0, le=3600)


class OutboxMark(_Body):
    ids: list[int] = Field(max_length=10_000)
    error: str | None = None

    @field_validator("ids")
    @classmethod
    def _positive(cls, ids: list[int]) -> list[int]:
        if any(i < 1 for i in ids):
            raise ValueError("outbox ids are >= 1")
        return ids


# -- the app ------------------------------------------------------------------------------


class _Runtime:
    """What one server process holds: store, KV, NATS connection, coordinator, relay."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.store: Any = None
        self.kv: Any = None
        self.nc: Any = None
        self.coordinator: Coordinator | None = None
        self.relay: OutboxRelay | None = None
        self.outbox: OutboxStore | None = None
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        from flowtide.kv import connect
        from flowtide.loopstate import LoopState
        from flowtide.store.postgres import PostgresStore

        s = self.settings
        # Secrets this process meets (executions' secret sets) are masked in its logs.
        install_log_masking()
        self.store = await asyncio.to_thread(
            lambda: PostgresStore(s.db, cluster_dsn=s.cluster_db, max_size=_POOL_SIZE)
        )
        # Blocking database calls run in threads: more threads than the pool has
        # connections, so a burst of requests waiting for a connection cannot take every
        # thread from the steps that hold one (see Coordinator's step_slots).
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(_POOL_SIZE * 2, thread_name_prefix="flowtide-db")
        )
        self.outbox = OutboxStore(self.store)
        self.kv = await connect(s.kv, s.kv_bucket, ttl=3600)
        self.coordinator = Coordinator(
            self.store,
            loopstate=LoopState(self.kv),
            local_kv=s.kv.startswith("memory:"),
            lease=s.lease,
            step_slots=_POOL_SIZE - 4,
        )
        if s.nats:
            import nats

            self.nc = await nats.connect(s.nats, name="flowtide-server", max_reconnect_attempts=-1)
            self.relay = OutboxRelay(self.store, self.nc)
            self.coordinator.on_outbox = self.relay.poke
            self.coordinator.publish = self.relay.publish
            await self.relay.start()
        self.tasks.append(asyncio.create_task(self._reaper(), name="flowtide-reaper"))
        metrics.process_started()

    async def rowcount(
        self, op: str, sql: str, params: tuple[Any, ...], part: str = "cluster"
    ) -> int:
        """Run one statement in its own transaction; how many rows it changed."""

        def run() -> int:
            with self.store.transaction(op, part) as conn:
                return int(conn.execute(sql, params).rowcount)

        return await asyncio.to_thread(run)

    async def fetch(
        self, op: str, sql: str, params: tuple[Any, ...] = (), part: str = "cluster"
    ) -> list[Any]:
        """Run one query in its own transaction; its rows."""

        def run() -> list[Any]:
            with self.store.transaction(op, part) as conn:
                return list(conn.execute(sql, params).fetchall())

        return await asyncio.to_thread(run)

    async def _reaper(self) -> None:
        assert self.coordinator is not None
        while True:
            await asyncio.sleep(self.settings.reap_interval)
            try:
                await self.coordinator.reap()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep reaping
                log.warning("reaper: %s", exc)

    async def stop(self) -> None:
        metrics.process_stopped()
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.relay is not None:
            await self.relay.stop()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        if self.kv is not None:
            with contextlib.suppress(Exception):
                await self.kv.close()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    # An error may quote data (a store's or a tool's message): masked with every secret
    # this process knows.
    message = mask_text(message, known())
    return JSONResponse({"error": {"status": status, "message": message, **extra}}, status)


def _submit_doc(result: SubmitResult) -> dict[str, Any]:
    """What a worker report's reply says of it (single or in a batch)."""
    return {
        "accepted": result.accepted,
        "duplicates": result.duplicates,
        "stale": result.stale,
        "status": result.status,
    }


def _refused_stale(result: SubmitResult) -> bool:
    """A report whose every command was stale: answered 409."""
    return bool(result.stale and not result.accepted)


def _item_doc(outcome: Any, ok: dict[str, Any]) -> dict[str, Any]:
    """One entry of a batch reply: `ok` merged into a result, or the error an exception
    would have answered as its own request (code 5xx: not done, may be sent again)."""
    if not isinstance(outcome, BaseException):
        return {**ok, **outcome}
    doc: dict[str, Any]
    if isinstance(outcome, ClaimConflict):
        doc = {"code": 409, "error": {"message": str(outcome), "holder": outcome.holder}}
    elif isinstance(outcome, NotFoundError):
        doc = {"code": 404, "error": {"message": str(outcome)}}
    elif isinstance(outcome, StoreError):
        doc = {"code": 503, "error": {"message": f"store unavailable: {outcome}"}}
    elif isinstance(outcome, FlowtideError):
        doc = {"code": 422, "error": {"message": str(outcome)}}
    else:
        log.exception("batch item failed", exc_info=outcome)
        doc = {"code": 500, "error": {"message": f"{type(outcome).__name__}: {outcome}"}}
    doc["error"]["message"] = mask_text(doc["error"]["message"], known())
    return doc


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI application; `settings` default to FLOWTIDE_* environment variables."""
    runtime = _Runtime(settings or ServerSettings.from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(
        title="flowtide",
        description="Runs NoETL-style playbooks: executions, events, commands, workers.",
        version="1",
        lifespan=lifespan,
    )
    app.include_router(cluster_router(runtime))

    def coord() -> Coordinator:
        assert runtime.coordinator is not None
        return runtime.coordinator

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [
            {
                "field": ".".join(str(p) for p in err["loc"] if p != "body") or "body",
                "message": err["msg"],
            }
            for err in exc.errors()
        ]
        first = fields[0] if fields else {"field": "body", "message": "invalid"}
        return _error(422, f"{first['field']}: {first['message']}", fields=fields)

    @app.exception_handler(NotFoundError)
    async def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(ClaimConflict)
    async def _conflict(request: Request, exc: ClaimConflict) -> JSONResponse:
        return _error(409, str(exc), holder=exc.holder)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> JSONResponse:
        return _error(503, f"store unavailable: {exc}")

    # -- executions -----------------------------------------------------------------

    @app.post("/api/execute", status_code=201)
    async def execute(body: ExecuteRequest) -> dict[str, Any]:
        """Start an execution of a catalog playbook (path/version or catalog_id) or of an
        inline playbook."""
        given = [x for x in (body.path, body.catalog_id, body.playbook) if x]
        if len(given) != 1:
            return _error(400, "give exactly one of path, catalog_id, playbook")  # type: ignore[return-value]
        version = body.version
        try:
            if body.playbook:
                playbook = parse_playbook(body.playbook, None)
            else:
                path = body.path or ""
                if body.catalog_id:
                    try:
                        path, parsed = parse_catalog_id(body.catalog_id)
                    except ValueError as exc:
                        return _error(422, f"catalog_id: {exc}", field="catalog_id")  # type: ignore[return-value]
                    version = parsed or version
                row = await asyncio.to_thread(runtime.store.get_playbook, path, version)
                playbook = parse_playbook(row.text, row.source_file)
                version = row.version
            execution_id = await coord().execute(
                playbook,
                workload=body.payload,
                catalog_version=version if not body.playbook else None,
                parent_execution_id=body.parent_execution_id,
                parent_command_id=body.parent_command_id,
                pool=body.pool,
            )
        except (PlaybookError, TemplateError) as exc:
            return _error(400, str(exc), field="playbook")  # type: ignore[return-value]
        except ExecutionFinished as exc:
            # A sub-playbook of a parent that is ending: nothing may start under it.
            return _error(  # type: ignore[return-value]
                409, f"parent {exc}: no sub-playbook starts under it", field="parent_execution_id"
            )
        return {"execution_id": str(execution_id), "status": "running"}

    @app.get("/api/executions")
    async def list_executions(
        status: str | None = None,
        limit: Annotated[int, Query(ge=0, le=1000)] = 50,
        before: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        """Executions newest first; pass the last id as `before` for the next page."""
        rows = await asyncio.to_thread(
            lambda: runtime.store.list_executions(status=status, limit=limit, before_id=before)
        )
        items = [
            {
                "execution_id": str(r.execution_id),
                "playbook": r.playbook_path or r.playbook_file,
                "version": r.playbook_version,
                "status": r.status,
                "created": r.created,
                "updated": r.updated,
                "parent_execution_id": str(r.parent_execution_id)
                if r.parent_execution_id
                else None,
            }
            for r in rows
        ]
        nxt = items[-1]["execution_id"] if len(items) == limit and items else None
        return {"items": items, "next_before": nxt}

    @app.get("/api/executions/{execution_id}")
    async def get_execution(execution_id: Annotated[int, Path(ge=0)]) -> dict[str, Any]:
        """The execution's document (the same as `flowtide run --json`): values of the
        execution's secret set are masked (`***`)."""
        state = await coord().state(execution_id)
        doc: dict[str, Any] = mask_value(execution_document(state), state.secrets)
        row = await asyncio.to_thread(runtime.store.get_execution, execution_id)
        doc["playbook"] = row.playbook_path or row.playbook_file
        return doc

    @app.get("/api/internal/executions/{execution_id}/result")
    async def execution_result(execution_id: Annotated[int, Path(ge=0)]) -> dict[str, Any]:
        """What a worker running a `playbook` step reads of the sub-playbook execution it
        started: status, error, result and each step's result, intact (not masked: the
        parent's step uses the data). For workers only, never for display."""
        state = await coord().state(execution_id)
        doc = execution_document(state)
        return {
            "execution_id": doc["execution_id"],
            "status": doc["status"],
            "error": doc["error"],
            "result": doc["result"],
            "steps": {name: step["result"] for name, step in doc["steps"].items()},
        }

    @app.get("/api/executions/{execution_id}/status")
    async def execution_status(execution_id: Annotated[int, Path(ge=0)]) -> dict[str, Any]:
        row = await asyncio.to_thread(runtime.store.get_execution, execution_id)
        return {
            "execution_id": str(execution_id),
            "status": row.status,
            "updated": row.updated,
            "terminal": row.status in TERMINAL,
        }

    @app.post("/api/executions/{execution_id}/cancel")
    async def cancel(
        execution_id: Annotated[int, Path(ge=0)], body: CancelRequest | None = None
    ) -> dict[str, Any]:
        """Stop issuing commands; running workers see it through cancellation-check."""
        result = await coord().cancel(execution_id, body.reason if body else "cancelled by user")
        return {"execution_id": str(execution_id), "status": result.status}

    @app.get("/api/executions/{execution_id}/cancellation-check")
    async def cancellation_check(execution_id: Annotated[int, Path(ge=0)]) -> dict[str, Any]:
        def read() -> tuple[str, float | None]:
            with runtime.store.transaction("cancellation-check") as conn:
                row = conn.execute(
                    "SELECT status, cancel_requested FROM execution WHERE execution_id = %s",
                    (execution_id,),
                ).fetchone()
            if row is None:
                raise NotFoundError(f"execution {execution_id} not found")
            return row[0], row[1]

        status, requested = await asyncio.to_thread(read)
        return {
            "execution_id": str(execution_id),
            "cancelled": requested is not None or status == "cancelled",
            "status": status,
        }

    @app.get("/api/executions/{execution_id}/events")
    async def execution_events(
        execution_id: Annotated[int, Path(ge=0)],
        after: Annotated[int | None, Query(ge=0)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[dict[str, Any]]:
        events = await asyncio.to_thread(
            lambda: runtime.store.events(execution_id, after_event_id=after, limit=limit)
        )
        if not events:
            return []
        secrets = (await coord().state(execution_id)).secrets
        return [_event_doc(e, secrets) for e in events]

    # -- events and commands --------------------------------------------------------

    @app.post("/api/events/batch")
    async def post_events(body: EventBatch) -> dict[str, Any]:
        """Worker reports for one execution; idempotent (known event ids are skipped).
        409 when every report is stale (the worker no longer holds the command)."""
        for i, e in enumerate(body.events):
            if e.execution_id != body.execution_id:
                field = f"events.{i}.execution_id"
                message = f"{field}: {e.execution_id} is not the batch's {body.execution_id}"
                return _error(422, message, fields=[{"field": field, "message": message}])  # type: ignore[return-value]
        events = [e.to_event() for e in body.events]
        result = await coord().submit(body.execution_id, events)
        doc = _submit_doc(result)
        if _refused_stale(result):
            return JSONResponse({"error": {"status": 409, "message": "stale report"}, **doc}, 409)  # type: ignore[return-value]
        return doc

    @app.post("/api/events/reports")
    async def post_reports(body: WorkerReports) -> dict[str, Any]:
        """Several worker reports at once (each one command's events), of any executions.

        `results` has one entry per report, in order: `{"code": 200, "accepted",
        "duplicates", "stale", "status"}`, with code 409 when the report is stale (as
        `POST /api/events/batch` answers it), or `{"code": 4xx|5xx, "error": ...}`; a
        report with code 500 or above was not taken and may be sent again."""
        results: list[dict[str, Any]] = [{} for _ in body.reports]
        by_execution: dict[int, list[int]] = {}
        for i, report in enumerate(body.reports):
            wrong = next((e for e in report.events if e.execution_id != report.execution_id), None)
            if wrong is not None:
                message = (
                    f"reports.{i}: event {wrong.event_id} belongs to execution"
                    f" {wrong.execution_id}, not {report.execution_id}"
                )
                results[i] = {"code": 422, "error": {"message": message}}
                continue
            by_execution.setdefault(report.execution_id, []).append(i)

        async def one(execution_id: int, indexes: list[int]) -> list[Any]:
            parts = [[e.to_event() for e in body.reports[i].events] for i in indexes]
            try:
                return await coord().submit_many(execution_id, parts)
            except Exception as exc:  # noqa: BLE001 - every report of it gets the error
                return [exc] * len(indexes)

        groups = list(by_execution.items())
        outcomes = await asyncio.gather(*(one(eid, idx) for eid, idx in groups))
        for (_, indexes), got in zip(groups, outcomes, strict=True):
            for i, outcome in zip(indexes, got, strict=True):
                if isinstance(outcome, SubmitResult):
                    code = 409 if _refused_stale(outcome) else 200
                    doc = {"code": code, **_submit_doc(outcome)}
                else:
                    doc = _item_doc(outcome, {})
                results[i] = doc
        return {"results": results}

    @app.post("/api/events")
    async def post_event(body: EventBody) -> dict[str, Any]:
        return await post_events(EventBatch(execution_id=body.execution_id, events=[body]))

    @app.post("/api/commands/{event_id}/claim")
    async def claim(event_id: Annotated[int, Path(ge=0)], body: ClaimRequest) -> dict[str, Any]:
        """Claim the command issued by event `event_id`: exactly one worker wins; others
        get 409 (ack the notification and move on)."""
        return await coord().claim(body.execution_id, body.command_id, event_id, body.worker_id)

    @app.post("/api/commands/claim")
    async def claim_many(body: ClaimMany) -> dict[str, Any]:
        """Claim several commands in one transaction (a worker's batch of notifications).

        `results` has one entry per claim, in order: `{"code": 200, "command": ...,
        "iterator": ..., "element": ..., "lease": ...}` for a command won, or `{"code":
        404|409, "error": ...}` as `POST /api/commands/{event_id}/claim` would have
        answered. `executions` holds, once per execution, what its commands share:
        `playbook`, `context`, `cancelled`."""
        batch = await coord().claim_many(
            body.worker_id,
            [ClaimItem(c.execution_id, c.command_id, c.event_id) for c in body.claims],
        )
        return {
            "results": [_item_doc(r, {"code": 200}) for r in batch.results],
            "executions": {str(k): v for k, v in batch.executions.items()},
        }

    @app.get("/api/commands/{event_id}")
    async def get_command(
        event_id: Annotated[int, Path(ge=0)],
        execution_id: Annotated[int, Query(ge=0)],
        command_id: Annotated[int, Query(ge=0)],
    ) -> dict[str, Any]:
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

    # -- workers ----------------------------------------------------------------------

    @app.post("/api/worker/pool/register")
    async def register_worker(body: PoolRegister) -> dict[str, Any]:
        now = time.time()

        def write() -> None:
            with runtime.store.transaction("worker register", "cluster") as conn:
                conn.execute(
                    "INSERT INTO worker (worker_id, pool, hostname, pid, concurrency,"
                    " registered, heartbeat, status) VALUES (%s,%s,%s,%s,%s,%s,%s,'ready')"
                    " ON CONFLICT (worker_id) DO UPDATE SET pool = excluded.pool,"
                    " hostname = excluded.hostname, pid = excluded.pid,"
                    " concurrency = excluded.concurrency, heartbeat = excluded.heartbeat,"
                    " status = 'ready'",
                    (
                        body.worker_id,
                        body.pool,
                        body.hostname,
                        body.pid,
                        body.concurrency,
                        now,
                        now,
                    ),
                )

        await asyncio.to_thread(write)
        return {"worker_id": body.worker_id, "lease": runtime.settings.lease}

    @app.post("/api/worker/pool/heartbeat")
    async def heartbeat(body: Heartbeat) -> dict[str, Any]:
        if not await runtime.rowcount(
            "worker heartbeat",
            "UPDATE worker SET heartbeat = %s, running = %s WHERE worker_id = %s",
            (time.time(), body.running, body.worker_id),
        ):
            raise NotFoundError(f"worker {body.worker_id!r} is not registered")
        extended = await coord().extend_leases(body.worker_id, body.commands)
        return {"worker_id": body.worker_id, "leases_extended": extended}

    @app.post("/api/worker/pool/deregister")
    async def deregister(body: Heartbeat) -> dict[str, Any]:
        if not await runtime.rowcount(
            "worker deregister",
            "UPDATE worker SET status = 'stopped', heartbeat = %s WHERE worker_id = %s",
            (time.time(), body.worker_id),
        ):
            raise NotFoundError(f"worker {body.worker_id!r} is not registered")
        return {"worker_id": body.worker_id, "status": "stopped"}

    @app.get("/api/worker/pools")
    async def pools() -> dict[str, Any]:
        rows = await runtime.fetch(
            "worker pools",
            "SELECT worker_id, pool, hostname, pid, concurrency, heartbeat, status, running"
            " FROM worker ORDER BY pool, worker_id",
        )
        now = time.time()
        out: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            alive = r[6] != "stopped" and now - r[5] < runtime.settings.worker_timeout
            out.setdefault(r[1], []).append(
                {
                    "worker_id": r[0],
                    "hostname": r[2],
                    "pid": r[3],
                    "concurrency": r[4],
                    "last_heartbeat_age": round(now - r[5], 3),
                    "status": r[6] if alive or r[6] == "stopped" else "lost",
                    "running": r[7],
                }
            )
        return {"pools": [{"pool": k, "workers": v} for k, v in out.items()]}

    # -- outbox (for external relays and autoscalers) -----------------------------------

    def rows() -> OutboxStore:
        assert runtime.outbox is not None
        return runtime.outbox

    @app.get("/api/internal/outbox/pending-count")
    async def pending_count() -> dict[str, Any]:
        """Unpublished command notifications (scale workers or relays on this)."""
        return await asyncio.to_thread(rows().pending)

    @app.post("/api/internal/outbox/claim")
    async def outbox_claim(body: OutboxClaim) -> dict[str, Any]:
        claimed = await asyncio.to_thread(rows().claim, body.limit, body.lease)
        return {
            "rows": [
                {
                    "id": r.id,
                    "execution_id": str(r.execution_id),
                    "command_id": str(r.command_id),
                    "subject": r.subject,
                    "payload": json.loads(r.payload),
                    "attempts": r.attempts,
                }
                for r in claimed
            ]
        }

    @app.post("/api/internal/outbox/mark-published")
    async def outbox_published(body: OutboxMark) -> dict[str, Any]:
        return {"updated": await asyncio.to_thread(rows().mark_published, body.ids)}

    @app.post("/api/internal/outbox/mark-failed")
    async def outbox_failed(body: OutboxMark) -> dict[str, Any]:
        error = body.error or "failed"
        return {"updated": await asyncio.to_thread(rows().mark_failed, body.ids, error)}

    # -- health -----------------------------------------------------------------------

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        checks: dict[str, str] = {}

        def ping() -> None:
            with runtime.store.transaction("readyz") as conn:
                conn.execute("SELECT 1")

        try:
            await asyncio.to_thread(ping)
            checks["database"] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            checks["database"] = f"error: {exc}"
        if runtime.nc is not None:
            checks["nats"] = "ok" if runtime.nc.is_connected else "disconnected"
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, 200 if ok else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus text format: counters of every server process, gauges read from
        the database now (see flowtide.server.metrics)."""
        body = await asyncio.to_thread(metrics.exposition, runtime.store)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    # Imported here: the router module uses this module's helpers.
    from flowtide.server.api_executions import executions_router

    app.include_router(executions_router(runtime))

    app.state.runtime = runtime
    app.state.describe = lambda: {
        "db": redact_url(runtime.settings.db),
        "nats": redact_url(runtime.settings.nats) if runtime.settings.nats else None,
    }
    return app


def _event_doc(e: Event, secrets: frozenset[str] = frozenset()) -> dict[str, Any]:
    """An event as the API shows it: ids as strings, payload and error masked with the
    execution's secret set `secrets`."""
    doc = e.to_dict()
    for key in ("event_id", "execution_id", "parent_event_id", "command_id"):
        if doc[key] is not None:
            doc[key] = str(doc[key])
    return mask_event_doc(doc, secrets)


def app_factory() -> FastAPI:
    """For `uvicorn --factory flowtide.server.app:app_factory` (settings from env; with
    `--workers N`, point PROMETHEUS_MULTIPROC_DIR at an empty directory first, as
    `flowtide server` does, or /metrics shows one process's counters)."""
    return create_app()
