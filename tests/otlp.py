"""A tiny OTLP/HTTP trace receiver on loopback for the traces tests (flowtide.tracing):
it decodes each export with opentelemetry-proto and keeps the spans with the resource
that sent them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["Collector", "Got"]


@dataclass(frozen=True)
class Got:
    """A received span and the resource attributes of the process that sent it."""

    span: Span
    resource: dict[str, str]

    @property
    def attrs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for a in self.span.attributes:
            kind = a.value.WhichOneof("value")
            out[a.key] = getattr(a.value, kind) if kind else None
        return out


class Collector:
    """Start with `Collector()`, read `url` and `spans`, `close()` when done."""

    def __init__(self) -> None:
        self.spans: list[Got] = []
        self.posts = 0
        lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/traces"
                if ok:
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    with lock:
                        owner.posts += 1
                        for rs in request.resource_spans:
                            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                            for scope in rs.scope_spans:
                                owner.spans.extend(Got(s, resource) for s in scope.spans)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def wait_for(self, done: Callable[[list[Got]], bool], timeout: float = 30) -> list[Got]:
        """The spans once `done(spans)` holds (polled); AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            got = list(self.spans)
            if done(got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"spans never arrived: {[g.span.name for g in got]}")
            time.sleep(0.1)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
