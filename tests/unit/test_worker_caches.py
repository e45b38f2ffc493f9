"""A worker's caches stay bounded however many executions it serves (the soak in
bench/soak.py runs hundreds in a row): here the cancellation checks' answers."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from flowtide.ids import Snowflake
from flowtide.worker import _commands
from flowtide.worker._commands import CANCEL_CACHE_MAX, CommandRunner


def test_cancellation_answers_are_bounded_and_still_serve_the_recent(tmp_path: Path) -> None:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, json={"cancelled": False})

    client = httpx.Client(base_url="http://server.invalid", transport=httpx.MockTransport(answer))
    runner = CommandRunner(
        client, worker_id="w", pool="p", home=tmp_path, template_env={}, ids=Snowflake("w")
    )
    executions = 4 * CANCEL_CACHE_MAX
    for eid in range(executions):
        assert runner.cancelled(eid) is False
    assert len(asked) == executions
    assert len(runner._cancel_cache) <= CANCEL_CACHE_MAX
    # The latest answers are kept: asked again at once, no request.
    assert runner.cancelled(executions - 1) is False
    assert len(asked) == executions


def test_expired_cancellation_answers_go_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(_commands.time, "monotonic", lambda: now[0])
    client = httpx.Client(
        base_url="http://server.invalid",
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"cancelled": True})),
    )
    runner = CommandRunner(
        client, worker_id="w", pool="p", home=tmp_path, template_env={}, ids=Snowflake("w")
    )
    monkeypatch.setattr(_commands, "cancel_running", lambda eid: None)
    for eid in range(CANCEL_CACHE_MAX):
        runner.cancelled(eid)
    now[0] += _commands.CANCEL_TTL
    runner.cancelled(10_000)  # one over: every expired answer goes, the new one stays
    assert list(runner._cancel_cache) == [10_000]
