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

Folded states are cached and caught up as the log grows (`FoldCache`), so a page that
polls a running 100,000-iteration loop reads the new events only.
"""

from __future__ import annotations

import asyncio
import getpass
import hmac
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from flowtide.auth.principal import Principal
from flowtide.engine.state import FOLDED_TYPES, ExecutionState
from flowtide.errors import AuthError
from flowtide.playbook.loader import parse_playbook
from flowtide.redaction import mask_value
from flowtide.runtime.report import execution_document
from flowtide.server.access import Authenticator, Gate, authorize
from flowtide.server.documents import event_document
from flowtide.server.errors import install_error_handlers
from flowtide.server.fields import IdPath, IdQuery, Text
from flowtide.server.problems import error_response
from flowtide.server.schemas import CancelRequest
from flowtide.store.base import ExecutionRow, Store
from flowtide.ui import pages
from flowtide.ui.pages import SessionRequest, signed_in, signed_out
from flowtide.ui.summary import execution_item, summary_document
from flowtide.ui.timeline import MAX_BUCKETS, execution_timeline

__all__ = ["FoldCache", "LocalAuthenticator", "create_local_app"]

#: Statuses after which an execution's log does not grow.
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
#: How far back (ms of snowflake time) a catch-up reads again: an event a worker thread
#: made just before another one may be written just after it.
OVERLAP_MS: Final = 500
_ID_MS_SHIFT: Final = 22


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


@dataclass
class _Folded:
    playbook_text: str
    state: ExecutionState
    last_id: int = 0
    #: Ids applied within the overlap window (read again, not applied again).
    recent: set[int] = field(default_factory=set)
    exact: bool = False


class FoldCache:
    """Executions' states folded from the local store, caught up incrementally (thread-
    safe; its calls block on SQLite: run them in a thread).

    Only the events that change the fold are read (`FOLDED_TYPES`: a loop's
    `command.started`, `call.done` and `loop.item` are three of its five events per
    iteration). While an execution runs, each read applies the events after the last one
    seen, with
    an overlap of `OVERLAP_MS` of ids read again (and skipped when applied already):
    the embedded runtime writes a worker's events after it made their ids, so one can
    land behind a newer one. Once the execution has ended, its state is folded once
    more from the whole log in order, so what a finished run shows is exact."""

    def __init__(self, store: Store, size: int = 32) -> None:
        self.store = store
        self.size = size
        self._lock = threading.Lock()
        self._folded: OrderedDict[int, _Folded] = OrderedDict()

    def state(self, execution_id: int) -> tuple[ExecutionRow, ExecutionState]:
        row = self.store.get_execution(execution_id)
        with self._lock:
            entry = self._folded.get(execution_id)
            if entry is None or entry.playbook_text != row.playbook_text:
                entry = _Folded(
                    row.playbook_text,
                    ExecutionState(
                        parse_playbook(row.playbook_text, row.playbook_file), execution_id
                    ),
                )
            if not entry.exact:
                if row.status in TERMINAL:
                    entry = self._refold(entry, execution_id)
                else:
                    self._catch_up(entry, execution_id)
            self._folded[execution_id] = entry
            self._folded.move_to_end(execution_id)
            while len(self._folded) > self.size:
                self._folded.popitem(last=False)
            return row, entry.state

    def prewarm(self, count: int) -> None:
        """Fold the `count` newest executions (a store error is left to the requests)."""
        try:
            for row in self.store.list_executions(limit=count):
                self.state(row.execution_id)
        except Exception:  # noqa: BLE001 - the same error reaches the page that asks
            return

    def _catch_up(self, entry: _Folded, execution_id: int) -> None:
        horizon = max(0, entry.last_id - (OVERLAP_MS << _ID_MS_SHIFT)) if entry.last_id else None
        events = self.store.events(execution_id, after_event_id=horizon, types=FOLDED_TYPES)
        for event in events:
            if event.event_id in entry.recent:
                continue
            entry.state.apply(event)
            entry.recent.add(event.event_id)
            entry.last_id = max(entry.last_id, event.event_id)
        floor = entry.last_id - (OVERLAP_MS << _ID_MS_SHIFT)
        entry.recent = {i for i in entry.recent if i > floor}

    def _refold(self, entry: _Folded, execution_id: int) -> _Folded:
        state = ExecutionState(entry.state.playbook, execution_id)
        events = self.store.events(execution_id, types=FOLDED_TYPES)
        for event in events:
            state.apply(event)
        last = events[-1].event_id if events else 0
        return _Folded(entry.playbook_text, state, last, exact=True)


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


def create_local_app(
    store: Store, *, secret: str, hosts: Iterable[str], prewarm: int = 4
) -> FastAPI:
    """The `flowtide ui` app over `store`, its only token `secret`, answering only
    requests whose Host is one of `hosts`. The `prewarm` newest executions are folded in
    a background thread from the start: the run a user just made is the one they open
    first, and a long one takes seconds to fold."""
    folds = FoldCache(store)
    if prewarm:
        threading.Thread(
            target=folds.prewarm, args=(prewarm,), name="flowtide-ui-prewarm", daemon=True
        ).start()
    auth = LocalAuthenticator(secret, getpass.getuser())
    router = APIRouter()

    @router.get("/api/whoami")
    async def whoami() -> dict[str, Any]:
        """The local user (every right over the local store)."""
        p = auth.principal
        return {"name": p.name, "role": p.role, "pool": p.pool, "subject": p.subject}

    @router.post("/api/session")
    async def open_session(body: SessionRequest, request: Request) -> JSONResponse:
        """Sign the browser in with the token `flowtide ui` printed."""
        principal = await auth.authenticate(f"Bearer {body.token}")
        return signed_in(principal, body.token, request)

    @router.delete("/api/session")
    async def close_session(request: Request) -> JSONResponse:
        return signed_out(request)

    @router.get("/api/executions")
    async def list_executions(
        status: Annotated[Text | None, Query(max_length=64)] = None,
        limit: Annotated[int, Query(ge=0, le=1000)] = 50,
        before: IdQuery = None,
    ) -> dict[str, Any]:
        """The local store's executions newest first (keyset: `before`)."""
        rows = await asyncio.to_thread(
            lambda: store.list_executions(status=status, limit=limit, before_id=before)
        )
        items = [execution_item(r) for r in rows]
        last = items[-1]["execution_id"] if len(items) == limit and items else None
        return {"items": items, "next_before": last, "unavailable_shards": []}

    @router.get("/api/executions/{execution_id}")
    async def get_execution(execution_id: IdPath) -> dict[str, Any]:
        row, state = await asyncio.to_thread(folds.state, execution_id)
        doc: dict[str, Any] = mask_value(execution_document(state), state.secrets)
        doc["playbook"] = row.playbook_path or row.playbook_file
        return doc

    @router.get("/api/executions/{execution_id}/summary")
    async def get_summary(execution_id: IdPath) -> dict[str, Any]:
        row, state = await asyncio.to_thread(folds.state, execution_id)
        return summary_document(state, row)

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
        execution_id: IdPath,
        after: IdQuery = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> list[dict[str, Any]]:
        def read() -> tuple[list[Any], frozenset[str]]:
            _, state = folds.state(execution_id)
            return store.events(execution_id, after_event_id=after, limit=limit), state.secrets

        events, secrets = await asyncio.to_thread(read)
        return [event_document(e, secrets) for e in events]

    @router.post("/api/executions/{execution_id}/cancel")
    async def cancel(execution_id: IdPath, body: CancelRequest) -> JSONResponse:
        """Refused (409): an embedded execution runs in the process that started it."""
        row = await asyncio.to_thread(store.get_execution, execution_id)
        if row.status in TERMINAL:
            return error_response(409, f"execution {execution_id} is {row.status} already")
        return error_response(
            409,
            f"execution {execution_id} runs in the `flowtide run` process that started it:"
            " stop it there (Ctrl-C); `flowtide resume` continues it later",
        )

    app = FastAPI(
        title="flowtide ui",
        description="The web UI over the embedded store (`flowtide ui`).",
        version="1",
        dependencies=[Depends(authorize)],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_middleware(Gate, authenticator=lambda: auth)
    app.add_middleware(HostCheck, hosts=hosts)
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(pages.router)
    return app
