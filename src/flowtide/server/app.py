"""The HTTP API (FastAPI). Stateless: state lives in PostgreSQL (event log, commands,
outbox) and the KV (loop state); any process of any server answers any request.

This module composes the app: the routers that `flowtide ui` serves too (the executions
API, the catalog, the browser session: `flowtide.web`, over this server's read port
`flowtide.server.reads`), the server's own (one module each, `api_*`), the UI's page
(`flowtide.ui.pages`), authentication and authorisation (`flowtide.web.access`), the
error handlers (`flowtide.web.errors`) and the OpenAPI document (`flowtide.web.openapi`).
What a server process holds while it runs is its `Runtime` (`flowtide.server.runtime`),
which the routes reach through FastAPI dependencies. Configuration comes from
`ServerSettings` (the `flowtide server` command fills it from flags and FLOWTIDE_*
variables, so `uvicorn --workers N` processes share it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Final

from fastapi import Depends, FastAPI

from flowtide.errors import FlowtideError
from flowtide.server import (
    api_commands,
    api_credentials,
    api_executions,
    api_health,
    api_outbox,
    api_shards,
    api_tokens,
    api_vars,
    api_workers,
)
from flowtide.server.forwarding import Forwarder
from flowtide.server.reads import ServerReads
from flowtide.server.runtime import Runtime
from flowtide.server.schemas import ClaimRequest, PoolRegister
from flowtide.server.settings import ServerSettings
from flowtide.ui import pages
from flowtide.urls import redact_url
from flowtide.web import catalog, executions, hooks, schedules, session, subscriptions
from flowtide.web.access import Gate, authorize
from flowtide.web.errors import install_error_handlers
from flowtide.web.openapi import install_openapi
from flowtide.web.problems import TextSafeJSON
from flowtide.web.schedules import scheduling
from flowtide.web.subscriptions import listening

__all__ = ["ClaimRequest", "PoolRegister", "ServerSettings", "app_factory", "create_app"]

#: In the order their routes appear in the OpenAPI document.
_ROUTERS = (
    catalog.router,
    api_credentials.router,
    api_tokens.router,
    executions.router,
    api_executions.router,
    api_commands.router,
    api_workers.router,
    api_outbox.router,
    api_health.router,
    api_shards.router,
    api_vars.router,
    schedules.router,
    hooks.router,
    subscriptions.router,
    session.router,
    pages.router,
)


#: How a server process that cannot start exits (`flowtide server`'s invalid-input code).
EXIT_CODE_REFUSED: Final = 2


def _no_exit_trace(record: logging.LogRecord) -> bool:
    """uvicorn's log without the trace of a start refused on purpose (said in one line):
    Starlette hands uvicorn the failed start's trace as the text of its message."""
    if record.exc_info and record.exc_info[0] is SystemExit:
        return False
    text = str(record.msg)
    return not (text.startswith("Traceback") and f"SystemExit: {EXIT_CODE_REFUSED}" in text)


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI application; `settings` default to FLOWTIDE_* environment variables."""
    runtime = Runtime(settings or ServerSettings.from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await runtime.start()
        except FlowtideError as exc:
            # A refusal with its reason (NATS, settings, databases): one line, no trace.
            logging.getLogger("flowtide.server").error("cannot start: %s", exc)
            with contextlib.suppress(Exception):
                await runtime.stop()
            logging.getLogger("uvicorn.error").addFilter(_no_exit_trace)
            raise SystemExit(EXIT_CODE_REFUSED) from None
        try:
            if runtime.settings.scheduler:
                async with (
                    scheduling(app, app.state.reads),
                    listening(app, app.state.reads, lambda alias: runtime.vault().resolve(alias)),
                ):
                    yield
            else:
                yield
        finally:
            await runtime.stop()

    app = FastAPI(
        title="flowtide",
        default_response_class=TextSafeJSON,
        description="Runs NoETL-style playbooks: executions, events, commands, workers. "
        "Every endpoint but /healthz and /readyz needs `Authorization: Bearer <token>` "
        "(a flowtide API token or a JWT of the configured identity provider), or the "
        "session cookie `POST /api/session` sets for the web UI at /ui (then a request "
        "that changes something also sends `X-Flowtide-CSRF: 1`); what each role may "
        "call is in flowtide.web.access.",
        version="1",
        lifespan=lifespan,
        dependencies=[Depends(authorize)],
    )
    # Middleware added last runs first: authentication, then forwarding to the shard
    # that owns the request's execution (flowtide.server.forwarding).
    app.add_middleware(Forwarder, context=runtime.route_context)
    app.add_middleware(
        Gate,
        authenticator=lambda: runtime.auth,
        max_body=runtime.settings.max_body,
        public_metrics=runtime.settings.public_metrics,
    )
    install_error_handlers(app)
    for router in _ROUTERS:
        app.include_router(router)
    install_openapi(app, public_metrics=runtime.settings.public_metrics)

    app.state.runtime = runtime
    app.state.reads = ServerReads(runtime)
    app.state.authenticator = lambda: runtime.auth
    app.state.describe = lambda: {
        "db": runtime.store.dsn_display if runtime.store is not None else None,
        "nats": redact_url(runtime.settings.nats) if runtime.settings.nats else None,
    }
    return app


def app_factory() -> FastAPI:
    """For `uvicorn --factory flowtide.server.app:app_factory` (settings from env; with
    `--workers N`, point PROMETHEUS_MULTIPROC_DIR at an empty directory first, as
    `flowtide server` does, or /metrics shows one process's counters)."""
    return create_app()
