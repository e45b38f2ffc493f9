"""How the API answers exceptions: those of the layers below (flowtide's own, FastAPI's
validation errors, Starlette's HTTP errors) become `ErrorDocument`s
(`install_error_handlers`), and an item of a batch reply gets the status and error it
would have got as its own request (`batch_item`). `problem` is the one place where
flowtide's errors meet their HTTP statuses."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from flowtide.errors import (
    AuthError,
    ClaimConflict,
    ExecutionFinished,
    FlowtideError,
    NatsError,
    NotFoundError,
    StoreError,
)
from flowtide.kv.errors import KVError
from flowtide.redaction import known, mask_text
from flowtide.web.openapi import documented_methods
from flowtide.web.problems import RequestError, error_response

__all__ = ["batch_item", "install_error_handlers", "problem"]

log = logging.getLogger("flowtide.server")


#: "shard I: " in a cluster of several shards (set by the runtime): a database error
#: says whose database it is.
_where = ""


def serving_shard(index: int, count: int) -> None:
    """This process serves shard `index` of `count` (its 503s name the shard)."""
    global _where
    _where = f"shard {index}: " if count > 1 else ""


def problem(exc: BaseException) -> tuple[int, str, dict[str, Any]]:
    """How the API answers an error: (HTTP status, message, members the error document
    carries besides). A route that says more (a field, its own words) keeps the status
    it gives here.

        RequestError         its `status` (a route's own refusal)
        AuthError            401 or 403 (its `status`)
        NotFoundError        404
        ClaimConflict        409, with `holder`
        ExecutionFinished    409, with `execution_status`
        StoreError           503 (the database is unavailable)
        KVError, NatsError   503 (loop state or NATS unavailable: a node down, an election)
        other FlowtideError  422
        anything else        500
    """
    if isinstance(exc, RequestError):
        return exc.status, exc.message, dict(exc.extra)
    if isinstance(exc, AuthError):
        return exc.status, exc.message, {}
    if isinstance(exc, NotFoundError):
        return 404, str(exc), {}
    if isinstance(exc, ClaimConflict):
        return 409, str(exc), {"holder": exc.holder}
    if isinstance(exc, ExecutionFinished):
        return 409, str(exc), {"execution_status": exc.status}
    if isinstance(exc, StoreError):
        if _where and not str(exc).startswith("shard "):
            return 503, f"{_where}store unavailable: {exc}", {}
        return 503, f"store unavailable: {exc}", {}
    if isinstance(exc, KVError):
        return 503, f"loop state unavailable: {exc}", {}
    if isinstance(exc, NatsError):
        return 503, str(exc), {}
    if isinstance(exc, FlowtideError):
        return 422, str(exc), {}
    return 500, f"{type(exc).__name__}: {exc}", {}


def batch_item(outcome: Any, ok: dict[str, Any]) -> dict[str, Any]:
    """One entry of a batch reply: `ok` merged into a result, or the error an exception
    would have answered as its own request (code 5xx: not done, may be sent again)."""
    if not isinstance(outcome, BaseException):
        return {**ok, **outcome}
    status, message, extra = problem(outcome)
    if not isinstance(outcome, FlowtideError):
        log.exception("batch item failed", exc_info=outcome)
    return {"code": status, "error": {"message": mask_text(message, known()), **extra}}


async def _problem(request: Request, exc: Exception) -> JSONResponse:
    status, message, extra = problem(exc)
    return error_response(status, message, **extra)


async def _auth_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthError)
    response = await _problem(request, exc)
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


def install_error_handlers(app: FastAPI) -> None:
    """Answer flowtide's, FastAPI's and Starlette's exceptions as `ErrorDocument`s."""
    app.add_exception_handler(AuthError, _auth_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _bad_request)
    # (A NotFoundError is a StoreError: the handler of its own class is the one taken.)
    for error in (RequestError, NotFoundError, ClaimConflict, ExecutionFinished, StoreError):
        app.add_exception_handler(error, _problem)
