"""The worker names the execution in `X-Flowtide-Execution` where its request's path does
not: a gateway in front of shards (flowtide.gateway) routes on it. The request's shape
only, against httpx's MockTransport."""

from __future__ import annotations

import json

import httpx

from flowtide.wire import CREDENTIALS_PATH, EXECUTION_HEADER
from flowtide.worker._commands import CommandCredentials


def test_credential_requests_name_their_execution() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"name": "pg", "data": {"user": "u"}})

    client = httpx.Client(base_url="http://gateway.invalid", transport=httpx.MockTransport(answer))
    creds = CommandCredentials(client, "w1", 384047186877669376, 7)
    creds.resolve("pg")
    [request] = seen
    assert request.url.path == CREDENTIALS_PATH
    assert request.headers[EXECUTION_HEADER] == "384047186877669376"
    assert json.loads(request.content)["execution_id"] == "384047186877669376"
