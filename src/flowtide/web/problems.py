"""The API's error replies: `{"error": {"status", "message", ...}}`, one format for all,
and its description in the OpenAPI document (`ErrorDocument`, `problem_responses`).

A route refuses a request by raising `RequestError` (its status, message and the members
the document carries besides); the app's handler answers it (`flowtide.web.errors`)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from flowtide.errors import FlowtideError
from flowtide.redaction import known, mask_text

__all__ = [
    "ErrorDocument",
    "RequestError",
    "error_response",
    "problem_responses",
]


class RequestError(FlowtideError):
    """A route's refusal of a request: the HTTP `status`, the `message` and what the
    error document carries besides (`extra`: a `field`, `fields`, `execution_status`...).
    Raised, never returned."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra

    @classmethod
    def of_field(cls, field: str, message: str, status: int = 422) -> RequestError:
        """About one field of the request, named in `fields` too."""
        return cls(status, f"{field}: {message}", fields=[{"field": field, "message": message}])


class FieldProblem(BaseModel):
    """What is wrong with one field of the request (and, for a playbook, where)."""

    model_config = ConfigDict(extra="allow")

    field: str
    message: str


class Problem(BaseModel):
    # Extra members carry what a client may act on: `holder` of a claim conflict,
    # `execution_status` of a finished execution, a playbook problem's `field`.
    model_config = ConfigDict(extra="allow")

    status: int = Field(description="The HTTP status, repeated.")
    message: str
    fields: list[FieldProblem] | None = Field(
        None, description="Each field of the request that was refused (422, 400)."
    )


class ErrorDocument(BaseModel):
    """Every error reply of the API."""

    model_config = ConfigDict(extra="allow")

    error: Problem


#: What a status means when a route says nothing more specific.
_MEANING: dict[int, str] = {
    400: "The request is malformed.",
    401: "No credential, or one that does not verify.",
    403: "The caller's role or identity may not do this.",
    404: "Not found.",
    409: "Conflict with the current state.",
    413: "The request body is larger than the server's --max-body.",
    422: "A field of the request is invalid (named in `fields`).",
    503: "A dependency of the server (database, vault, NATS) is unavailable.",
}


def problem_responses(*statuses: int | tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """`responses=` of a route: each status answered with an `ErrorDocument`, described
    by its usual meaning or, given as `(status, description)`, in the route's words."""
    out: dict[int | str, dict[str, Any]] = {}
    for item in statuses:
        status, description = item if isinstance(item, tuple) else (item, _MEANING[item])
        out[status] = {"model": ErrorDocument, "description": description}
    return out


def error_response(status: int, message: str, **extra: Any) -> JSONResponse:
    # An error may quote data (a store's or a tool's message): masked with every secret
    # this process knows.
    message = mask_text(message, known())
    return JSONResponse({"error": {"status": status, "message": message, **extra}}, status)


class TextSafeJSON(JSONResponse):
    """The apps' JSON answers (`default_response_class` of both): never a 500 for text
    that UTF-8 cannot encode. Such text is refused where it enters (`flowtide.storable`);
    anything older that holds it is written with ASCII escapes, which JSON allows."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(
                content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
            ).encode("ascii")
