"""The API's OpenAPI document (`/openapi.json`), made to say what the server does, so a
client generated from it, or schemathesis reading it, is not surprised.

FastAPI's own document falls short in four ways, each mended here:

1. Integer bounds come out as floats (its `Schema` model types them `float`): `le=2**63-1`
   is written `9.223372036854776e+18`, which is 2**63, so a client that trusts the
   document sends an id the server refuses. Integer bounds are written back as integers
   (`_exact_integers`).
2. What the Gate and `authorize` answer is not in it: every operation that needs a
   credential documents 401 (with its `WWW-Authenticate` header) and 403; public ones
   declare no security. The rules are read from `flowtide.web.access.RULES`, so a new
   route documents them without anyone remembering to.
3. Errors are `ErrorDocument`s (flowtide.web.problems), not FastAPI's
   `HTTPValidationError`; a body may be refused as unparsable (400) or too large (413).
4. An optional parameter (`x: int | None = None`) is written as nullable, but a query or
   header cannot carry a null: left out is how it is not given (`_not_nullable`).

What a route answers beyond that (404, 409, ...) it declares itself, with
`problem_responses`. `documented_methods` gives the `Allow` header of a 405 from the same
table (`RULES`, which a test keeps equal to the app's routes).
"""

from __future__ import annotations

import re
from typing import Any, Final

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.routing import compile_path

from flowtide.web.access import RULES
from flowtide.web.fields import INT64_MAX
from flowtide.web.problems import ErrorDocument, problem_responses

__all__ = ["documented_methods", "install_openapi", "openapi_document"]

_ERROR_REF: Final = "#/components/schemas/ErrorDocument"
_FASTAPI_ERRORS: Final = ("HTTPValidationError", "ValidationError")
_BOUNDS: Final = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
#: Below this a float holds every integer exactly.
_EXACT: Final = 2**53
#: `{catalog_id:path}` as declared is `{catalog_id}` in the document.
_CONVERTOR: Final = re.compile(r"\{(\w+):\w+\}")
#: (method, path as documented) -> its access rule.
_DOCUMENTED: Final = {(m, _CONVERTOR.sub(r"{\1}", p)): rule for (m, p), rule in RULES.items()}
#: (path regex, number of path parameters, method) of every route.
_MATCHERS: Final = [
    (regex, len(convertors), method)
    for (method, path) in RULES
    for regex, _, convertors in [compile_path(path)]
]


def install_openapi(app: FastAPI, *, public_metrics: bool = False) -> None:
    """Serve `openapi_document` as the app's `/openapi.json` (built once)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document(app, public_metrics=public_metrics)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def openapi_document(app: FastAPI, *, public_metrics: bool = False) -> dict[str, Any]:
    """The document of `app`'s routes (see the module's docstring for what it adds).

    Raises:
        ValueError: an integer bound that a float cannot carry exactly, other than the
            int64 limits (declare it with a smaller bound, or as an id type).
    """
    doc = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        description=app.description,
        routes=app.routes,
    )
    _exact_integers(doc)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    error_schema = ErrorDocument.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, schema in error_schema.pop("$defs", {}).items():
        schemas.setdefault(name, schema)
    schemas.setdefault("ErrorDocument", error_schema)

    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            rule = _DOCUMENTED.get((method.upper(), path))
            public = rule is not None and rule.public
            if path == "/metrics" and public_metrics:
                public = True
            _document_operation(operation, public=public)
    for name in _FASTAPI_ERRORS:
        schemas.pop(name, None)
    return doc


def documented_methods(path: str) -> set[str]:
    """The methods the API has for a request path (the `Allow` of a 405). As in OpenAPI,
    a concrete path wins over a template that also matches it: /api/catalog/register
    is POST only, though GET /api/catalog/{path:path} would match it too."""
    matched: dict[int, set[str]] = {}
    for regex, params, method in _MATCHERS:
        if regex.match(path):
            matched.setdefault(params, set()).add(method)
    return matched[min(matched)] if matched else set()


def _document_operation(operation: dict[str, Any], *, public: bool) -> None:
    for parameter in operation.get("parameters", []):
        _not_nullable(parameter.get("schema", {}))
    responses: dict[str, Any] = operation.setdefault("responses", {})
    for response in responses.values():
        for media in response.get("content", {}).values():
            ref = media.get("schema", {}).get("$ref", "")
            if ref.rsplit("/", 1)[-1] in _FASTAPI_ERRORS:
                media["schema"] = {"$ref": _ERROR_REF}
    added: list[int] = []
    if public:
        operation.pop("security", None)
    else:
        # A route without a rule is refused to everyone (403): it needs both as well.
        added += [401, 403]
    if "requestBody" in operation:
        added += [400, 413, 422]
    for status, response in problem_responses(*added).items():
        if str(status) in responses:
            continue
        doc: dict[str, Any] = {
            "description": response["description"],
            "content": {"application/json": {"schema": {"$ref": _ERROR_REF}}},
        }
        if status == 401:
            doc["headers"] = {
                "WWW-Authenticate": {
                    "description": "The scheme to authenticate with.",
                    "required": True,
                    "schema": {"type": "string"},
                }
            }
        responses[str(status)] = doc
    operation["responses"] = dict(sorted(responses.items()))


def _not_nullable(schema: dict[str, Any]) -> None:
    branches = schema.get("anyOf")
    if not branches:
        return
    kept = [branch for branch in branches if branch.get("type") != "null"]
    if len(kept) == 1:
        del schema["anyOf"]
        schema.update(kept[0])
    else:
        schema["anyOf"] = kept


def _exact_integers(node: Any) -> None:
    """Write the float bounds of integer schemas in `node` (in place) as integers."""
    if isinstance(node, list):
        for item in node:
            _exact_integers(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "integer":
        for key in _BOUNDS:
            value = node.get(key)
            if isinstance(value, float):
                node[key] = _as_integer(key, value)
                if node[key] == INT64_MAX:
                    node.setdefault("format", "int64")
    for value in node.values():
        _exact_integers(value)


def _as_integer(key: str, value: float) -> int:
    if value.is_integer() and abs(value) < _EXACT:
        return int(value)
    # 2**63 - 1 and 2**63 are the same double: the int64 limit is the only bound this
    # large that the API declares, so that is what it was.
    if key == "maximum" and value == float(INT64_MAX):
        return INT64_MAX
    if key == "minimum" and value == -float(INT64_MAX + 1):
        return -INT64_MAX - 1
    raise ValueError(f"integer bound {key}={value!r} is not exact as a float")
