"""How the API answers exceptions: those of the layers below (flowtide's own, FastAPI's
validation errors, Starlette's HTTP errors) become `ErrorDocument`s
(`install_error_handlers`), and an item of a batch reply gets the status and error it
would have got as its own request (`batch_item`)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from flowtide.errors import AuthError, FlowtideError, NotFoundError, StoreError
from flowtide.redaction import known, mask_text
from flowtide.server.claims import ClaimConflict
from flowtide.server.openapi import documented_methods
from flowtide.server.problems import error_response

__all__ = ["batch_item", "install_error_handlers"]

log = logging.getLogger("flowtide.server")


def batch_item(outcome: Any, ok: dict[str, Any]) -> dict[str, Any]:
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


async def _auth_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthError)
    response = error_response(exc.status, exc.message)
    if exc.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="flowtide"'
    return response


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's own (404 and 405 of routing, 400 of an unreadable body) too: in the
    # API's error format, with their headers.
    assert isinstance(exc, HTTPException)
    response = error_response(exc.status_code, str(exc.detail))
    response.headers.update(exc.headers or {})
    if exc.status_code == 405:
        # Starlette names the methods of the first route that matched the path, but
        # a path has several (GET, POST and DELETE of /api/vars/{execution_id}).
        methods = documented_methods(request.scope["path"])
        if methods:
            response.headers["Allow"] = ", ".join(sorted(methods))
    return response


async def _bad_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    fields = [
        {
            "field": ".".join(str(p) for p in err["loc"] if p != "body") or "body",
            "message": err["msg"],
        }
        for err in exc.errors()
    ]
    first = fields[0] if fields else {"field": "body", "message": "invalid"}
    return error_response(422, f"{first['field']}: {first['message']}", fields=fields)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return error_response(404, str(exc))


async def _conflict(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ClaimConflict)
    return error_response(409, str(exc), holder=exc.holder)


async def _store_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(503, f"store unavailable: {exc}")


def install_error_handlers(app: FastAPI) -> None:
    """Answer flowtide's, FastAPI's and Starlette's exceptions as `ErrorDocument`s."""
    app.add_exception_handler(AuthError, _auth_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _bad_request)
    app.add_exception_handler(NotFoundError, _not_found)
    app.add_exception_handler(ClaimConflict, _conflict)
    app.add_exception_handler(StoreError, _store_error)
