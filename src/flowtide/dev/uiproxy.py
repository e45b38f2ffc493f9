"""`flowtide dev ui`: the dev stack's web UI in a browser that has no client certificate.

The stack's server takes mutual TLS only: a browser, which holds no certificate of the
stack's CA, gets no answer there. This proxy listens on loopback in plain HTTP (never on
another address: it holds the admin's client certificate, so whoever reaches it reaches
the server as far as TLS goes) and sends every request on to the server over TLS with the
stack's CA and the admin's certificate, its answer streamed back as it comes (the UI
follows executions over Server-Sent Events).

It adds no credential: the browser signs in with a token as it would at the server (`POST
/api/session`), and the session cookie, the CSRF header and the body cap (413) are the
server's. Two changes only: a `Secure` cookie attribute is dropped (the proxy speaks plain
HTTP, on loopback), and a request whose Host is not the proxy's own is refused (a web
page whose name was made to point at 127.0.0.1 cannot use it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from flowtide.dev.processes import DevStackError
from flowtide.relay import relay

__all__ = ["UiProxy", "is_loopback", "listen_loopback"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Not passed on: they describe one connection, not the request.
_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
    }
)
_SECURE: Final = re.compile(rb";\s*secure\s*(?=;|$)", re.IGNORECASE)


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only: localhost, 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen_loopback(host: str, port: int) -> socket.socket:
    """A socket listening on `host`:`port` (0: any free port).

    Raises:
        DevStackError: `host` is not a loopback address, or the port cannot be bound.
    """
    if not is_loopback(host):
        raise DevStackError(
            f"--host {host}: the UI proxy listens on loopback only (127.0.0.1, ::1 or"
            " localhost): it holds the admin's client certificate"
        )
    name = "::1" if ":" in host else "127.0.0.1" if host == "localhost" else host
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((name.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise DevStackError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (try --port)"
        ) from None
    # Listening at once: a browser opened before the app runs waits in the backlog.
    sock.listen(128)
    return sock


class UiProxy:
    """The ASGI app: every request to `upstream` (the server's base URL), verified with
    `verify` (an SSL context holding the CA and the client certificate, or a bool),
    answering for the Host names in `hosts` only (the proxy's `host:port` spellings).
    Request bodies over `max_body` bytes get 413 (the server's cap, as it would)."""

    def __init__(
        self, upstream: str, *, verify: Any, hosts: set[str], max_body: int = 16 * 1024 * 1024
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.verify = verify
        self.hosts = {h.lower() for h in hosts}
        self.max_body = max_body
        self._client: Any = None

    def client(self) -> Any:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(
                # A stream may stay quiet for long: no read timeout.
                timeout=httpx.Timeout(connect=10.0, read=None, write=60.0, pool=10.0),
                verify=self.verify,
                follow_redirects=False,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return  # no websockets: the UI uses none
        await self._http(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        import httpx

        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or ())
        host = next((v for k, v in headers if k == b"host"), b"").decode("latin-1").lower()
        if host not in self.hosts:
            await _reply(send, 421, f"this proxy answers for {sorted(self.hosts)[0]} only")
            return
        length = next((v for k, v in headers if k == b"content-length"), None)
        if length is not None and not length.isdigit():
            await _reply(send, 400, "Content-Length is not a number")
            return
        if length is not None and int(length) > self.max_body:
            await _reply(send, 413, f"the request body is over {self.max_body} bytes")
            return
        first = await receive()
        if first["type"] == "http.disconnect":
            return
        # The whole body is read before anything is sent on (at most max_body bytes): a
        # server that answers before reading a body could not otherwise be held to the cap.
        body = bytearray(first.get("body", b""))
        more = bool(first.get("more_body"))
        while more and len(body) <= self.max_body:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = bool(message.get("more_body"))
        if len(body) > self.max_body:
            await _reply(send, 413, f"the request body is over {self.max_body} bytes")
            return
        target = bytes(scope.get("raw_path") or scope["path"].encode())
        if not target.startswith(b"/"):
            # An absolute or odd request target (`GET @other-host/x`, `GET http://...`):
            # pasted after the server's address it could name another host, which would
            # get the browser's cookie. Browsers send a path.
            await _reply(send, 400, "the request target must be a path (/...)")
            return
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        client = self.client()
        try:
            # The server's scheme, host and port always: only the path and query change.
            url = httpx.URL(self.upstream).copy_with(raw_path=target)
        except httpx.InvalidURL:
            await _reply(send, 400, "the request target is not a valid path")
            return
        request = client.build_request(
            scope["method"],
            url,
            headers=_forwarded(headers),
            content=bytes(body),
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _reply(
                send,
                502,
                f"the dev stack's server {self.upstream} did not answer:"
                f" {str(exc) or type(exc).__name__} (is it up? `flowtide dev status`)",
            )
            return
        try:
            await self._relay(response, receive, send)
        finally:
            await response.aclose()

    async def _relay(self, response: Any, receive: Receive, send: Send) -> None:
        """Send `response` on as its bytes come, until it ends or the browser goes."""
        headers = [_cookie(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
        with contextlib.suppress(Exception):
            # The server went away mid-answer: this one ends unfinished too (the browser
            # sees a cut answer, not a complete one).
            await relay(response, headers, receive, send)


def _forwarded(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The browser's headers as the server gets them: without the hop-by-hop ones, nor
    those its `Connection` header names, nor `Content-Length` (the body as the proxy
    read it is framed anew, so a length that does not match it is not passed on)."""
    named = {
        part.strip().lower()
        for k, v in headers
        if k.lower() == b"connection"
        for part in v.split(b",")
    }
    drop = _HOP | named | {b"content-length"}
    return [(k, v) for k, v in headers if k.lower() not in drop]


def _cookie(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    """A response header as the browser gets it: a cookie without `Secure` (the proxy
    speaks plain HTTP on loopback; a Secure cookie would not come back)."""
    if name.lower() == b"set-cookie":
        return name, _SECURE.sub(b"", value)
    return name, value


async def _reply(send: Send, status: int, detail: str) -> None:
    import json

    body = json.dumps({"title": "flowtide dev ui", "status": status, "detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
