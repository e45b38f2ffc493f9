"""`flowtide dev ui`'s proxy (flowtide.dev.uiproxy) against a small local server that takes
mutual TLS only: it reaches the server with the stack's CA and the admin's client
certificate, streams answers as they come, passes bodies and the browser's headers on
without adding a credential, keeps the server's body cap, drops `Secure` from cookies,
answers only for its own Host, and listens on loopback only."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from flowtide.cli import app
from flowtide.dev.processes import DevStackError
from flowtide.dev.tls import LocalCA
from flowtide.dev.uiproxy import UiProxy, is_loopback, listen_loopback
from flowtide.tls import ClientTls


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    release = threading.Event()
    seen: list[dict[str, Any]] = []

    def _record(self, body: bytes = b"") -> None:
        self.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._record()
        if self.path == "/stream":
            # The first bytes, then nothing until the test releases the rest.
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for line in (b"data: first\n\n", None, b"data: last\n\n"):
                if line is None:
                    assert self.release.wait(10)
                    continue
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.send_header(
            "set-cookie", "flowtide_session=abc; HttpOnly; Path=/; SameSite=strict; Secure"
        )
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        self._record(body)
        self.send_response(201)
        self.send_header("content-type", "application/octet-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    ca = LocalCA(tmp_path_factory.mktemp("stack") / "tls")
    ca.ensure()
    return ca


@pytest.fixture
def upstream(ca: LocalCA) -> Iterator[str]:
    """A server that takes mutual TLS with certificates of `ca` only."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*map(str, ca.cert("server")))
    context.load_verify_locations(str(ca.ca))
    context.verify_mode = ssl.CERT_REQUIRED
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    _Upstream.seen = []
    _Upstream.release.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        _Upstream.release.set()
        server.shutdown()
        server.server_close()


@contextmanager
def _serve(proxy: UiProxy, sock: socket.socket, http: str = "auto") -> Iterator[None]:
    config = uvicorn.Config(proxy, log_level="warning", access_log=False, lifespan="on", http=http)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def proxy(ca: LocalCA, upstream: str) -> Iterator[str]:
    sock = listen_loopback("127.0.0.1", 0)
    port = sock.getsockname()[1]
    cert, key = ca.cert("admin")
    verify = ClientTls(str(ca.ca), str(cert), str(key)).context()
    ui = UiProxy(upstream, verify=verify, hosts={f"127.0.0.1:{port}"}, max_body=4096)
    with _serve(ui, sock):
        yield f"http://127.0.0.1:{port}"


def test_the_server_takes_no_browser_without_the_certificate(ca: LocalCA, upstream: str) -> None:
    # What a browser sees at the server: no answer (the reason for the proxy).
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{upstream}/ui", verify=ssl.create_default_context(cafile=str(ca.ca)))


def test_requests_reach_the_server_with_the_browsers_headers_and_no_credential(
    proxy: str, upstream: str
) -> None:
    r = httpx.get(f"{proxy}/ui/executions?status=running", headers={"origin": proxy})
    assert r.status_code == 200 and r.json() == {"ok": True}
    sent = httpx.post(
        f"{proxy}/api/session",
        content=b'{"token": "ft_x"}',
        headers={"x-flowtide-csrf": "1", "content-type": "application/json"},
    )
    assert sent.status_code == 201 and sent.content == b'{"token": "ft_x"}'
    got, posted = _Upstream.seen
    assert got["path"] == "/ui/executions?status=running"
    assert got["headers"]["Host"] == upstream.removeprefix("https://")
    assert got["headers"]["origin"] == proxy
    assert posted["headers"]["x-flowtide-csrf"] == "1"
    assert posted["body"] == b'{"token": "ft_x"}'
    # The proxy adds no token: the browser signs in with its own.
    assert not any("authorization" in k.lower() for s in _Upstream.seen for k in s["headers"])
    # The session cookie comes back over plain HTTP on loopback: no Secure.
    cookie = r.headers["set-cookie"]
    assert "secure" not in cookie.lower() and "HttpOnly" in cookie and "SameSite" in cookie


def test_an_answer_streams_before_the_server_ends_it(proxy: str) -> None:
    with httpx.stream("GET", f"{proxy}/stream", timeout=10) as r:
        assert r.headers["content-type"] == "text/event-stream"
        chunks = r.iter_bytes()
        # The server still holds the rest back: these bytes came through on their own.
        assert next(chunks) == b"data: first\n\n"
        assert not _Upstream.release.is_set()
        _Upstream.release.set()
        assert b"".join(chunks) == b"data: last\n\n"


def test_bodies_over_the_cap_are_refused(proxy: str) -> None:
    whole = httpx.post(f"{proxy}/api/execute", content=b"x" * 5000)
    assert whole.status_code == 413

    def chunks() -> Iterator[bytes]:
        for _ in range(5):
            yield b"x" * 1000

    streamed = httpx.post(f"{proxy}/api/execute", content=chunks())
    assert streamed.status_code == 413
    assert not [s for s in _Upstream.seen if s["body"]]


def test_another_host_name_is_refused(proxy: str) -> None:
    # A page whose name was pointed at 127.0.0.1 (DNS rebinding) sends its own Host.
    r = httpx.get(f"{proxy}/api/whoami", headers={"host": "evil.example"})
    assert r.status_code == 421 and "answers for 127.0.0.1:" in r.json()["detail"]
    assert _Upstream.seen == []


def test_a_request_target_cannot_name_another_host(ca: LocalCA, upstream: str) -> None:
    # uvicorn's h11 parser (used when httptools is not installed) gives the request
    # target as it came: `GET @127.0.0.1:PORT/x` pasted after the server's address made
    # https://127.0.0.1:SERVER@127.0.0.1:PORT/x, a request to another host with the
    # browser's cookie (and the admin's certificate, were that host trusted).
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(8)
    other.settimeout(0.5)
    elsewhere = f"127.0.0.1:{other.getsockname()[1]}"
    sock = listen_loopback("127.0.0.1", 0)
    port = sock.getsockname()[1]
    cert, key = ca.cert("admin")
    verify = ClientTls(str(ca.ca), str(cert), str(key)).context()
    ui = UiProxy(upstream, verify=verify, hosts={f"127.0.0.1:{port}"})
    answers = []
    with _serve(ui, sock, http="h11"):
        for target in (f"@{elsewhere}/x", f"http://{elsewhere}/x", f"https://{elsewhere}/x"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                c.sendall(
                    f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    "Cookie: flowtide_session=abc\r\nConnection: close\r\n\r\n".encode()
                )
                answers.append(c.recv(4096).split(b"\r\n", 1)[0])
    with pytest.raises(TimeoutError):
        other.accept()  # nothing came to the other host
    other.close()
    assert answers == [b"HTTP/1.1 400 Bad Request"] * 3
    assert _Upstream.seen == []


def test_headers_the_browsers_connection_names_are_not_passed_on(proxy: str) -> None:
    r = httpx.get(
        f"{proxy}/ui",
        headers={"connection": "keep-alive, x-hop", "x-hop": "1", "x-kept": "2"},
    )
    assert r.status_code == 200
    (seen,) = _Upstream.seen
    assert "x-hop" not in {k.lower() for k in seen["headers"]}
    assert seen["headers"]["x-kept"] == "2"


def test_an_unreachable_server_is_named(ca: LocalCA) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        gone = f"https://127.0.0.1:{free.getsockname()[1]}"
    sock = listen_loopback("127.0.0.1", 0)
    port = sock.getsockname()[1]
    ui = UiProxy(gone, verify=True, hosts={f"127.0.0.1:{port}"})
    with _serve(ui, sock):
        r = httpx.get(f"http://127.0.0.1:{port}/ui")
        assert r.status_code == 502
        assert gone in r.json()["detail"] and "flowtide dev status" in r.json()["detail"]


def test_it_listens_on_loopback_only(tmp_path: Path) -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.5", "example.com", ""]))
    with pytest.raises(DevStackError, match="loopback only"):
        listen_loopback("0.0.0.0", 0)
    done = CliRunner().invoke(
        app, ["dev", "ui", "--host", "0.0.0.0", "--no-open", "--home", str(tmp_path)]
    )
    assert done.exit_code == 2 and "loopback only" in done.output
    # A stack that does not run: said, nothing served.
    done = CliRunner().invoke(app, ["dev", "ui", "--no-open", "--home", str(tmp_path)])
    assert done.exit_code == 1 and "`flowtide dev up`" in done.output
