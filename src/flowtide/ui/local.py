"""`flowtide ui`: the web UI over the embedded store (the SQLite file `flowtide run`
writes), so a user who never runs a server still sees their runs.

The same page (`flowtide.ui.pages`) reads the same API paths and documents as on a
server (`/api/executions`, `.../summary`, `.../events`), served here from the local
store. Nothing is open because it is local: any process and any web page the user opens
can reach a loopback port, so the app takes a secret made at start (printed once, in the
URL `flowtide ui` shows, after a `#` so it never reaches a log) as its only token, behind
the server's own Gate (the session cookie, the CSRF header, body caps), and it answers
only requests whose Host is the address it listens on (a page of another site that
rebinds its DNS name to 127.0.0.1 sends its own name as Host).

A user can also start playbooks here (a catalog entry's run form, a re-run) and
resume an interrupted run: they run in this process, on an embedded runtime like
`flowtide run`'s, which holds each one's run lock (`flowtide.runlock`) so no other
process resumes it meanwhile; this process can cancel those. A run of another live
process is its own to stop (409 naming the pid); one that no process runs any more is
closed as cancelled.

Folded states are cached and caught up as the log grows (`flowtide.ui.fold`), so a
page that polls a running 100,000-iteration loop reads the new events only.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import hmac
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, StreamingResponse

from flowtide.auth.principal import Principal
from flowtide.engine import events as ev
from flowtide.engine.state import secret_values
from flowtide.errors import AuthError, NotFoundError, PlaybookError, TemplateError
from flowtide.playbook.loader import parse_playbook
from flowtide.redaction import mask_value
from flowtide.runlock import ExecutionBusy, RunLocks, run_locks_for
from flowtide.runtime.report import execution_document
from flowtide.server.access import OPERATOR, RULES, Authenticator, Gate, authorizer
from flowtide.server.api_cluster import (
    CatalogVersion,
    PathPrefix,
    RegisterRequest,
    catalog_entry,
    catalog_list,
    register_text,
    requested_playbook,
    validate_text,
)
from flowtide.server.documents import event_document
from flowtide.server.errors import install_error_handlers
from flowtide.server.fields import INT64_MAX, IdPath, Text
from flowtide.server.problems import error_response
from flowtide.server.schemas import CancelRequest, ExecuteRequest, RerunRequest
from flowtide.store.base import ENDED_STATUSES, Store
from flowtide.ui import pages
from flowtide.ui.details import CALL_TYPES, CALLS_SHOWN, step_document
from flowtide.ui.fold import FoldCache, overlap_floor
from flowtide.ui.listing import (
    EventsQuery,
    ListQuery,
    events_query,
    execution_item,
    list_query,
    listed,
    read_events,
)
from flowtide.ui.pages import SessionRequest, signed_in, signed_out
from flowtide.ui.summary import execution_summary, keep_summary, kept_summary, summary_document
from flowtide.ui.timeline import MAX_BUCKETS, execution_timeline
from flowtide.wire import EXECUTE_PATH

__all__ = ["FoldCache", "LocalAuthenticator", "create_local_app", "follow_events"]

#: How often a live event stream reads the log; a keep-alive comment after this long idle.
STREAM_POLL: Final = 0.25
STREAM_KEEPALIVE: Final = 15.0
_STREAM_BATCH: Final = 500
#: The list computes progress bars for at most this many running executions per page
#: (each is a fold of its log; cached and caught up afterwards).
PROGRESS_PER_PAGE: Final = 10
#: The server's access rules, and those of the routes only `flowtide ui` has.
LOCAL_RULES: Final = {**RULES, ("POST", "/api/executions/{execution_id}/resume"): OPERATOR}


class LocalAuthenticator(Authenticator):
    """The one token of a `flowtide ui` process (compared in constant time)."""

    def __init__(self, secret: str, user: str) -> None:
        super().__init__(None)
        self._secret = secret.encode()
        self.principal = Principal("local", user, "admin", None)

    async def authenticate(self, header: str | None) -> Principal:
        if not header:
            raise AuthError(
                "authentication required: open the URL `flowtide ui` printed", status=401
            )
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode("utf-8", "replace"), self._secret
        ):
            raise AuthError("invalid token: open the URL `flowtide ui` printed", status=401)
        return self.principal


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class HostCheck:
    """ASGI middleware: only requests whose Host is one of `hosts` (DNS rebinding)."""

    def __init__(
        self, app: Callable[[Scope, Receive, Send], Awaitable[None]], *, hosts: Iterable[str]
    ) -> None:
        self.app = app
        self.hosts = {h.lower().encode() for h in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope.get("headers") or ()).get(b"host", b"").lower()
            if host not in self.hosts:
                body = b'{"error": {"status": 403, "message": "unknown Host"}}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 403,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def local_hosts(host: str, port: int) -> list[str]:
    """The Host values a browser sends for `host:port` (loopback by its names too)."""
    names = {host}
    if host in ("127.0.0.1", "localhost", "::1", "[::1]"):
        names |= {"127.0.0.1", "localhost", "[::1]"}
    return [f"{name}:{port}" for name in sorted(names)]


class LocalRuns:
    """The embedded runtime of a `flowtide ui` process: the runs started, re-run or
    resumed from the page. Opened with the app (its lifespan), closed with it: a run
    still going when the UI stops is left `running`, for `flowtide resume`."""

    def __init__(self, store: Store, home: Path, locks: RunLocks) -> None:
        self.store = store
        self.home = home
        self.locks = locks
        self.runtime: Any = None

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        from flowtide.credentials import CredentialVault
        from flowtide.runtime.local import LocalRuntime

        async with LocalRuntime(
            self.store,
            credentials=CredentialVault(self.store, self.home),
            data_dir=self.home / "data",
            locks=self.locks,
            on_finished=partial(keep_summary, self.store),
        ) as runtime:
            self.runtime = runtime
            try:
                yield
            finally:
                self.runtime = None

    def live(self) -> Any:
        if self.runtime is None:
            raise RuntimeError("the UI's runtime is not open")
        return self.runtime

    def runs(self, execution_id: int) -> bool:
        """Whether this process runs the execution (until it ends)."""
        return self.locks.holds(execution_id)


def _busy(execution_id: int, pid: int | None, what: str) -> JSONResponse:
    who = f"process {pid}" if pid else "another process"
    return error_response(
        409,
        f"execution {execution_id} is running in {who} (`flowtide run`):"
        f" {what} it there (Ctrl-C stops it; `flowtide resume` continues it)",
    )


async def follow_events(
    store: Store, execution_id: int, after: int | None, secrets: frozenset[str]
) -> AsyncIterator[str]:
    """The server's event stream over the local store: each event once, as written. The
    embedded runtime writes a worker's events after it made their ids, so each read
    looks `OVERLAP_MS` back and skips the ids already sent (an event can then come after
    one with a higher id: the stream is in write order, and a client that reconnects
    after the highest id it saw may miss an event written late with a lower one; the
    `end` event always comes once everything is written)."""
    loop = asyncio.get_running_loop()
    yield "retry: 1000\n\n"
    # Never before `after`: what a reconnecting client saw already.
    start = last_id = after or 0
    cursor = after or None  # the next read's `after_event_id`
    sent: set[int] = set()
    last_sent = loop.time()
    while True:

        def read(horizon: int | None) -> tuple[list[Any], str]:
            status = store.get_execution(execution_id).status
            return store.events(execution_id, after_event_id=horizon, limit=_STREAM_BATCH), status

        events, status = await asyncio.to_thread(read, cursor)
        fresh = [e for e in events if e.event_id not in sent]
        if fresh:
            parts = []
            for e in fresh:
                if e.type == ev.SECRETS_ADDED:
                    secrets = secrets | secret_values(e)
                data = json.dumps(event_document(e, secrets), separators=(",", ":"))
                parts.append(f"id: {e.event_id}\nevent: {e.type}\ndata: {data}\n\n")
                sent.add(e.event_id)
                last_id = max(last_id, e.event_id)
            floor = overlap_floor(last_id)
            sent = {i for i in sent if i >= floor}
            yield "".join(parts)
            last_sent = loop.time()
        if len(events) == _STREAM_BATCH:
            # A backlog: read on after this batch (always forward, even when the
            # look-back window held a whole batch already sent).
            cursor = events[-1].event_id
            continue
        # Caught up: the next read looks back over the window for late writes.
        cursor = max(overlap_floor(last_id), start) if last_id else None
        if status in ENDED_STATUSES and not fresh:
            row = await asyncio.to_thread(store.get_execution, execution_id)
            end = {
                "execution_id": str(execution_id),
                "status": row.status,
                "error": mask_value(row.error, secrets),
            }
            yield f"event: end\ndata: {json.dumps(end, separators=(',', ':'))}\n\n"
            return
        if loop.time() - last_sent >= STREAM_KEEPALIVE:
            yield ": keepalive\n\n"
            last_sent = loop.time()
        await asyncio.sleep(STREAM_POLL)


def create_local_app(
    store: Store,
    *,
    secret: str,
    hosts: Iterable[str],
    home: Path | None = None,
    prewarm: int = 4,
) -> FastAPI:
    """The `flowtide ui` app over `store`, its only token `secret`, answering only
    requests whose Host is one of `hosts`; runs started from the page use `home` (the
    state folder: credentials key, spark data). The `prewarm` newest executions are
    folded in a background thread from the start: the run a user just made is the one
    they open first, and a long one takes seconds to fold."""
    home = (home or Path(".flowtide")).absolute()
    folds = FoldCache(store)
    if prewarm:
        threading.Thread(
            target=folds.prewarm, args=(prewarm,), name="flowtide-ui-prewarm", daemon=True
        ).start()
    auth = LocalAuthenticator(secret, getpass.getuser())
    runs = LocalRuns(store, home, run_locks_for(store, home))
    router = APIRouter()

    @router.get("/api/whoami")
    async def whoami() -> dict[str, Any]:
        """The local user (every right over the local store)."""
        p = auth.principal
        return {"name": p.name, "role": p.role, "pool": p.pool, "subject": p.subject, "local": True}

    @router.post("/api/session")
    async def open_session(body: SessionRequest, request: Request) -> JSONResponse:
        """Sign the browser in with the token `flowtide ui` printed."""
        principal = await auth.authenticate(f"Bearer {body.token}")
        return signed_in(principal, body.token, request)

    @router.delete("/api/session")
    async def close_session(request: Request) -> JSONResponse:
        return signed_out(request)

    # -- executions -------------------------------------------------------------------

    @router.post(EXECUTE_PATH, status_code=201)
    async def execute(body: ExecuteRequest) -> dict[str, Any]:
        """Start a catalog playbook (path/version or catalog_id) or an inline one in this
        process, with `payload` as workload overrides."""
        if body.parent_execution_id is not None:
            return error_response(  # type: ignore[return-value]
                400, "sub-playbooks start from their parent's step", field="parent_execution_id"
            )
        try:
            requested = await requested_playbook(store, body)
            if isinstance(requested, JSONResponse):
                return requested  # type: ignore[return-value]
            playbook, version = requested
            execution_id = await runs.live().start(
                playbook, workload=body.payload, catalog_version=version
            )
        except (PlaybookError, TemplateError) as exc:
            return error_response(400, str(exc), field="playbook")  # type: ignore[return-value]
        return {"execution_id": str(execution_id), "status": "running"}

    @router.get("/api/executions")
    async def list_executions(q: Annotated[ListQuery, Depends(list_query)]) -> dict[str, Any]:
        """The local store's executions newest first (keyset: `before`), filtered as on
        a server; running ones with their progress (the first `PROGRESS_PER_PAGE`)."""

        def read() -> list[dict[str, Any]]:
            rows = listed(store, q)
            items = []
            running = 0
            for row in rows:
                progress = None
                if row.status not in ENDED_STATUSES and running < PROGRESS_PER_PAGE:
                    running += 1
                    with contextlib.suppress(NotFoundError, PlaybookError):
                        progress = execution_summary(folds.state(row.execution_id)[1])["progress"]
                items.append(execution_item(row, progress))
            return items

        items = await asyncio.to_thread(read)
        last = items[-1]["execution_id"] if len(items) == q.limit and items else None
        return {"items": items, "next_before": last, "unavailable_shards": []}

    @router.get("/api/executions/{execution_id}")
    async def get_execution(execution_id: IdPath) -> dict[str, Any]:
        row, state = await asyncio.to_thread(folds.state, execution_id)
        doc: dict[str, Any] = mask_value(execution_document(state), state.secrets)
        doc["playbook"] = row.playbook_path or row.playbook_file
        return doc

    @router.get("/api/executions/{execution_id}/summary")
    async def get_summary(execution_id: IdPath) -> dict[str, Any]:
        def build() -> dict[str, Any]:
            row = store.get_execution(execution_id)
            # An ended run's summary as kept when it ended: no fold of its log.
            doc = kept_summary(store, row)
            if doc is None:
                row, state = folds.state(execution_id)
                doc = summary_document(state, row)
            return doc

        doc = await asyncio.to_thread(build)
        doc["run_here"] = runs.runs(execution_id)
        return doc

    @router.get("/api/executions/{execution_id}/steps/{step}")
    async def get_step(
        execution_id: IdPath, step: Annotated[Text, PathParam(max_length=256)]
    ) -> dict[str, Any]:
        def build() -> dict[str, Any]:
            _, state = folds.state(execution_id)
            if step not in state.playbook.steps:
                raise NotFoundError(f"execution {execution_id} has no step {step!r}")
            calls = store.events(
                execution_id, types=CALL_TYPES, steps=[step], limit=CALLS_SHOWN, newest=True
            )
            return step_document(state, step, calls)

        return await asyncio.to_thread(build)

    @router.get("/api/executions/{execution_id}/timeline")
    async def get_timeline(
        execution_id: IdPath,
        buckets: Annotated[int, Query(ge=1, le=MAX_BUCKETS)] = 120,
    ) -> dict[str, Any]:
        def build() -> dict[str, Any]:
            row, state = folds.state(execution_id)
            return execution_timeline(store, state.playbook, execution_id, row.status, buckets)

        return await asyncio.to_thread(build)

    @router.get("/api/executions/{execution_id}/events")
    async def get_events(
        execution_id: IdPath, q: Annotated[EventsQuery, Depends(events_query)]
    ) -> list[dict[str, Any]]:
        def read() -> tuple[list[Any], frozenset[str]]:
            _, state = folds.state(execution_id)
            return read_events(store, execution_id, q), state.secrets

        events, secrets = await asyncio.to_thread(read)
        return [event_document(e, secrets) for e in events]

    @router.get("/api/executions/{execution_id}/events/stream")
    async def stream_events(
        execution_id: IdPath,
        request: Request,
        after: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    ) -> StreamingResponse:
        """The execution's events as Server-Sent Events, as on a server (`event: end`
        when it has ended; `Last-Event-ID` or `?after=` resumes)."""
        header = request.headers.get("last-event-id")
        if header is not None:
            if not header.isdigit() or int(header) > INT64_MAX:
                return error_response(422, "Last-Event-ID: not an event id")  # type: ignore[return-value]
            after = int(header)
        _, state = await asyncio.to_thread(folds.state, execution_id)
        return StreamingResponse(
            follow_events(store, execution_id, after or None, state.secrets),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @router.post("/api/executions/{execution_id}/cancel")
    async def cancel(execution_id: IdPath, body: CancelRequest | None = None) -> JSONResponse:
        """Cancel a run of this process; close one that no process runs any more as
        cancelled; refuse (409) one that another live process runs."""
        reason = body.reason if body else "cancelled by user"
        row = await asyncio.to_thread(store.get_execution, execution_id)
        if row.status in ENDED_STATUSES:
            return error_response(409, f"execution {execution_id} is {row.status} already")
        runtime = runs.live()
        if runs.runs(execution_id):
            await runtime.cancel(execution_id, reason)
        else:
            try:
                await asyncio.to_thread(runtime.cancel_stopped, execution_id, reason)
            except ExecutionBusy as exc:
                return _busy(execution_id, exc.pid, "stop")
        return JSONResponse({"execution_id": str(execution_id), "status": "cancelling"})

    @router.post("/api/executions/{execution_id}/resume")
    async def resume(execution_id: IdPath) -> JSONResponse:
        """Carry on a run that stopped (its process ended before it did) in this
        process, from its log: finished steps and iterations are kept."""
        row = await asyncio.to_thread(store.get_execution, execution_id)
        if row.status in ENDED_STATUSES:
            return error_response(
                409, f"execution {execution_id} is {row.status}: nothing to resume"
            )
        if runs.runs(execution_id):
            return error_response(409, f"execution {execution_id} is running here already")
        try:
            await runs.live().resume(execution_id)
        except ExecutionBusy as exc:
            return _busy(execution_id, exc.pid, "resume")
        return JSONResponse({"execution_id": str(execution_id), "status": "running"})

    @router.post("/api/executions/{execution_id}/rerun", status_code=201)
    async def rerun(execution_id: IdPath, body: RerunRequest | None = None) -> JSONResponse:
        """Start the same playbook with the same workload, in this process."""
        row = await asyncio.to_thread(store.get_execution, execution_id)
        if row.parent_execution_id is not None:
            return error_response(
                400,
                f"execution {execution_id} is a sub-playbook of {row.parent_execution_id}:"
                " re-run the parent",
            )
        try:
            playbook = await asyncio.to_thread(parse_playbook, row.playbook_text, row.playbook_file)
            new_id = await runs.live().start(
                playbook, workload=row.workload, catalog_version=row.playbook_version
            )
        except (PlaybookError, TemplateError) as exc:
            return error_response(400, str(exc), field="playbook")
        return JSONResponse(
            {"execution_id": str(new_id), "status": "running", "rerun_of": str(execution_id)},
            status_code=201,
        )

    # -- catalog --------------------------------------------------------------------

    @router.post("/api/catalog/register", status_code=201)
    async def register(body: RegisterRequest) -> Any:
        """Validate a playbook and record it in the local catalog."""
        return await register_text(store, body)

    @router.post("/api/catalog/validate")
    async def validate(body: RegisterRequest) -> Any:
        return await validate_text(body)

    @router.get("/api/catalog/list")
    async def list_catalog(path: PathPrefix = None) -> Any:
        return await catalog_list(store, path)

    @router.get("/api/catalog/{path:path}")
    async def get_catalog_entry(
        path: Annotated[Text, PathParam(max_length=4096)], version: CatalogVersion = None
    ) -> Any:
        return await catalog_entry(store, path, version)

    app = FastAPI(
        title="flowtide ui",
        description="The web UI over the embedded store (`flowtide ui`).",
        version="1",
        dependencies=[Depends(authorizer(LOCAL_RULES))],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lambda _app: runs.open(),
    )
    app.add_middleware(Gate, authenticator=lambda: auth)
    app.add_middleware(HostCheck, hosts=hosts)
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(pages.router)
    return app
