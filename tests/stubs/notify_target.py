"""A loopback HTTP target for notifications: POSTs are recorded and answered with the
scripted statuses (then 200); a GET answers with the Authorization header it got (for a
playbook that reads a credential)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Target:
    url: str
    #: (path, headers, body text) of every POST, in order.
    posts: list[tuple[str, dict[str, str], str]] = field(default_factory=list)
    #: Statuses the next POSTs get, in order (then 200).
    script: list[int] = field(default_factory=list)

    def bodies(self) -> list[Any]:
        return [json.loads(body) for _path, _headers, body in self.posts]


@contextmanager
def notify_target() -> Iterator[Target]:
    target = Target(url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            self._answer(
                200, json.dumps({"authorization": self.headers.get("Authorization", "")}).encode()
            )

        def do_POST(self) -> None:  # noqa: N802 - http.server API
            text = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            with lock:
                target.posts.append((self.path, dict(self.headers), text))
                status = target.script.pop(0) if target.script else 200
            self._answer(status, b"{}")

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    target.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield target
    finally:
        server.shutdown()
        server.server_close()
