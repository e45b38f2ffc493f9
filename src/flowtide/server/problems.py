"""The API's error replies: `{"error": {"status", "message", ...}}`, one format for all."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from flowtide.redaction import known, mask_text

__all__ = ["error_response", "field_error"]


def error_response(status: int, message: str, **extra: Any) -> JSONResponse:
    # An error may quote data (a store's or a tool's message): masked with every secret
    # this process knows.
    message = mask_text(message, known())
    return JSONResponse({"error": {"status": status, "message": message, **extra}}, status)


def field_error(field: str, message: str, status: int = 422) -> JSONResponse:
    """An error about one field of the request, named in `fields` too."""
    return error_response(
        status, f"{field}: {message}", fields=[{"field": field, "message": message}]
    )
