"""OpenTelemetry traces of executions, off unless an OTLP endpoint is configured.

An execution is a trace; its root span (`execution`) covers it from creation to its end,
each command is a child span (`step NAME`: its step, attempt, worker, status, error
kind), a Spark job a child of its command, and a sub-playbook's execution a child of the
command that started it. Spans are recorded once their end is known, with the real start
and end times, by the process that knows them: the worker (or embedded thread) that ran a
command, the server (or embedded runtime) that wrote an execution's end.

No process holds a trace in memory: every id is derived. A trace's id and its execution
span's id come from the execution id (`execution_context`) unless the execution was
started under a W3C `traceparent` (a header of `POST /api/execute` or of a webhook, or
the command of a parent playbook): that one is kept in `playbook.initialized` and the
execution's trace is its trace. Any stateless server and any worker can therefore add
spans to it. Commands' span ids come from their command id and attempt.

Disabled (no FLOWTIDE_OTEL_ENDPOINT nor OTEL_EXPORTER_OTLP_ENDPOINT), nothing of the
OpenTelemetry SDK is imported and each hook is one test of `enabled`. Span attributes
hold ids, names, kinds and counts only: never a workload value, a result or a secret.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "Recorder",
    "TraceContext",
    "command_context",
    "current",
    "enabled",
    "execution_context",
    "incoming",
    "parse",
    "record_command",
    "record_execution",
    "span",
    "start",
    "use",
]


class Recorder(Protocol):
    """Where finished spans go (`flowtide.tracing.sdk.Recorder`, the SDK's)."""

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
    ) -> None: ...

    def flush(self) -> None: ...


#: Whether spans are recorded (set by `start` when an endpoint is configured).
enabled = False
_recorder: Recorder | None = None
_start_lock = threading.Lock()
_started = False
_local = threading.local()

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A span's place in a trace: what a W3C `traceparent` carries."""

    trace_id: int
    span_id: int
    sampled: bool = True

    @property
    def header(self) -> str:
        """The `traceparent` naming this span as the parent."""
        flags = "01" if self.sampled else "00"
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{flags}"


def parse(header: str | None) -> TraceContext | None:
    """A W3C `traceparent` (version 00, or a later one read as 00); None when absent or
    malformed (an invalid header starts a new trace, as the W3C spec says)."""
    if not header:
        return None
    found = _TRACEPARENT.match(header.strip().lower())
    if found is None:
        return None
    version, trace, parent, flags = found.groups()
    if version == "ff":
        return None
    trace_id, span_id = int(trace, 16), int(parent, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceContext(trace_id, span_id, bool(int(flags, 16) & 1))


def incoming(header: str | None) -> str | None:
    """The `traceparent` a new execution keeps from a request's header: normalised, or
    None when traces are off or the header is absent or malformed."""
    if not enabled:
        return None
    found = parse(header)
    return None if found is None else found.header


def _derived(kind: bytes, *ids: int, size: int) -> int:
    digest = hashlib.sha256(kind + b"".join(i.to_bytes(8, "little", signed=True) for i in ids))
    return int.from_bytes(digest.digest()[:size], "big") or 1


def execution_context(execution_id: int, traceparent: str | None = None) -> TraceContext:
    """The execution span's context: in the trace of `traceparent` (what the execution
    was started under) or in one derived from the execution id."""
    parent = parse(traceparent)
    trace_id = parent.trace_id if parent else _derived(b"flowtide.trace", execution_id, size=16)
    span_id = _derived(b"flowtide.execution", execution_id, size=8)
    return TraceContext(trace_id, span_id, parent.sampled if parent else True)


def command_context(
    execution_id: int, command_id: int, attempt: int, traceparent: str | None = None
) -> TraceContext:
    """The span of one attempt of a command, in its execution's trace."""
    execution = execution_context(execution_id, traceparent)
    span_id = _derived(b"flowtide.command", command_id, attempt, size=8)
    return TraceContext(execution.trace_id, span_id, execution.sampled)


def current() -> str | None:
    """The `traceparent` of the span this thread runs in (a command's, a Spark job's), to
    hand on to what it starts; None when traces are off or outside a span."""
    if not enabled:
        return None
    return getattr(_local, "header", None)


@contextmanager
def use(header: str | None) -> Iterator[None]:
    """Run the block inside the span `header` names (`current` answers it)."""
    before = getattr(_local, "header", None)
    _local.header = header
    try:
        yield
    finally:
        _local.header = before


@contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[str | None]:
    """A child span of `current()` around the block, recorded when it ends (an exception
    marks it failed, with the exception's type as its error kind). Yields the span's
    `traceparent` (None when traces are off or there is no current span)."""
    parent = parse(current())
    if parent is None or _recorder is None:
        yield None
        return
    recorder = _recorder
    child = TraceContext(parent.trace_id, int.from_bytes(os.urandom(8), "big") or 1, parent.sampled)
    started = _now()
    error: str | None = None
    try:
        with use(child.header):
            yield child.header
    except BaseException as exc:
        error = type(exc).__name__
        raise
    finally:
        recorder.record(
            name,
            *_ids(child),
            parent.span_id,
            started,
            _now(),
            dict(attributes or {}),
            error,
        )


def _ids(span: TraceContext) -> tuple[int, int, bool]:
    return span.trace_id, span.span_id, span.sampled


def _now() -> float:
    import time

    return time.time()


def record_command(
    *,
    execution_id: int,
    command_id: int,
    attempt: int,
    step: str,
    worker_id: str,
    traceparent: str | None,
    started: float,
    ended: float,
    status: str,
    error_kind: str | None,
    loop_index: int | None = None,
) -> None:
    """Record one attempt of a command as a span of its execution (nothing when off)."""
    if _recorder is None:
        return
    execution = execution_context(execution_id, traceparent)
    attributes: dict[str, Any] = {
        "flowtide.execution_id": str(execution_id),
        "flowtide.command_id": str(command_id),
        "flowtide.step": step,
        "flowtide.attempt": attempt,
        "flowtide.worker_id": worker_id,
        "flowtide.status": status,
    }
    if loop_index is not None:
        attributes["flowtide.loop_index"] = loop_index
    if error_kind:
        attributes["flowtide.error.kind"] = error_kind
    _recorder.record(
        f"step {step}",
        *_ids(command_context(execution_id, command_id, attempt, traceparent)),
        execution.span_id,
        started,
        ended,
        attributes,
        error_kind,
    )


def record_execution(
    *,
    execution_id: int,
    playbook_path: str | None,
    traceparent: str | None,
    parent_execution_id: int | None,
    started: float,
    ended: float,
    status: str,
    error_kind: str | None,
    steps: int,
) -> None:
    """Record an ended execution's root span (nothing when off). Its parent is the span
    it was started under, if any: a caller's request, a parent playbook's command."""
    if _recorder is None:
        return
    parent = parse(traceparent)
    attributes: dict[str, Any] = {
        "flowtide.execution_id": str(execution_id),
        "flowtide.playbook.path": playbook_path or "",
        "flowtide.status": status,
        "flowtide.steps": steps,
    }
    if parent_execution_id is not None:
        attributes["flowtide.parent_execution_id"] = str(parent_execution_id)
    if error_kind:
        attributes["flowtide.error.kind"] = error_kind
    _recorder.record(
        "execution",
        *_ids(execution_context(execution_id, traceparent)),
        parent.span_id if parent else None,
        started,
        ended,
        attributes,
        error_kind if status == "failed" else None,
    )


def start(role: str) -> bool:
    """Turn traces on for this process when an OTLP endpoint is configured
    (FLOWTIDE_OTEL_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT); once per process. Whether
    they are on. Without an endpoint nothing is imported."""
    global _started
    with _start_lock:
        if _started:
            return enabled
        _started = True
        from flowtide.settings import HomeSection
        from flowtide.settings import current as settings

        home = settings(HomeSection)
        endpoint = home.otel_endpoint or home.otlp_endpoint
        if not endpoint:
            return False
        try:
            from flowtide.tracing.sdk import otlp_recorder
        except ImportError as exc:
            from flowtide.errors import SettingsError

            name = "FLOWTIDE_OTEL_ENDPOINT" if home.otel_endpoint else "OTEL_EXPORTER_OTLP_ENDPOINT"
            raise SettingsError(
                f"{name} asks for traces but the OpenTelemetry SDK is missing ({exc.name}):"
                " pip install 'flowtide[otel]', or unset it",
                env=name,
                value=endpoint,
            ) from None
        _install(otlp_recorder(endpoint, role))
        return True


def _install(recorder: Recorder | None) -> None:
    """Record with `recorder` from now on (None: off). Tests install one in memory."""
    global _recorder, enabled
    _recorder = recorder
    enabled = recorder is not None


def flush() -> None:
    """Send what is recorded and not yet sent (a process about to exit)."""
    if _recorder is not None:
        _recorder.flush()
