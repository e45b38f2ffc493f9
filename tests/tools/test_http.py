"""HttpTool against a real uvicorn stub on 127.0.0.1 (see conftest.StubServer)."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from flowtide.errors import ToolError
from flowtide.tools import http as httpmod
from flowtide.tools.http import HttpTool


def run(config: dict[str, Any], ctx: Any) -> Any:
    return HttpTool().run({"kind": "http", **config}, ctx)


def error_of(config: dict[str, Any], ctx: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        run(config, ctx)
    return info.value


def test_get_json_result_shape(http_stub: Any, make_ctx: Any) -> None:
    result = run({"url": f"{http_stub.url}/json"}, make_ctx())
    assert result["status_code"] == 200
    assert result["data"] == {"message": "hello", "items": [1, 2, 3]}
    assert result["body"] == result["data"]
    assert result["url"] == f"{http_stub.url}/json"
    assert isinstance(result["elapsed"], float) and result["elapsed"] >= 0
    assert result["headers"]["content-type"] == "application/json"
    assert int(result["headers"]["content-length"]) > 0
    assert all(key == key.lower() for key in result["headers"])
    json.dumps(result)


def test_text_response_and_endpoint_alias(http_stub: Any, make_ctx: Any) -> None:
    result = run({"endpoint": f"{http_stub.url}/text", "method": "get"}, make_ctx())
    assert result["data"] == "plain text body"
    assert result["body"] == "plain text body"


def test_response_header_keys_are_lower_case(http_stub: Any, make_ctx: Any) -> None:
    result = run({"url": f"{http_stub.url}/headers"}, make_ctx())
    assert result["headers"]["x-custom-thing"] == "yes"


def test_empty_and_invalid_json(http_stub: Any, make_ctx: Any) -> None:
    assert run({"url": f"{http_stub.url}/empty-json"}, make_ctx())["data"] is None
    assert run({"url": f"{http_stub.url}/bad-json"}, make_ctx())["data"] == "{not json"


def test_params_and_headers(http_stub: Any, make_ctx: Any) -> None:
    result = run(
        {
            "url": f"{http_stub.url}/echo",
            "params": {"page": 2, "flag": True, "skip": None, "q": "a b"},
            "headers": {"X-Trace": "abc", "X-Num": 5},
        },
        make_ctx(),
    )
    echoed = result["data"]
    assert echoed["query"] == {"page": "2", "flag": "true", "q": "a b"}
    assert echoed["headers"]["x-trace"] == "abc"
    assert echoed["headers"]["x-num"] == "5"
    assert echoed["headers"]["user-agent"].startswith("flowtide/")


@pytest.mark.parametrize("key", ["json", "payload", "body"])
def test_mapping_bodies_are_json(http_stub: Any, make_ctx: Any, key: str) -> None:
    result = run(
        {"url": f"{http_stub.url}/echo", "method": "POST", key: {"a": 1, "b": [True, None]}},
        make_ctx(),
    )
    echoed = result["data"]
    assert echoed["method"] == "POST"
    assert echoed["headers"]["content-type"] == "application/json"
    assert json.loads(echoed["body"]) == {"a": 1, "b": [True, None]}


def test_string_body_is_sent_as_is(http_stub: Any, make_ctx: Any) -> None:
    result = run(
        {
            "url": f"{http_stub.url}/echo",
            "method": "PUT",
            "body": "<xml>raw</xml>",
            "headers": {"Content-Type": "application/xml"},
        },
        make_ctx(),
    )
    assert result["data"]["body"] == "<xml>raw</xml>"
    assert result["data"]["headers"]["content-type"] == "application/xml"


@pytest.mark.parametrize("key", ["data", "form"])
def test_form_bodies(http_stub: Any, make_ctx: Any, key: str) -> None:
    result = run(
        {
            "url": f"{http_stub.url}/echo",
            "method": "POST",
            key: {"grant_type": "client_credentials", "scope": "read write"},
        },
        make_ctx(),
    )
    echoed = result["data"]
    assert echoed["headers"]["content-type"] == "application/x-www-form-urlencoded"
    assert echoed["body"] == "grant_type=client_credentials&scope=read+write"


def test_data_with_json_content_type_is_json(http_stub: Any, make_ctx: Any) -> None:
    result = run(
        {
            "url": f"{http_stub.url}/echo",
            "method": "POST",
            "headers": {"Content-Type": "application/json"},
            "data": {"code": "xyz"},
        },
        make_ctx(),
    )
    assert json.loads(result["data"]["body"]) == {"code": "xyz"}


def test_get_payload_becomes_query(http_stub: Any, make_ctx: Any) -> None:
    result = run(
        {"url": f"{http_stub.url}/echo", "payload": {"page": 3}, "params": {"size": 10}},
        make_ctx(),
    )
    assert result["data"]["query"] == {"page": "3", "size": "10"}
    assert result["data"]["body"] == ""


def test_rate_limit(http_stub: Any, make_ctx: Any) -> None:
    error = error_of({"url": f"{http_stub.url}/status/429"}, make_ctx())
    assert error.kind == "rate_limit"
    assert error.retryable is True
    assert error.code == "HTTP_429"
    assert error.http_status == 429
    assert error.data["status_code"] == 429
    assert error.data["retry_after"] == 7
    assert error.data["data"] == {"error": "status 429"}
    assert error.data["body"] == error.data["data"]
    assert "retry after 7 s" in error.message
    assert error.to_dict()["status"] == 429


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (500, "server_error", True),
        (502, "server_error", True),
        (503, "server_error", True),
        (401, "auth", False),
        (403, "auth", False),
        (404, "not_found", False),
        (400, "client_error", False),
        (422, "client_error", False),
    ],
)
def test_status_kinds(
    http_stub: Any, make_ctx: Any, status: int, kind: str, retryable: bool
) -> None:
    error = error_of({"url": f"{http_stub.url}/status/{status}"}, make_ctx())
    assert (error.kind, error.retryable) == (kind, retryable)
    assert error.code == f"HTTP_{status}"
    assert error.http_status == status
    assert error.data["status_code"] == status
    assert str(status) in error.message


def test_503_reports_retry_after(http_stub: Any, make_ctx: Any) -> None:
    error = error_of({"url": f"{http_stub.url}/status/503"}, make_ctx())
    assert error.data["retry_after"] == 3


@pytest.mark.parametrize("key", ["timeout", "timeout_seconds"])
def test_timeout(http_stub: Any, make_ctx: Any, key: str) -> None:
    error = error_of({"url": f"{http_stub.url}/slow?seconds=2", key: 0.2}, make_ctx())
    assert error.kind == "timeout"
    assert error.retryable is True
    assert error.http_status is None


def test_ctx_timeout_is_the_default(http_stub: Any, make_ctx: Any) -> None:
    error = error_of({"url": f"{http_stub.url}/slow?seconds=2"}, make_ctx(timeout=0.2))
    assert error.kind == "timeout"


def test_connection_refused(make_ctx: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error = error_of({"url": f"http://127.0.0.1:{port}/x"}, make_ctx())
    assert error.kind == "connection"
    assert error.retryable is True


def test_bad_config(make_ctx: Any) -> None:
    assert error_of({"method": "GET"}, make_ctx()).kind == "config_error"
    assert error_of({"url": "ftp://example.invalid/"}, make_ctx()).kind == "client_error"
    assert error_of({"url": "http://x", "timeout": "soon"}, make_ctx()).kind == "config_error"


def test_redirects(http_stub: Any, make_ctx: Any) -> None:
    followed = run({"url": f"{http_stub.url}/redirect"}, make_ctx())
    assert followed["status_code"] == 200
    assert followed["url"].endswith("/json")
    kept = run({"url": f"{http_stub.url}/redirect", "follow_redirects": "false"}, make_ctx())
    assert kept["status_code"] == 302
    assert kept["headers"]["location"] == "/json"


def test_bearer_credential(http_stub: Any, vault: Any, make_ctx: Any) -> None:
    vault.set("api_token", {"type": "bearer", "token": "tok-123456"}, kind="http")
    ctx = make_ctx()
    result = run({"url": f"{http_stub.url}/echo", "auth": "api_token"}, ctx)
    assert result["data"]["headers"]["authorization"] == "Bearer tok-123456"
    assert "tok-123456" in ctx.secrets


def test_basic_credential(http_stub: Any, vault: Any, make_ctx: Any) -> None:
    vault.set("api_basic", {"username": "ann", "password": "pw-basic-1"})
    ctx = make_ctx()
    result = run({"url": f"{http_stub.url}/echo", "auth": "api_basic"}, ctx)
    assert result["data"]["headers"]["authorization"] == "Basic YW5uOnB3LWJhc2ljLTE="
    assert {"pw-basic-1", "YW5uOnB3LWJhc2ljLTE="} <= ctx.secrets


def test_header_credential(http_stub: Any, vault: Any, make_ctx: Any) -> None:
    vault.set("api_headers", {"headers": {"X-Api-Key": "key-abcdef"}})
    ctx = make_ctx()
    result = run(
        {"url": f"{http_stub.url}/echo", "auth": "api_headers", "headers": {"X-Other": "1"}},
        ctx,
    )
    assert result["data"]["headers"]["x-api-key"] == "key-abcdef"
    assert result["data"]["headers"]["x-other"] == "1"
    assert "key-abcdef" in ctx.secrets


def test_missing_and_unusable_credentials(http_stub: Any, vault: Any, make_ctx: Any) -> None:
    error = error_of({"url": f"{http_stub.url}/json", "auth": "nope"}, make_ctx())
    assert error.kind == "credential"
    assert "flowtide credential set nope" in error.message
    vault.set("odd", {"something": "else"})
    error = error_of({"url": f"{http_stub.url}/json", "auth": "odd"}, make_ctx())
    assert error.kind == "credential"
    assert "else" not in error.message


def test_parallel_requests_overlap_on_one_client(http_stub: Any, make_ctx: Any) -> None:
    run({"url": f"{http_stub.url}/probe/reset", "method": "POST"}, make_ctx())

    def call(_: int) -> int:
        return int(
            run({"url": f"{http_stub.url}/probe", "params": {"delay": 0.3}}, make_ctx())[
                "status_code"
            ]
        )

    with ThreadPoolExecutor(max_workers=64) as executor:
        statuses = list(executor.map(call, range(64)))
    assert statuses == [200] * 64
    stats = run({"url": f"{http_stub.url}/probe/stats"}, make_ctx())["data"]
    assert stats["max_active"] >= 32
    assert len(httpmod._clients) == 1


def test_a_response_past_the_limit_is_not_read(http_stub: Any, make_ctx: Any) -> None:
    # No Content-Length: the body is read until it passes the limit, then dropped.
    with pytest.raises(ToolError) as info:
        run({"url": f"{http_stub.url}/endless", "max_response_bytes": 1_000_000}, make_ctx())
    assert info.value.kind == "response_too_large" and "1000000-byte limit" in info.value.message
    # A declared Content-Length over the limit is refused before the body is read.
    with pytest.raises(ToolError) as info:
        run({"url": f"{http_stub.url}/text", "max_response_bytes": 5}, make_ctx())
    assert "Content-Length is 15 bytes" in info.value.message
    # Under the limit nothing changes; a bad limit is a config error.
    assert run({"url": f"{http_stub.url}/text", "max_response_bytes": 15}, make_ctx())["data"] == (
        "plain text body"
    )
    with pytest.raises(ToolError) as info:
        run({"url": f"{http_stub.url}/text", "max_response_bytes": "lots"}, make_ctx())
    assert info.value.kind == "config_error"
