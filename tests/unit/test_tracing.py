"""Traces (flowtide.tracing): the ids every process derives alike, the embedded runtime's
spans (in memory), a real OTLP/HTTP collector on loopback, and nothing at all when off."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flowtide import tracing
from flowtide.playbook.loader import load_playbook
from flowtide.runtime.local import LocalRuntime
from flowtide.store.sqlite import SQLiteStore
from flowtide.tracing.sdk import recorder_with
from otlp import Collector

CHILD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: traced_child, path: tests/traced_child}
workflow:
  - step: inner
    tool: {kind: python, code: "result = {'n': 1}"}
"""

PARENT = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: traced, path: tests/traced}
workload: {secret_word: swordfish-42}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'word': '{{ secret_word }}'}"}
    next: [each]
  - step: each
    loop: {in: "{{ [1, 2] }}", iterator: item}
    tool: {kind: python, code: "result = {'i': {{ item }}}"}
    next: [call]
  - step: call
    tool: {kind: playbook, path: tests/traced_child}
    next: [broken]
  - step: broken
    tool: {kind: python, code: "raise ValueError('swordfish-42 leaked?')"}
"""

GIVEN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_traceparent_round_trips_and_bad_ones_are_refused() -> None:
    found = tracing.parse(GIVEN)
    assert found == tracing.TraceContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True
    )
    assert found.header == GIVEN
    assert tracing.parse(GIVEN.upper()) == found
    unsampled = tracing.parse(GIVEN[:-2] + "00")
    assert unsampled is not None and not unsampled.sampled
    for bad in (None, "", "garbage", GIVEN[:-1], "ff" + GIVEN[2:], "00-" + "0" * 32 + GIVEN[35:]):
        assert tracing.parse(bad) is None, bad


def test_ids_are_derived_alike_everywhere() -> None:
    derived = tracing.execution_context(123456789)
    assert derived == tracing.execution_context(123456789)
    assert derived.trace_id != tracing.execution_context(123456790).trace_id
    under = tracing.execution_context(123456789, GIVEN)
    assert under.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert under.span_id == derived.span_id
    one = tracing.command_context(123456789, 5, 1, GIVEN)
    assert one.trace_id == under.trace_id
    assert one.span_id != tracing.command_context(123456789, 5, 2, GIVEN).span_id


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing._install(recorder_with(exporter))
    try:
        yield exporter
    finally:
        tracing._install(None)


def _run(tmp_path: Path, traceparent: str | None) -> int:
    (tmp_path / "traced_child.yaml").write_text(CHILD)
    (tmp_path / "parent.yaml").write_text(PARENT)

    async def go() -> int:
        store = SQLiteStore(tmp_path / "flowtide.db")
        async with LocalRuntime(store, data_dir=tmp_path / "data") as rt:
            eid = await rt.start(load_playbook(tmp_path / "parent.yaml"), traceparent=traceparent)
            state = await rt.wait(eid, timeout=60)
            assert state.status == "failed"
            return eid

    return asyncio.run(go())


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_an_embedded_run_is_one_trace(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    eid = _run(tmp_path, GIVEN)
    got = spans.get_finished_spans()
    trace_id = tracing.parse(GIVEN).trace_id  # type: ignore[union-attr]
    assert {s.context.trace_id for s in got if s.context} == {trace_id}
    executions = [s for s in got if s.name == "execution"]
    assert len(executions) == 2
    root = next(s for s in executions if _attrs(s)["flowtide.execution_id"] == str(eid))
    child = next(s for s in executions if s is not root)
    # The run hangs under the caller's span, with its derived span id.
    assert root.parent is not None and root.parent.span_id == 0xB7AD6B7169203331
    assert root.context is not None
    assert root.context.span_id == tracing.execution_context(eid).span_id
    assert _attrs(root)["flowtide.status"] == "failed"
    assert not root.status.is_ok
    steps = [s for s in got if s.name.startswith("step ")]
    mine = [s for s in steps if _attrs(s)["flowtide.execution_id"] == str(eid)]
    assert sorted(s.name for s in mine) == [
        "step broken",
        "step call",
        "step each",
        "step each",
        "step start",
    ]
    for s in mine:
        assert s.parent is not None and s.parent.span_id == root.context.span_id
        a = _attrs(s)
        assert a["flowtide.attempt"] == 1 and a["flowtide.worker_id"]
        assert s.start_time is not None and s.end_time is not None
        assert s.start_time <= s.end_time
    assert sorted(_attrs(s).get("flowtide.loop_index") for s in mine if s.name == "step each") == [
        0,
        1,
    ]
    broken = next(s for s in mine if s.name == "step broken")
    assert _attrs(broken)["flowtide.error.kind"] and not broken.status.is_ok
    # The sub-playbook's execution is a child of the command that started it.
    call = next(s for s in mine if s.name == "step call")
    assert child.parent is not None and call.context is not None
    assert child.parent.span_id == call.context.span_id
    assert _attrs(child)["flowtide.parent_execution_id"] == str(eid)
    inner = next(s for s in steps if s.name == "step inner")
    assert inner.parent is not None and child.context is not None
    assert inner.parent.span_id == child.context.span_id
    # Ids, names, kinds and counts: never a workload value, a result or an error text.
    for s in got:
        assert "swordfish" not in json.dumps(_attrs(s))
        assert "swordfish" not in (s.status.description or "")


def test_without_a_traceparent_the_trace_comes_from_the_execution_id(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    eid = _run(tmp_path, None)
    got = spans.get_finished_spans()
    root = next(
        s for s in got if s.name == "execution" and _attrs(s)["flowtide.execution_id"] == str(eid)
    )
    assert root.parent is None
    assert {s.context.trace_id for s in got if s.context} == {
        tracing.execution_context(eid).trace_id
    }


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    try:
        yield found
    finally:
        found.close()


def _embedded(tmp_path: Path, env: dict[str, str]) -> dict[str, Any]:
    """`flowtide.run` of a two-step playbook in a fresh process; what it saw."""
    (tmp_path / "p.yaml").write_text(
        textwrap.dedent(
            """
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: two, path: tests/two}
            workflow:
              - step: a
                tool: {kind: python, code: "result = 1"}
                next: [b]
              - step: b
                tool: {kind: noop}
            """
        )
    )
    code = textwrap.dedent(
        f"""
        import json, sys
        import flowtide
        from flowtide import tracing
        doc = flowtide.run({str(tmp_path / "p.yaml")!r}, home={str(tmp_path / "home")!r})
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        print(json.dumps({{"status": doc["status"], "id": doc["execution_id"],
                           "enabled": tracing.enabled, "otel": loaded}}))
        """
    )
    clean = {k: v for k, v in os.environ.items() if "OTEL" not in k}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_off_imports_nothing_and_sends_nothing(tmp_path: Path, collector: Collector) -> None:
    got = _embedded(tmp_path, {})
    assert got["status"] == "completed"
    assert not got["enabled"] and got["otel"] == []
    assert collector.posts == 0


@pytest.mark.parametrize("variable", ["FLOWTIDE_OTEL_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"])
def test_a_real_collector_receives_the_run(
    tmp_path: Path, collector: Collector, variable: str
) -> None:
    got = _embedded(tmp_path, {variable: collector.url})
    assert got["status"] == "completed" and got["enabled"]
    # The process flushed what it recorded before it exited.
    spans = list(collector.spans)
    assert sorted(g.span.name for g in spans) == ["execution", "step a", "step b"]
    trace_id = tracing.execution_context(int(got["id"])).trace_id.to_bytes(16, "big")
    assert {g.span.trace_id for g in spans} == {trace_id}
    root = next(g.span for g in spans if g.span.name == "execution")
    for g in spans:
        if g.span is not root:
            assert g.span.parent_span_id == root.span_id
            assert g.attrs["flowtide.worker_id"]
        assert g.resource["service.name"] == "flowtide"
        assert g.resource["flowtide.role"] == "embedded"


def test_an_endpoint_without_the_sdk_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flowtide import settings
    from flowtide.errors import SettingsError

    monkeypatch.setenv("FLOWTIDE_OTEL_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setitem(sys.modules, "flowtide.tracing.sdk", None)
    monkeypatch.setattr(tracing, "_started", False)
    settings.reset()
    try:
        with pytest.raises(SettingsError, match=r"FLOWTIDE_OTEL_ENDPOINT .*flowtide\[otel\]"):
            tracing.start("test")
        assert not tracing.enabled
    finally:
        settings.reset()


def test_the_claim_share_carries_the_traceparent_only_when_there_is_one() -> None:
    from flowtide.wire import ExecutionShare

    share = ExecutionShare("text", None, {"ctx": {}}, revision=3, traceparent=GIVEN)
    assert ExecutionShare.from_dict(share.to_dict()).traceparent == GIVEN
    plain = ExecutionShare("text", None, {"ctx": {}}, revision=3)
    assert "traceparent" not in plain.to_dict()
    assert ExecutionShare.from_dict(plain.to_dict()).traceparent is None
