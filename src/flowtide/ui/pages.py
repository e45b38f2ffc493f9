"""The web UI's page and its assets, for both apps that serve it (`flowtide server` and
`flowtide ui`).

The UI is a static single-page app (`static/`, no build step) that reads the same JSON
API as every other client. The page and its assets are public: they hold no data; a
browser signs in to the API as `flowtide.web.session` says. Pages are served with a
Content-Security-Policy that allows this origin's scripts and styles only: no inline
script, nothing from elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from flowtide.errors import NotFoundError

__all__ = ["STATIC_DIR", "page_headers", "router"]

STATIC_DIR: Final = Path(__file__).resolve().parent / "static"

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
