"""A loopback HTTP server that answers every GET with the Authorization header it got."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class EchoAuth(BaseHTTPRequestHandler):
    #: The Authorization headers received, in order.
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        header = self.headers.get("Authorization", "")
        type(self).seen.append(header)
        body = json.dumps({"authorization": header}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextmanager
def serve_echo() -> Iterator[str]:
    """Run the server on a free port; its URL (…/echo)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoAuth)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/echo"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
