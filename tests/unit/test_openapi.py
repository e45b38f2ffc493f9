"""The API's OpenAPI document keeps its contract as routes come and go: integer bounds
are integers, every route that needs a credential says it may answer 401 and 403, and
errors are documented as the error documents the server sends. And the request types
behind it: strict bodies, ids as integers or their digits, text a database can store.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from flowtide.server.api_vars import VariableBody
from flowtide.server.app import ClaimRequest, PoolRegister, ServerSettings, create_app
from flowtide.web.access import RULES
from flowtide.web.fields import INT64_MAX, id_pattern
from flowtide.web.openapi import (
    _as_integer,
    _exact_integers,
    _not_nullable,
    documented_methods,
)

_ERROR = "#/components/schemas/ErrorDocument"


def _app(**settings: Any) -> FastAPI:
    # Building the app and its document starts nothing: no database is reached.
    return create_app(ServerSettings(db="postgresql://unused", **settings))


def _document(**settings: Any) -> dict[str, Any]:
    return _app(**settings).openapi()


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return _document()


def _schemas(node: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _schemas(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _schemas(value, f"{where}/{i}")


def _operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield method.upper(), path, operation


def test_integer_fields_have_integer_bounds(doc: dict[str, Any]) -> None:
    seen = 0
    for where, schema in _schemas(doc):
        # Keywords pydantic writes when it cannot place a bound (a union's branch).
        assert not {"ge", "le", "gt", "lt"} & set(schema), where
        if schema.get("type") != "integer":
            continue
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if key in schema:
                seen += 1
                assert type(schema[key]) is int, (where, key, schema[key])
    assert seen > 50
    # The ids' bound is the int64 limit itself, not the double next to it.
    text = str(doc)
    assert "9.223372036854776e+18" not in text
    assert str(INT64_MAX) in text


def test_every_operation_that_needs_a_credential_documents_401_and_403(
    doc: dict[str, Any],
) -> None:
    # The document writes `{path:path}` as `{path}`; the rules are keyed as declared
    # (and tests/distributed/test_access.py holds them equal to the app's routes).
    rules = {(m, re.sub(r"\{(\w+):\w+\}", r"{\1}", p)): rule for (m, p), rule in RULES.items()}
    assert len(rules) == len(RULES)
    for method, path, operation in _operations(doc):
        rule = rules[(method, path)]
        responses = operation["responses"]
        if rule.public:
            assert "security" not in operation, (method, path)
            # Signing in to the UI answers 401 for a token that does not verify, a
            # webhook's delivery for a signature that does not.
            if (method, path) not in {("POST", "/api/session"), ("POST", "/api/hooks/{name}")}:
                assert "401" not in responses, (method, path)
            continue
        assert operation["security"] == [{"HTTPBearer": []}], (method, path)
        for status in ("401", "403"):
            assert status in responses, (method, path, status)
            content = responses[status]["content"]["application/json"]
            assert content["schema"] == {"$ref": _ERROR}, (method, path, status)
        assert "WWW-Authenticate" in responses["401"]["headers"]


def test_public_metrics_are_documented_as_public() -> None:
    metrics = _document(public_metrics=True)["paths"]["/metrics"]["get"]
    assert "security" not in metrics and "401" not in metrics["responses"]
    assert list(metrics["responses"]["200"]["content"]) == ["text/plain"]


def test_errors_are_error_documents(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    for method, path, operation in _operations(doc):
        for status, response in operation["responses"].items():
            if status.startswith(("2", "3")) or path == "/readyz":
                continue
            content = response.get("content", {})
            assert content, (method, path, status)
            assert content["application/json"]["schema"] == {"$ref": _ERROR}, (method, path)
        if "requestBody" in operation:
            assert {"400", "413", "422"} <= set(operation["responses"]), (method, path)


def test_optional_parameters_are_not_nullable(doc: dict[str, Any]) -> None:
    for method, path, operation in _operations(doc):
        for parameter in operation.get("parameters", []):
            assert '"null"' not in str(parameter["schema"]).replace("'", '"'), (method, path)


def test_a_float_bound_is_written_back_exactly_or_refused() -> None:
    node = {
        "type": "integer",
        "minimum": 0.0,
        "maximum": float(INT64_MAX),
        "anyOf": [{"type": "integer", "maximum": 10.0}, {"type": "number", "maximum": 1.5}],
    }
    _exact_integers(node)
    assert node["minimum"] == 0 and type(node["minimum"]) is int
    assert node["maximum"] == INT64_MAX and node["format"] == "int64"
    assert node["anyOf"] == [{"type": "integer", "maximum": 10}, {"type": "number", "maximum": 1.5}]
    with pytest.raises(ValueError, match="not exact"):
        _as_integer("maximum", float(2**60))


def test_not_nullable_keeps_the_other_branches() -> None:
    one = {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "X"}
    _not_nullable(one)
    assert one == {"type": "integer", "title": "X"}
    two = {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}
    _not_nullable(two)
    assert two == {"anyOf": [{"type": "integer"}, {"type": "string"}]}


def test_the_id_pattern_holds_exactly_the_int64_ids() -> None:
    pattern = re.compile(id_pattern(0))
    rng = random.Random(7)
    for value in [0, 1, 9, 10, INT64_MAX - 1, INT64_MAX, 10**18, 9_199_999_999_999_999_999]:
        assert pattern.fullmatch(str(value)), value
    for value in [INT64_MAX + 1, 9_300_000_000_000_000_000, 10**19, 2**64]:
        assert not pattern.fullmatch(str(value)), value
    for _ in range(20_000):
        value = rng.randrange(0, 2**64)
        assert bool(pattern.fullmatch(str(value))) == (value <= INT64_MAX), value
    for text in ["", "01", "-1", "+1", " 1", "1_000", "1.0", "١"]:
        assert not pattern.fullmatch(text), text
    positive = re.compile(id_pattern(1))
    assert not positive.fullmatch("0") and positive.fullmatch("1")


def _claim(**fields: Any) -> ClaimRequest:
    return ClaimRequest.model_validate(
        {"worker_id": "w1", "execution_id": 1, "command_id": 2, **fields}
    )


def test_ids_are_integers_or_their_digits() -> None:
    assert _claim(execution_id="9223372036854775807").execution_id == INT64_MAX
    assert _claim(execution_id=7.0).execution_id == 7
    for bad in [True, False, "9223372036854775808", "0x10", " 1", 1.5, 2.0**60, -1, None]:
        with pytest.raises(ValidationError):
            _claim(execution_id=bad)


def test_a_boolean_is_not_an_integer() -> None:
    # The issue's `pid: false`: read as pid 0 before bodies were strict.
    base = {"worker_id": "w1", "pool": "default"}
    for field, value in [("pid", False), ("pid", True), ("concurrency", True), ("pid", "12")]:
        with pytest.raises(ValidationError) as info:
            PoolRegister.model_validate({**base, field: value})
        assert info.value.errors()[0]["loc"][0] == field
    assert PoolRegister.model_validate({**base, "pid": 12.0, "concurrency": 3}).pid == 12
    # worker.pid is a PostgreSQL integer: a larger one was a 503 from the database.
    with pytest.raises(ValidationError):
        PoolRegister.model_validate({**base, "pid": 2**31})


def test_text_a_database_cannot_store_is_refused() -> None:
    # Was a 503 ("PostgreSQL text fields cannot contain NUL") from the worker lookup.
    for worker_id in ["w\x00", "w\udc80"]:
        with pytest.raises(ValidationError) as info:
            _claim(worker_id=worker_id)
        assert info.value.errors()[0]["loc"] == ("worker_id",)
    # A value of any JSON type is stored as JSON (escaped): a NUL in it is data.
    assert VariableBody.model_validate({"value": "a\x00b"}).value == "a\x00b"


def test_allow_names_every_method_of_the_path() -> None:
    # Starlette's 405 named only the first route's: GET for /api/vars/1.
    assert documented_methods("/api/vars/1") == {"GET", "POST", "DELETE"}
    assert documented_methods("/api/keychain/a/b@2/token") == {"GET", "POST", "DELETE"}
    # A concrete path wins over a template matching it, as in OpenAPI.
    assert documented_methods("/api/catalog/register") == {"POST"}
    assert documented_methods("/api/catalog/a/b") == {"GET"}
    assert documented_methods("/api/commands/claim") == {"POST"}
    assert documented_methods("/nowhere") == set()
