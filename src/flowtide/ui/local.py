"""`flowtide ui`: the web UI over the embedded store (the SQLite file `flowtide run`
writes), so a user who never runs a server still sees their runs.

The same page (`flowtide.ui.pages`) reads the same API as on a server, served here by
the same routers (`flowtide.web`: the executions API, the catalog, webhooks, the browser
session)
over this app's read port (`flowtide.ui.reads`): this module only wires them. Nothing is
open because it is local: any process and any web page the user opens can reach a
loopback port, so the app takes a secret made at start (printed once, in the URL
`flowtide ui` shows, after a `#` so it never reaches a log) as its only token, behind the
server's own Gate (the session cookie, the CSRF header, body caps), and it answers only
requests whose Host is the address it listens on (a page of another site that rebinds
its DNS name to 127.0.0.1 sends its own name as Host).

A user can also start playbooks here (a catalog entry's run form, a re-run) and resume
an interrupted run: they run in this process (`flowtide.ui.reads.LocalReads`).
"""

from __future__ import annotations

import contextlib
import getpass
import hmac
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from pathlib import Path
from typing import Any, Final

from fastapi import Depends, FastAPI

from flowtide.auth.principal import Principal
from flowtide.errors import AuthError
from flowtide.home import find_home
from flowtide.runlock import run_locks_for
from flowtide.store.base import Store
from flowtide.ui import pages
from flowtide.ui.fold import FoldCache
from flowtide.ui.reads import LocalReads
from flowtide.web import catalog, executions, hooks, schedules, session, subscriptions
from flowtide.web.access import (
    OPERATOR,
    PUBLIC_REQUESTS,
    RULES,
    Authenticator,
    Gate,
    authorizer,
)
from flowtide.web.errors import install_error_handlers
from flowtide.web.problems import TextSafeJSON
from flowtide.web.schedules import scheduling
from flowtide.web.subscriptions import listening

__all__ = ["LOCAL_RULES", "LocalAuthenticator", "create_local_app", "local_hosts"]

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
    """ASGI middleware: only requests whose Host is one of `hosts` (DNS rebinding), but
    a webhook's delivery (`PUBLIC_REQUESTS`), which a tunnel may bring under its own
    name: its signature, not its origin, is what admits it, and an unknown hook answers
    as a bad signature does, so a rebound page learns nothing from it."""

    def __init__(
        self, app: Callable[[Scope, Receive, Send], Awaitable[None]], *, hosts: Iterable[str]
    ) -> None:
        self.app = app
        self.hosts = {h.lower().encode() for h in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not any(
            scope["method"] == method and pattern.fullmatch(scope["path"])
            for method, pattern in PUBLIC_REQUESTS
        ):
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


@contextlib.asynccontextmanager
async def _serving(app: FastAPI, reads: LocalReads, scheduler: bool) -> AsyncIterator[None]:
    """The app's lifespan: its runtime open, and its scheduler and the subscriptions'
    listeners running when asked."""
    async with reads.open():
        if scheduler:
            from flowtide.credentials import CredentialVault

            vault = CredentialVault(reads.store, reads.home)
            async with scheduling(app, reads), listening(app, reads, vault.resolve):
                yield
        else:
            yield


def create_local_app(
    store: Store,
    *,
    secret: str,
    hosts: Iterable[str],
    home: Path | None = None,
    prewarm: int = 4,
    scheduler: bool = True,
) -> FastAPI:
    """The `flowtide ui` app over `store`, its only token `secret`, answering only
    requests whose Host is one of `hosts`; runs started from the page use `home` (the
    state folder: credentials key, spark data). The `prewarm` newest executions are
    folded in a background thread from the start: the run a user just made is the one
    they open first, and a long one takes seconds to fold. With `scheduler`, the app
    fires the store's due schedules while it serves (`flowtide.web.schedules`)."""
    home = find_home(home).absolute()
    folds = FoldCache(store)
    if prewarm:
        threading.Thread(
            target=folds.prewarm, args=(prewarm,), name="flowtide-ui-prewarm", daemon=True
        ).start()
    auth = LocalAuthenticator(secret, getpass.getuser())
    reads = LocalReads(store, folds, home, run_locks_for(store, home))
    app = FastAPI(
        title="flowtide ui",
        default_response_class=TextSafeJSON,
        description="The web UI over the embedded store (`flowtide ui`).",
        version="1",
        dependencies=[Depends(authorizer(LOCAL_RULES))],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lambda app: _serving(app, reads, scheduler),
    )
    app.state.reads = reads
    app.state.authenticator = lambda: auth
    app.add_middleware(Gate, authenticator=lambda: auth)
    app.add_middleware(HostCheck, hosts=hosts)
    install_error_handlers(app)
    for router in (
        session.router,
        executions.router,
        executions.resume_router,
        catalog.router,
        schedules.router,
        hooks.router,
        subscriptions.router,
        pages.router,
    ):
        app.include_router(router)
    return app
