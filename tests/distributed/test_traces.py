"""Traces of the distributed runtime (flowtide.tracing) at a real OTLP/HTTP collector on
loopback: a run started with a `traceparent` (`POST /api/execute`, a webhook) is one
trace, its execution span recorded by the server, its commands' spans by the worker that
ran them, and a sub-playbook's execution a child of the command that started it."""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowtide import tracing
from flowtide.triggers.hooks import sign
from otlp import Collector, Got

from .stack import Stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

from natsserver import NatsServer  # noqa: E402

STACK_WORKERS = 1
_ids = itertools.count()

CHILD = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: traced_child, path: tests/traces/child}
workflow:
  - step: inner
    tool: {kind: python, code: "result = {'n': 1}"}
"""

PARENT = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: traced_parent, path: tests/traces/parent}
workload: {word: swordfish-77}
workflow:
  - step: first
    tool: {kind: python, code: "result = {'w': '{{ word }}'}"}
    next: [call]
  - step: call
    tool: {kind: playbook, path: tests/traces/child}
"""

SECRET = "traces-hook-secret-9f3e"


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    found = Collector()
    try:
        yield found
    finally:
        found.close()


@pytest.fixture(scope="module")
def traced(
    pg_server: Any, tmp_path_factory: pytest.TempPathFactory, collector: Collector
) -> Iterator[Stack]:
    """A server and a worker that send their spans to `collector`."""
    root = tmp_path_factory.mktemp("traces")
    name = f"traces_{next(_ids)}"
    db = pg_server.create_database(name)
    nats = NatsServer.start_secured(root / "nats", pools=("default",))
    stack = Stack(
        db=db,
        nats=nats.url,
        root=root,
        nats_users=nats.users,
        extra_env={"FLOWTIDE_OTEL_ENDPOINT": collector.url},
    )
    try:
        stack.start_server()
        stack.start_worker(concurrency=4)
        stack.wait_workers(1)
        with stack.client("operator") as api:
            for text in (CHILD, PARENT):
                r = api.post("/api/catalog/register", json={"content": text})
                assert r.status_code in (200, 201), r.text
            r = api.post(
                "/api/hooks",
                json={"name": "traced", "playbook": "tests/traces/parent", "secret": SECRET},
            )
            assert r.status_code == 201, r.text
        yield stack
    finally:
        stack.stop()
        nats.stop()
        pg_server.drop_database(name)


def _ended(stack: Stack, execution_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with stack.client() as api:
        while True:
            doc: dict[str, Any] = api.get(f"/api/executions/{execution_id}").json()
            if doc["status"] not in ("running", "pending", "cancelling"):
                return doc
            assert time.monotonic() < deadline, doc["status"]
            time.sleep(0.1)


def _trace(collector: Collector, trace_id: int) -> list[Got]:
    """The spans of one trace once both executions and their three commands are in."""
    raw = trace_id.to_bytes(16, "big")

    def mine(spans: list[Got]) -> list[Got]:
        return [g for g in spans if g.span.trace_id == raw]

    return mine(
        collector.wait_for(
            lambda spans: (
                sorted(g.span.name for g in mine(spans))
                == ["execution", "execution", "step call", "step first", "step inner"]
            )
        )
    )


def _check_shape(spans: list[Got], execution_id: str, parent_span: int) -> None:
    by_name = {g.span.name: g for g in spans if g.span.name != "execution"}
    executions = [g for g in spans if g.span.name == "execution"]
    root = next(g for g in executions if g.attrs["flowtide.execution_id"] == execution_id)
    child = next(g for g in executions if g is not root)
    # The execution span: recorded by the server, under the caller's span, its id derived.
    assert root.resource["flowtide.role"] == "server"
    assert root.span.parent_span_id == parent_span.to_bytes(8, "big")
    derived = tracing.execution_context(int(execution_id)).span_id
    assert root.span.span_id == derived.to_bytes(8, "big")
    assert root.attrs["flowtide.status"] == "completed"
    # Its commands: recorded by the worker that ran them, with step, attempt and worker.
    for step in ("first", "call"):
        got = by_name[f"step {step}"]
        assert got.resource["flowtide.role"] == "worker"
        assert got.span.parent_span_id == root.span.span_id
        assert got.attrs["flowtide.step"] == step
        assert got.attrs["flowtide.attempt"] == 1
        assert got.attrs["flowtide.worker_id"] == "w0"
        assert got.span.start_time_unix_nano <= got.span.end_time_unix_nano
    # The sub-playbook: a child of the command that started it, its command under it.
    assert child.span.parent_span_id == by_name["step call"].span.span_id
    assert child.attrs["flowtide.parent_execution_id"] == execution_id
    assert by_name["step inner"].span.parent_span_id == child.span.span_id
    for g in spans:
        assert "swordfish" not in json.dumps(g.attrs)


def test_a_run_started_with_a_traceparent_is_one_trace(traced: Stack, collector: Collector) -> None:
    given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with traced.client("operator") as api:
        r = api.post(
            "/api/execute",
            json={"path": "tests/traces/parent"},
            headers={"traceparent": given},
        )
    assert r.status_code == 201, r.text
    execution_id = r.json()["execution_id"]
    assert _ended(traced, execution_id)["status"] == "completed"
    spans = _trace(collector, 0x4BF92F3577B34DA6A3CE929D0E0E4736)
    _check_shape(spans, execution_id, 0x00F067AA0BA902B7)


def test_a_webhook_delivery_carries_its_traceparent(traced: Stack, collector: Collector) -> None:
    given = "00-5c0a2f3577b34da6a3ce929d0e0e4737-11f067aa0ba902b8-01"
    body = b'{"x": 1}'
    r = httpx.post(
        f"{traced.url}/api/hooks/traced",
        content=body,
        headers={
            "content-type": "application/json",
            "X-Flowtide-Signature": sign(SECRET.encode(), body),
            "traceparent": given,
        },
        timeout=60,
    )
    assert r.status_code == 202, r.text
    execution_id = r.json()["execution_id"]
    assert _ended(traced, execution_id)["status"] == "completed"
    spans = _trace(collector, 0x5C0A2F3577B34DA6A3CE929D0E0E4737)
    _check_shape(spans, execution_id, 0x11F067AA0BA902B8)
