"""An http step's error message never shows a password written in the request's URL
(it is no value of the secret set: nothing else would mask it in events and logs)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from flowtide.errors import ToolError
from flowtide.tools.http import HttpTool

PASSWORD = "pw-Zk3-in-url"


def _error(url: str, ctx: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        HttpTool().run({"kind": "http", "url": url}, ctx)
    return info.value


def test_a_status_error_names_the_url_without_its_password(http_stub: Any, make_ctx: Any) -> None:
    url = http_stub.url.replace("http://", f"http://alice:{PASSWORD}@") + "/status/404"
    error = _error(url, make_ctx())
    assert PASSWORD not in str(error)
    assert "alice:***@" in str(error)


def test_a_connection_error_names_the_url_without_its_password(make_ctx: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed: nothing listens there
    error = _error(f"http://bob:{PASSWORD}@127.0.0.1:{port}/x", make_ctx())
    assert error.kind == "connection"
    assert PASSWORD not in str(error)
