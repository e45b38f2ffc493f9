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
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from flowtide.auth.oidc import JwtSettings, JwtVerifier, parse_role_map
from flowtide.auth.principal import Principal
from flowtide.engine.events import Event
from flowtide.errors import (
    AuthError,
    CredentialError,
    FlowtideError,
    NotFoundError,
    PlaybookError,
    StoreError,
    TemplateError,
)
from flowtide.natsauth import NatsAuth
from flowtide.playbook.loader import parse_playbook
from flowtide.redaction import install_log_masking, known, mask_event_doc, mask_text, mask_value
from flowtide.runtime.report import execution_document
from flowtide.server import metrics
from flowtide.server.access import DEFAULT_MAX_BODY, Authenticator, Gate, authorize, caller
from flowtide.server.api_cluster import _Vault, cluster_router, parse_catalog_id, server_home
from flowtide.server.api_tokens import tokens_router
from flowtide.server.coordinator import (
    TERMINAL,
    WORKER_EVENTS,
    ClaimConflict,
    ClaimItem,
    Coordinator,
    ExecutionFinished,
    SubmitResult,
)
from flowtide.server.fields import (
    INT64_MAX,
    INTEGRAL,
    Id,
    IdPath,
    IdQuery,
    Int,
    PositiveId,
    RequestBody,
    Text,
)
from flowtide.server.openapi import documented_methods, install_openapi
from flowtide.server.outbox import OutboxRelay, OutboxStore, ensure_consumer
from flowtide.server.problems import error_response, problem_responses
from flowtide.server.workers import WorkerRegistry
from flowtide.urls import redact_url

__all__ = ["ServerSettings", "create_app"]

log = logging.getLogger("flowtide.server")

#: Connections per pool of one server process (PostgreSQL's default max_connections is
#: 100: mind --workers N times this, times the number of servers).
_POOL_SIZE = 16

#: PostgreSQL `integer` columns a request writes (worker.pid, worker.running).
_INT32_MAX = 2**31 - 1


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
    #: Serve every request without authentication (a trusted machine only; logged).
    insecure_no_auth: bool = False
    #: Bearer JWTs of an identity provider, besides flowtide's own tokens.
    jwt: JwtSettings | None = None
    #: Largest request body taken (bytes); larger ones get 413 before they are read.
    max_body: int = DEFAULT_MAX_BODY
    #: /metrics without a credential (for scrapers that cannot send one).
    public_metrics: bool = False
    #: Credentials of the NATS connections (--nats and a nats:// --kv) when their URLs
    #: carry none.
    nats_auth: NatsAuth = field(default_factory=NatsAuth)

    @classmethod
    def from_env(cls) -> ServerSettings:
        db = os.environ.get("FLOWTIDE_DB")
        if not db:
            raise FlowtideError("FLOWTIDE_DB must name the PostgreSQL database")
        jwks = os.environ.get("FLOWTIDE_JWKS_URL") or None
        jwt = None
        if jwks:
            jwt = JwtSettings(
                jwks_url=jwks,
                issuer=os.environ.get("FLOWTIDE_JWT_ISSUER") or None,
                audience=os.environ.get("FLOWTIDE_JWT_AUDIENCE") or None,
                roles_claim=os.environ.get("FLOWTIDE_JWT_ROLES_CLAIM") or "flowtide_roles",
                role_map=parse_role_map(os.environ.get("FLOWTIDE_JWT_ROLES")),
                pool_claim=os.environ.get("FLOWTIDE_JWT_POOL_CLAIM") or "flowtide_pool",
            )
        return cls(
            db=db,
            nats=os.environ.get("FLOWTIDE_NATS") or None,
            kv=os.environ.get("FLOWTIDE_KV", "memory://"),
            kv_bucket=os.environ.get("FLOWTIDE_KV_BUCKET", "flowtide_state"),
            cluster_db=os.environ.get("FLOWTIDE_CLUSTER_DB") or None,
            lease=float(os.environ.get("FLOWTIDE_LEASE", "30")),
            insecure_no_auth=os.environ.get("FLOWTIDE_INSECURE_NO_AUTH") == "1",
            jwt=jwt,
            max_body=int(os.environ.get("FLOWTIDE_MAX_BODY") or DEFAULT_MAX_BODY),
            public_metrics=os.environ.get("FLOWTIDE_PUBLIC_METRICS") == "1",
            nats_auth=NatsAuth.from_env(),
        )


# -- request bodies ---------------------------------------------------------------------


class ExecuteRequest(RequestBody):
    path: str | None = Field(None, description="Catalog path of the playbook.")
    version: Annotated[int, Field(ge=1, le=_INT32_MAX), INTEGRAL] | None = Field(
        None, description="Catalog version (default: latest)."
    )
    catalog_id: str | None = Field(None, description="`path@version` or `path`.")
    playbook: str | None = Field(None, max_length=4_000_000, description="Inline playbook YAML.")
    payload: dict[str, Any] = Field(default_factory=dict, description="Workload overrides.")
    pool: str = Field("default", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    parent_execution_id: Id | None = None
    parent_command_id: Id | None = None


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


class ClaimMany(RequestBody):
    worker_id: str = Field(min_length=1, max_length=200)
    claims: list[ClaimManyItem] = Field(min_length=1, max_length=1000)


class WorkerReport(RequestBody):
    execution_id: Id
    events: list[EventBody] = Field(max_length=10_000)


class WorkerReports(RequestBody):
    worker_id: str | None = None
    reports: list[WorkerReport] = Field(min_length=1, max_length=1000)


class CancelRequest(RequestBody):
    reason: str = Field("cancelled by user", max_length=1000)


class PoolRegister(RequestBody):
    worker_id: str = Field(min_length=1, max_length=200)
    pool: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    hostname: str | None = None
    pid: Annotated[int, Field(ge=0, le=_INT32_MAX), INTEGRAL] | None = None
    concurrency: Int = Field(1, ge=1, le=10_000)


class Heartbeat(RequestBody):
    worker_id: str = Field(min_length=1, max_length=200)
    running: Int = Field(0, ge=0, le=_INT32_MAX)
    commands: list[Id] | None = Field(
        None,
        max_length=100_000,
        description="Commands the worker is working on; only their leases are extended "
        "(all of the worker's when absent).",
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
    checks: dict[str, str] = Field(description="database, nats: `ok` or what is wrong.")


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
        self.auth: Authenticator | None = None
        self.workers: WorkerRegistry | None = None
        self._vault: _Vault | None = None
        self._vault_store: Any = None
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
        self.workers = WorkerRegistry(self.store, worker_timeout=s.worker_timeout)
        self.auth = await asyncio.to_thread(self._authenticator)
        self.kv = await connect(s.kv, s.kv_bucket, ttl=3600, nats_auth=s.nats_auth)
        self.coordinator = Coordinator(
            self.store,
            loopstate=LoopState(self.kv),
            local_kv=s.kv.startswith("memory:"),
            lease=s.lease,
            step_slots=_POOL_SIZE - 4,
        )
        if s.nats:
            from flowtide.natsauth import connect_nats

            self.nc = await connect_nats(s.nats, s.nats_auth, name="flowtide-server")
            self.relay = OutboxRelay(self.store, self.nc)
            self.coordinator.on_outbox = self.relay.poke
            self.coordinator.publish = self.relay.publish
            await self.relay.start()
        self.tasks.append(asyncio.create_task(self._reaper(), name="flowtide-reaper"))
        metrics.process_started()

    def vault(self) -> _Vault:
        """The credential vault over this runtime's store (the key is loaded once)."""
        if self._vault is None or self._vault_store is not self.store:
            self._vault = _Vault(self.store, server_home())
            self._vault_store = self.store
        return self._vault

    def _authenticator(self) -> Authenticator:
        """Tokens of the cluster database, and JWTs when configured. Without either way
        in (no active token, no JWKS), the server would answer nobody: it refuses."""
        from flowtide.auth.tokens import TokenStore

        s = self.settings
        if s.insecure_no_auth:
            log.warning(
                "AUTHENTICATION IS OFF (--insecure-no-auth): anyone who reaches this server"
                " can run code on its workers and change its credentials"
            )
            return Authenticator(None, insecure=True)
        tokens = TokenStore(self.store)
        if s.jwt is None and not tokens.any_active():
            raise AuthError(
                "no way to authenticate: the database has no active API token and no JWKS"
                " URL is set. Create an admin token with `flowtide token create --role admin"
                " --db URL`, or give --jwks-url, or (on a trusted machine only)"
                " --insecure-no-auth",
                status=401,
            )
        return Authenticator(tokens, JwtVerifier(s.jwt) if s.jwt else None)

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


_error = error_response


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
    elif isinstance(outcome, AuthError):
        doc = {"code": outcome.status, "error": {"message": outcome.message}}
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
        description="Runs NoETL-style playbooks: executions, events, commands, workers. "
        "Every endpoint but /healthz and /readyz needs `Authorization: Bearer <token>` "
        "(a flowtide API token or a JWT of the configured identity provider); what each "
        "role may call is in flowtide.server.access.",
        version="1",
        lifespan=lifespan,
        dependencies=[Depends(authorize)],
    )
    app.add_middleware(
        Gate,
        authenticator=lambda: runtime.auth,
        max_body=runtime.settings.max_body,
        public_metrics=runtime.settings.public_metrics,
    )
    app.include_router(cluster_router(runtime))
    app.include_router(tokens_router(runtime))

    def coord() -> Coordinator:
        assert runtime.coordinator is not None
        return runtime.coordinator

    def registry() -> WorkerRegistry:
        assert runtime.workers is not None
        return runtime.workers

    async def acting_worker(who: Principal, worker_id: str | None) -> str:
        """The worker id a worker's request speaks for, once checked against its
        credential (403 when it is another's, 404 when it never registered)."""
        if worker_id is None:
            raise AuthError("worker_id is required", status=422)
        await registry().require(who, worker_id)
        return worker_id

    async def held_by(who: Principal, execution_id: int, *, parent: bool = False) -> None:
        """A worker reads only executions of the commands it holds (or their children)."""
        if who.role != "worker" or who.insecure:
            return
        if not await registry().holds(who, execution_id, parent=parent):
            what = "a sub-playbook of a command" if parent else "a command"
            raise AuthError(
                f"{who.describe()} holds no {what} of execution {execution_id}", status=403
            )

    @app.exception_handler(AuthError)
    async def _auth_error(request: Request, exc: AuthError) -> JSONResponse:
        response = _error(exc.status, exc.message)
        if exc.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="flowtide"'
        return response

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own (404 and 405 of routing, 400 of an unreadable body) too: in the
        # API's error format, with their headers.
        response = _error(exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route that matched the path, but
            # a path has several (GET, POST and DELETE of /api/vars/{execution_id}).
            methods = documented_methods(request.scope["path"])
            if methods:
                response.headers["Allow"] = ", ".join(sorted(methods))
        return response

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

    @app.post(
        "/api/execute",
        status_code=201,
        responses=problem_responses(
            (400, "Not exactly one of path, catalog_id and playbook; or an invalid playbook."),
            (404, "No such catalog path or version, or no such parent execution."),
            (409, "The parent execution is ending: no sub-playbook starts under it."),
        ),
    )
    async def execute(
        body: ExecuteRequest, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        """Start an execution of a catalog playbook (path/version or catalog_id) or of an
        inline playbook. A worker may start only sub-playbooks of the commands it holds,
        on its own pool."""
        if who.role == "worker" and not who.insecure:
            if body.parent_execution_id is None:
                raise AuthError("a worker starts sub-playbooks only (parent_execution_id)")
            if who.pool is not None and body.pool != who.pool:
                raise AuthError(f"{who.describe()} serves pool {who.pool!r}, not {body.pool!r}")
            await held_by(who, body.parent_execution_id)
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
        status: Annotated[Text | None, Query(max_length=64)] = None,
        limit: Annotated[int, Query(ge=0, le=1000)] = 50,
        before: IdQuery = None,
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

    @app.get("/api/executions/{execution_id}", responses=problem_responses(404))
    async def get_execution(
        execution_id: IdPath, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        """The execution's document (the same as `flowtide run --json`): values of the
        execution's secret set are masked (`***`)."""
        await held_by(who, execution_id, parent=True)
        state = await coord().state(execution_id)
        doc: dict[str, Any] = mask_value(execution_document(state), state.secrets)
        row = await asyncio.to_thread(runtime.store.get_execution, execution_id)
        doc["playbook"] = row.playbook_path or row.playbook_file
        return doc

    @app.get("/api/internal/executions/{execution_id}/result", responses=problem_responses(404))
    async def execution_result(
        execution_id: IdPath, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        """What a worker running a `playbook` step reads of the sub-playbook execution it
        started: status, error, result and each step's result, intact (not masked: the
        parent's step uses the data). For the worker holding the parent's command only,
        never for display."""
        await held_by(who, execution_id, parent=True)
        state = await coord().state(execution_id)
        doc = execution_document(state)
        return {
            "execution_id": doc["execution_id"],
            "status": doc["status"],
            "error": doc["error"],
            "result": doc["result"],
            "steps": {name: step["result"] for name, step in doc["steps"].items()},
        }

    @app.get("/api/executions/{execution_id}/status", responses=problem_responses(404))
    async def execution_status(
        execution_id: IdPath, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        await held_by(who, execution_id, parent=True)
        row = await asyncio.to_thread(runtime.store.get_execution, execution_id)
        return {
            "execution_id": str(execution_id),
            "status": row.status,
            "updated": row.updated,
            "terminal": row.status in TERMINAL,
        }

    @app.post("/api/executions/{execution_id}/cancel", responses=problem_responses(404))
    async def cancel(execution_id: IdPath, body: CancelRequest | None = None) -> dict[str, Any]:
        """Stop issuing commands; running workers see it through cancellation-check."""
        result = await coord().cancel(execution_id, body.reason if body else "cancelled by user")
        return {"execution_id": str(execution_id), "status": result.status}

    @app.get("/api/executions/{execution_id}/cancellation-check", responses=problem_responses(404))
    async def cancellation_check(
        execution_id: IdPath, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        await held_by(who, execution_id)

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
        execution_id: IdPath,
        after: IdQuery = None,
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

    @app.post(
        "/api/events/batch",
        responses=problem_responses(
            (404, "The worker id was never registered."),
            (409, "Every report is stale: the worker no longer holds the command."),
        ),
    )
    async def post_events(
        body: EventBatch, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        """Worker reports for one execution; idempotent (known event ids are skipped).
        409 when every report is stale (the worker no longer holds the command)."""
        for i, e in enumerate(body.events):
            if e.execution_id != body.execution_id:
                field = f"events.{i}.execution_id"
                message = f"{field}: {e.execution_id} is not the batch's {body.execution_id}"
                return _error(422, message, fields=[{"field": field, "message": message}])  # type: ignore[return-value]
        worker_id = await acting_worker(who, body.worker_id)
        events, problem = worker_events(body.events, worker_id, "events")
        if problem is not None:
            return _error(422, problem["message"], fields=[problem])  # type: ignore[return-value]
        result = await coord().submit(body.execution_id, events)
        doc = _submit_doc(result)
        if _refused_stale(result):
            return JSONResponse({"error": {"status": 409, "message": "stale report"}, **doc}, 409)  # type: ignore[return-value]
        return doc

    @app.post(
        "/api/events/reports",
        responses=problem_responses((404, "The worker id was never registered.")),
    )
    async def post_reports(
        body: WorkerReports, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        """Several worker reports at once (each one command's events), of any executions.

        `results` has one entry per report, in order: `{"code": 200, "accepted",
        "duplicates", "stale", "status"}`, with code 409 when the report is stale (as
        `POST /api/events/batch` answers it), or `{"code": 4xx|5xx, "error": ...}`; a
        report with code 500 or above was not taken and may be sent again. The events
        are taken as the worker's whose id the request names, which must be one the
        caller's credential registered."""
        worker_id = await acting_worker(who, body.worker_id)
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
            try:
                return await coord().submit_many(execution_id, [parts[i] for i in indexes])
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

    @app.post(
        "/api/events",
        responses=problem_responses(
            (404, "The worker id was never registered."),
            (409, "The report is stale: the worker no longer holds the command."),
        ),
    )
    async def post_event(
        body: EventBody, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        return await post_events(
            EventBatch(execution_id=body.execution_id, worker_id=body.worker_id, events=[body]),
            who,
        )

    @app.post(
        "/api/commands/{event_id:int}/claim",
        responses=problem_responses(
            (404, "No such command, or the worker id was never registered."),
            (409, "Another worker holds the command, it is closed, or `event_id` is stale."),
        ),
    )
    async def claim(
        event_id: IdPath,
        body: ClaimRequest,
        who: Annotated[Principal, Depends(caller)],
    ) -> dict[str, Any]:
        """Claim the command issued by event `event_id`: exactly one worker wins; others
        get 409 (ack the notification and move on)."""
        row = await registry().require(who, body.worker_id)
        return await coord().claim(
            body.execution_id,
            body.command_id,
            event_id,
            body.worker_id,
            pool=row.pool if row else None,
        )

    @app.post(
        "/api/commands/claim",
        responses=problem_responses((404, "The worker id was never registered.")),
    )
    async def claim_many(
        body: ClaimMany, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        """Claim several commands in one transaction (a worker's batch of notifications).

        `results` has one entry per claim, in order: `{"code": 200, "command": ...,
        "iterator": ..., "element": ..., "lease": ...}` for a command won, or `{"code":
        403|404|409, "error": ...}` as `POST /api/commands/{event_id}/claim` would have
        answered (403: a command of another pool than the worker's). `executions` holds,
        once per execution, what its commands share: `playbook`, `context`,
        `cancelled`."""
        row = await registry().require(who, body.worker_id)
        batch = await coord().claim_many(
            body.worker_id,
            [ClaimItem(c.execution_id, c.command_id, c.event_id) for c in body.claims],
            pool=row.pool if row else None,
        )
        return {
            "results": [_item_doc(r, {"code": 200}) for r in batch.results],
            "executions": {str(k): v for k, v in batch.executions.items()},
        }

    @app.get("/api/commands/{event_id:int}", responses=problem_responses(404))
    async def get_command(
        event_id: IdPath,
        execution_id: Annotated[int, Query(ge=0, le=INT64_MAX)],
        command_id: Annotated[int, Query(ge=0, le=INT64_MAX)],
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

    @app.post(
        "/api/worker/pool/register",
        responses=problem_responses((503, "The pool's NATS consumer cannot be created.")),
    )
    async def register_worker(
        body: PoolRegister, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        """Register (or renew) a worker under the caller's credential: later requests
        naming this worker id are taken from that credential only."""
        await registry().register(
            who,
            worker_id=body.worker_id,
            pool=body.pool,
            hostname=body.hostname,
            pid=body.pid,
            concurrency=body.concurrency,
        )
        if runtime.nc is not None:
            # The pool's consumer is made here, not by the worker: a worker's NATS user
            # may only pull from it (flowtide.subjects).
            try:
                await ensure_consumer(runtime.nc.jetstream(), body.pool)
            except Exception as exc:  # noqa: BLE001 - nats-py's errors, told as a 503
                return _error(  # type: ignore[return-value]
                    503,
                    f"cannot create the NATS consumer of pool {body.pool!r}: "
                    f"{str(exc) or type(exc).__name__}",
                )
        return {"worker_id": body.worker_id, "lease": runtime.settings.lease}

    @app.post(
        "/api/worker/pool/heartbeat",
        responses=problem_responses((404, "The worker id is not registered.")),
    )
    async def heartbeat(
        body: Heartbeat, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        await registry().require(who, body.worker_id)
        if not await registry().heartbeat(body.worker_id, body.running):
            raise NotFoundError(f"worker {body.worker_id!r} is not registered")
        extended = await coord().extend_leases(body.worker_id, body.commands)
        return {"worker_id": body.worker_id, "leases_extended": extended}

    @app.post(
        "/api/worker/commands/release",
        responses=problem_responses((404, "The worker id was never registered.")),
    )
    async def release_commands(
        body: CommandRelease, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        """Hand back commands the calling worker holds (a worker stopping after its grace
        period): each is issued again now, for any worker of the pool. Commands it does
        not hold are left alone."""
        await registry().require(who, body.worker_id)
        released = await coord().release(body.worker_id, body.commands)
        return {"worker_id": body.worker_id, "released": released}

    @app.post(
        "/api/worker/pool/deregister",
        responses=problem_responses((404, "The worker id is not registered.")),
    )
    async def deregister(
        body: Heartbeat, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        await registry().require(who, body.worker_id)
        if not await registry().deregister(body.worker_id):
            raise NotFoundError(f"worker {body.worker_id!r} is not registered")
        return {"worker_id": body.worker_id, "status": "stopped"}

    @app.post(
        "/api/worker/credentials",
        responses=problem_responses(
            (404, "No such credential, or the worker id was never registered."),
            (503, "The credential vault is unavailable (the master key)."),
        ),
    )
    async def worker_credential(
        body: CredentialGrant, who: Annotated[Principal, Depends(caller)]
    ) -> dict[str, Any]:
        """A credential's decrypted body, for a command the calling worker holds now (its
        claim is live): workers need no master key, and get nothing between commands.
        Each grant is logged (alias, command, worker; never the value)."""
        await registry().require(who, body.worker_id)
        if not await coord().holds_command(body.worker_id, body.execution_id, body.command_id):
            raise AuthError(
                f"worker {body.worker_id!r} holds no live claim on command {body.command_id}"
                f" of execution {body.execution_id}"
            )
        try:
            data = await asyncio.to_thread(runtime.vault().resolve, body.name)
        except CredentialError as exc:
            if exc.missing:
                raise NotFoundError(f"credential {body.name!r} not found") from None
            return _error(503, f"credential vault unavailable: {exc}")  # type: ignore[return-value]
        log.info(
            "credential %r given to worker %s for command %s of execution %s",
            body.name,
            body.worker_id,
            body.command_id,
            body.execution_id,
        )
        return {"name": body.name, "data": data}

    @app.get("/api/worker/pools")
    async def pools() -> dict[str, Any]:
        rows = await registry().all()
        now = time.time()
        out: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            alive = r.status != "stopped" and now - r.heartbeat < runtime.settings.worker_timeout
            out.setdefault(r.pool, []).append(
                {
                    "worker_id": r.worker_id,
                    "hostname": r.hostname,
                    "pid": r.pid,
                    "concurrency": r.concurrency,
                    "last_heartbeat_age": round(now - r.heartbeat, 3),
                    "status": r.status if alive or r.status == "stopped" else "lost",
                    "running": r.running,
                }
            )
        return {"pools": [{"pool": k, "workers": v} for k, v in out.items()]}

    @app.get("/api/whoami")
    async def whoami(who: Annotated[Principal, Depends(caller)]) -> dict[str, Any]:
        """The caller as the server authenticated it: name, role and pool."""
        return {"name": who.name, "role": who.role, "pool": who.pool, "subject": who.subject}

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

    @app.get(
        "/readyz",
        response_model=Readiness,
        responses={503: {"model": Readiness, "description": "A check failed: not ready."}},
    )
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

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "description": "The Prometheus text exposition format.",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    async def prometheus_metrics() -> Response:
        """Prometheus text format: counters of every server process, gauges read from
        the database now (see flowtide.server.metrics)."""
        body = await asyncio.to_thread(metrics.exposition, runtime.store)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    # Imported here: the router module uses this module's helpers.
    from flowtide.server.api_executions import executions_router

    app.include_router(executions_router(runtime))
    install_openapi(app, public_metrics=runtime.settings.public_metrics)

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
