"""The OpenTelemetry SDK behind `flowtide.tracing`: imported only when traces are on.

Spans are recorded after the fact (their start and end are known from the events), with
the ids `flowtide.tracing` derived: a tracer whose id generator hands out the ids it is
told to, so every process names the same execution span the same way.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
)

__all__ = ["Recorder", "otlp_recorder", "recorder_with"]


class _GivenIds(IdGenerator):
    """The ids the recording thread set, random ones otherwise."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self.given = threading.local()

    def generate_span_id(self) -> int:
        span_id: int | None = getattr(self.given, "span_id", None)
        return span_id if span_id else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        trace_id: int | None = getattr(self.given, "trace_id", None)
        return trace_id if trace_id else self._random.generate_trace_id()


class Recorder:
    """Records finished spans through a tracer provider (and its span processor)."""

    def __init__(self, processor: SpanProcessor, role: str) -> None:
        self.ids = _GivenIds()
        resource = Resource.create(
            {
                "service.name": "flowtide",
                "service.instance.id": f"{socket.gethostname()}:{role}",
                "flowtide.role": role,
            }
        )
        self.provider = TracerProvider(resource=resource, id_generator=self.ids)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("flowtide")

    def record(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        sampled: bool,
        parent_span_id: int | None,
        started: float,
        ended: float,
        attributes: Mapping[str, Any],
        error_kind: str | None,
    ) -> None:
        """One finished span: its ids, its parent span in the same trace (None: a root),
        its start and end (Unix seconds)."""
        flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
        if parent_span_id is None:
            # A root: no parent in the context, and the trace id is the one given.
            parent = otel_context.Context()
            self.ids.given.trace_id = trace_id
        else:
            remote = SpanContext(trace_id, parent_span_id, is_remote=True, trace_flags=flags)
            parent = trace.set_span_in_context(NonRecordingSpan(remote))
        self.ids.given.span_id = span_id
        try:
            made = self.tracer.start_span(
                name, context=parent, attributes=dict(attributes), start_time=_ns(started)
            )
        finally:
            self.ids.given.span_id = None
            self.ids.given.trace_id = None
        if error_kind:
            made.set_status(Status(StatusCode.ERROR, error_kind))
        made.end(end_time=_ns(max(ended, started)))

    def flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of an endpoint given as its base (as
    OTEL_EXPORTER_OTLP_ENDPOINT is) or as the traces URL itself."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


def otlp_recorder(endpoint: str, role: str) -> Recorder:
    """Spans batched to the OTLP/HTTP collector at `endpoint` (flushed at exit)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=10)
    return Recorder(BatchSpanProcessor(exporter, schedule_delay_millis=1000), role)


def recorder_with(exporter: SpanExporter, role: str = "test") -> Recorder:
    """Spans handed to `exporter` as each ends (tests: an in-memory exporter)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    return Recorder(SimpleSpanProcessor(exporter), role)
