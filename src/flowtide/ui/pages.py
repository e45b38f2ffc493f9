"""The web UI's page, its assets and the browser session, for both apps that serve it
(`flowtide server` and `flowtide ui`).

The UI is a static single-page app (`static/`, no build step) that reads the same JSON
API as every other client. The page and its assets are public: they hold no data. A
browser signs in by posting a token to `POST /api/session`; the app verifies it as a
bearer token and keeps it in an HttpOnly, SameSite=Strict cookie (Secure over HTTPS) for
`SESSION_SECONDS`, which the Gate (`flowtide.server.access`) takes where a request has
no Authorization header. A request that changes something and is authenticated by the
cookie must also carry `X-Flowtide-CSRF: 1`, a header no other site's page can make a
browser send (no CORS is allowed), so a forged form or image cannot act as the user.
Pages are served with a Content-Security-Policy that allows this origin's scripts and
styles only: no inline script, nothing from elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from pydantic import Field

from flowtide.auth.principal import Principal
from flowtide.errors import NotFoundError
from flowtide.server.access import SESSION_COOKIE
from flowtide.server.fields import RequestBody

__all__ = [
    "SESSION_SECONDS",
    "STATIC_DIR",
    "SessionRequest",
    "page_headers",
    "router",
    "signed_in",
    "signed_out",
]

STATIC_DIR: Final = Path(__file__).resolve().parent / "static"
#: How long a browser stays signed in (the token's own expiry still applies).
SESSION_SECONDS: Final = 12 * 3600

_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}

_CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def page_headers() -> dict[str, str]:
    """What every UI response carries: the CSP, no sniffing, no referrer, no framing."""
    return {
        "Content-Security-Policy": _CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cache-Control": "no-cache",
    }


def _assets() -> dict[str, Path]:
    """The files the UI may serve, by name: what the package ships, nothing else (a
    name is looked up here, never joined to a path)."""
    if not STATIC_DIR.is_dir():
        return {}
    return {p.name: p for p in STATIC_DIR.iterdir() if p.is_file() and p.suffix in _TYPES}


_ASSETS: Final = _assets()

router = APIRouter(tags=["ui"])


@router.get("/", response_class=RedirectResponse, status_code=307)
async def root() -> RedirectResponse:
    """To the web UI (`/ui`)."""
    return RedirectResponse("/ui", status_code=307)


_PAGE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/html": {}}, "description": "The UI's page or an asset."}
}


@router.get("/ui", response_class=HTMLResponse, responses=_PAGE)
@router.get("/ui/{path:path}", response_class=HTMLResponse, responses=_PAGE)
async def page(path: str = "") -> Response:
    """The web UI: its single page for any path under /ui (the page routes itself by
    its URL), or one of its assets under /ui/static/. Public: neither holds data."""
    if path.startswith("static/"):
        asset = _ASSETS.get(path.removeprefix("static/"))
        if asset is None:
            raise NotFoundError(f"no UI asset {path!r}")
        return FileResponse(asset, media_type=_TYPES[asset.suffix], headers=page_headers())
    index = _ASSETS.get("index.html")
    if index is None:
        raise NotFoundError("this flowtide was installed without its UI")
    return FileResponse(index, media_type=_TYPES[".html"], headers=page_headers())


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
