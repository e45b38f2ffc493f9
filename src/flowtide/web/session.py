"""Signing a browser in to the API, for both apps that serve the web UI (the server and
`flowtide ui`), and who the caller is.

A browser signs in by posting a token to `POST /api/session`; the app verifies it as a
bearer token, refuses a worker's (403), and opens a session of its own
(`flowtide.auth.sessions`): a random id, kept in an HttpOnly, SameSite=Strict cookie
(Secure over HTTPS, Path=/) that the Gate (`flowtide.web.access`) takes where a request
has no Authorization header. The token is never in the cookie, and a token put there is
refused. The session ends at sign-out (`DELETE /api/session` deletes it: the same cookie
then gets 401), after its lifetime or idle time (FLOWTIDE_SESSION_LIFETIME,
FLOWTIDE_SESSION_IDLE), and when its token is revoked. A request that changes something
and is authenticated by the cookie must also carry `X-Flowtide-CSRF: 1`, a header no
other site's page can make a browser send (no CORS is allowed), so a forged form or
image cannot act as the user.

The server keeps sessions in its cluster database (every server takes them); `flowtide
ui` in its memory (its one token is made at start, so they could not outlive it).

The app keeps what verifies tokens and sessions in `app.state.authenticator` (a
callable: None while a server starts) and its read port in `app.state.reads`.
"""

from __future__ import annotations

from typing import Annotated, NotRequired

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from typing_extensions import TypedDict

from flowtide.auth.principal import Principal
from flowtide.errors import AuthError
from flowtide.web.access import SESSION_COOKIE, caller, cookie_token
from flowtide.web.fields import RequestBody
from flowtide.web.problems import problem_responses
from flowtide.web.reads import ExecutionReads, reads_of

__all__ = [
    "SessionRequest",
    "Whoami",
    "router",
    "signed_in",
    "signed_out",
]


class SessionRequest(RequestBody):
    token: str = Field(min_length=1, max_length=16_384, description="An API token or a JWT.")


def signed_in(
    principal: Principal, session_id: str, lifetime: float, request: Request
) -> JSONResponse:
    """The reply to `POST /api/session` once a session is open for `principal`: who it
    is, and the session's id in the browser's cookie for the session's `lifetime`."""
    reply = JSONResponse({"name": principal.name, "role": principal.role})
    reply.set_cookie(
        SESSION_COOKIE,
        session_id,
        max_age=max(1, int(lifetime)),
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return reply


def signed_out(request: Request) -> JSONResponse:
    """The reply to `DELETE /api/session`: the cookie cleared."""
    reply = JSONResponse({"signed_out": True})
    reply.delete_cookie(
        SESSION_COOKIE,
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return reply


class Whoami(TypedDict):
    name: str
    role: str
    pool: str | None
    subject: str
    #: The app runs executions in its own process (`flowtide ui` only: true).
    local: NotRequired[bool]


router = APIRouter()


@router.post(
    "/api/session",
    tags=["ui"],
    responses=problem_responses(
        (401, "The token is invalid, expired or revoked."),
        (403, "A worker's token: workers cannot sign in to the UI."),
    ),
)
async def open_session(body: SessionRequest, request: Request) -> JSONResponse:
    """Sign a browser in: the token is verified as an `Authorization: Bearer` one would
    be, then a session is opened and its random id (never the token) kept in an HttpOnly
    cookie (`flowtide_session`, SameSite=Strict, Secure over HTTPS) that the API takes
    in its place. A request that changes something must also send `X-Flowtide-CSRF: 1`.
    Answers who the token is."""
    auth = request.app.state.authenticator()
    if auth is None:
        raise AuthError("server is starting", status=503)
    principal = await auth.authenticate(f"Bearer {body.token}")
    session_id, lifetime = await auth.open_session(principal, body.token)
    return signed_in(principal, session_id, lifetime, request)


@router.delete("/api/session", tags=["ui"])
async def close_session(request: Request) -> JSONResponse:
    """Sign a browser out: its session ends (the same cookie is refused from now on) and
    the cookie is cleared. The token it signed in with stays valid."""
    session_id = cookie_token(request.headers.get("cookie", "").encode("latin-1", "replace"))
    auth = request.app.state.authenticator()
    if session_id is not None and auth is not None:
        await auth.sessions.close(session_id)
    return signed_out(request)


@router.get("/api/whoami")
async def whoami(
    who: Annotated[Principal, Depends(caller)],
    reads: Annotated[ExecutionReads, Depends(reads_of)],
) -> Whoami:
    """The caller as the app authenticated it: name, role and pool."""
    doc: Whoami = {"name": who.name, "role": who.role, "pool": who.pool, "subject": who.subject}
    if reads.local:
        doc["local"] = True
    return doc
