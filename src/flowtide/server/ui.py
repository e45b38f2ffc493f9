"""Signing a browser in to the web UI the server serves (`flowtide.ui.pages` has the page,
its assets and how the session cookie works)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from flowtide.errors import AuthError
from flowtide.server.problems import problem_responses
from flowtide.server.runtime import RuntimeDep
from flowtide.ui.pages import SessionRequest, signed_in, signed_out

__all__ = ["router"]

router = APIRouter(tags=["ui"])


@router.post(
    "/api/session",
    responses=problem_responses((401, "The token is invalid, expired or revoked.")),
)
async def open_session(body: SessionRequest, request: Request, runtime: RuntimeDep) -> JSONResponse:
    """Sign a browser in: the token is verified as an `Authorization: Bearer` one would
    be, then kept in an HttpOnly cookie (`flowtide_session`, SameSite=Strict, Secure over
    HTTPS) that the API takes in its place. A request that changes something must also
    send `X-Flowtide-CSRF: 1`. Answers who the token is."""
    auth = runtime.auth
    if auth is None:
        raise AuthError("server is starting", status=503)
    principal = await auth.authenticate(f"Bearer {body.token}")
    return signed_in(principal, body.token, request)


@router.delete("/api/session")
async def close_session(request: Request) -> JSONResponse:
    """Sign a browser out (the cookie is cleared; the token itself stays valid)."""
    return signed_out(request)
