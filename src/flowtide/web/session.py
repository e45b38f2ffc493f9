"""Signing a browser in to the API, for both apps that serve the web UI (the server and
`flowtide ui`), and who the caller is.

A browser signs in by posting a token to `POST /api/session`; the app verifies it as a
bearer token and keeps it in an HttpOnly, SameSite=Strict cookie (Secure over HTTPS) for
`SESSION_SECONDS`, which the Gate (`flowtide.web.access`) takes where a request has no
Authorization header. A request that changes something and is authenticated by the
cookie must also carry `X-Flowtide-CSRF: 1`, a header no other site's page can make a
browser send (no CORS is allowed), so a forged form or image cannot act as the user.

The app keeps what verifies tokens in `app.state.authenticator` (a callable: None while
a server starts) and its read port in `app.state.reads`.
"""

from __future__ import annotations

from typing import Annotated, Final, NotRequired

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from typing_extensions import TypedDict

from flowtide.auth.principal import Principal
from flowtide.errors import AuthError
from flowtide.web.access import SESSION_COOKIE, caller
from flowtide.web.fields import RequestBody
from flowtide.web.problems import problem_responses
from flowtide.web.reads import ExecutionReads, reads_of

__all__ = [
    "SESSION_SECONDS",
    "SessionRequest",
    "Whoami",
    "router",
    "signed_in",
    "signed_out",
]

#: How long a browser stays signed in (the token's own expiry still applies).
SESSION_SECONDS: Final = 12 * 3600


class SessionRequest(RequestBody):
    token: str = Field(min_length=1, max_length=16_384, description="An API token or a JWT.")


def signed_in(principal: Principal, token: str, request: Request) -> JSONResponse:
    """The reply to `POST /api/session` once `token` verified as `principal`: who it is,
    and the token kept in the browser's session cookie."""
    reply = JSONResponse({"name": principal.name, "role": principal.role})
    reply.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=SESSION_SECONDS,
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return reply


def signed_out(request: Request) -> JSONResponse:
    """The reply to `DELETE /api/session`: the cookie cleared (the token stays valid)."""
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
    responses=problem_responses((401, "The token is invalid, expired or revoked.")),
)
async def open_session(body: SessionRequest, request: Request) -> JSONResponse:
    """Sign a browser in: the token is verified as an `Authorization: Bearer` one would
    be, then kept in an HttpOnly cookie (`flowtide_session`, SameSite=Strict, Secure over
    HTTPS) that the API takes in its place. A request that changes something must also
    send `X-Flowtide-CSRF: 1`. Answers who the token is."""
    auth = request.app.state.authenticator()
    if auth is None:
        raise AuthError("server is starting", status=503)
    principal = await auth.authenticate(f"Bearer {body.token}")
    return signed_in(principal, body.token, request)


@router.delete("/api/session", tags=["ui"])
async def close_session(request: Request) -> JSONResponse:
    """Sign a browser out (the cookie is cleared; the token itself stays valid)."""
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
