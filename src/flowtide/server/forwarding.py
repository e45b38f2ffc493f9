"""Requests for another shard's executions, sent on to a server of that shard (phase G).

Any server of a sharded cluster answers any request. One about an execution that another
shard owns is forwarded, whole, to a live server of the owner (`flowtide.server.servers`
knows them and their `--advertise-url`), and its answer streamed back as it comes (an SSE
stream included). Which shard a request is for, first match wins:

1. the execution id in its path: `/api/executions/{id}...`, `/api/internal/executions/{id}...`,
   `/api/vars/{id}...`;
2. `X-Flowtide-Shard: k` (a worker's claims, reports and heartbeats, split per shard);
3. `X-Flowtide-Execution: id` (a worker's credential and sub-playbook requests).

Anything else is this server's to answer. A forwarded request carries
`X-Flowtide-Forwarded`; its receiver never forwards it again and refuses one that is not
its shard's with 421 (two servers disagreeing about the map), so nothing loops.

Forwarding happens after authentication (the `Gate` runs first) and keeps the caller's
headers, so the owner authenticates and authorises the request again as the caller's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

from flowtide.errors import FlowtideError, StoreError
from flowtide.relay import relay
from flowtide.server import metrics
from flowtide.sharding import shard_for
from flowtide.web.access import BodyTooLarge, error_body
from flowtide.wire import EXECUTION_HEADER, FORWARDED_HEADER, SHARD_HEADER

if TYPE_CHECKING:
    import httpx

    from flowtide.server.servers import ServerRegistry

__all__ = ["Forwarder", "Peers", "ShardUnavailable", "routed_shard"]

log = logging.getLogger("flowtide.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_PATH: Final = re.compile(r"^/api/(?:executions|internal/executions|vars)/(-?[0-9]{1,20})(?:/|$)")
_SHARD: Final = SHARD_HEADER.lower().encode()
_EXECUTION: Final = EXECUTION_HEADER.lower().encode()
_FORWARDED: Final = FORWARDED_HEADER.lower().encode()
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
        b"content-length",
    }
)
_RESPONSE_HOP: Final = _HOP - {b"content-length"}
#: How long a cluster-wide read waits for the other shards before it answers without them.
LIST_TIMEOUT: Final = 5.0
#: How long the live servers of the cluster are reused before asking the registry again.
_LIVE_FOR: Final = 2.0
_INT64: Final = 2**63


class ShardUnavailable(StoreError):
    """No server of the shard that owns the request's execution answered."""

    def __init__(self, shard: int, why: str) -> None:
        super().__init__(f"shard {shard} is unavailable: {why}")
        self.shard = shard


class BadRoute(FlowtideError):
    """A routing header that is not a number of the right range."""


def routed_shard(path: str, headers: dict[bytes, bytes], shards: int) -> int | None:
    """The shard a request is for (see the module), None when it names none.

    Raises:
        BadRoute: `X-Flowtide-Shard` or `X-Flowtide-Execution` is not a valid value.
    """
    found = _PATH.match(path)
    if found is not None:
        number = int(found.group(1))
        if -_INT64 <= number < _INT64:
            return shard_for(number, shards)
        return None  # the route refuses it (422)
    raw = headers.get(_SHARD)
    if raw is not None:
        try:
            shard = int(raw)
        except ValueError:
            raise BadRoute(f"{SHARD_HEADER} is not a number") from None
        if not 0 <= shard < shards:
            raise BadRoute(f"{SHARD_HEADER}: no shard {shard} (the cluster has {shards})")
        return shard
    raw = headers.get(_EXECUTION)
    if raw is not None:
        try:
            execution = int(raw)
        except ValueError:
            raise BadRoute(f"{EXECUTION_HEADER} is not an execution id") from None
        if not -_INT64 <= execution < _INT64:
            raise BadRoute(f"{EXECUTION_HEADER} is not an execution id")
        return shard_for(execution, shards)
    return None


class Peers:
    """The other shards' servers, and one keep-alive HTTP client to reach them."""

    def __init__(
        self,
        registry: ServerRegistry,
        *,
        verify: Any = True,
        timeout: float = 60.0,
        connect_timeout: float = 3.0,
    ) -> None:
        import httpx

        self.registry = registry
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            verify=verify,
            follow_redirects=False,
        )
        self._live: dict[int, list[str]] = {}
        self._read_at = 0.0
        self._turn = itertools.count()
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        await self.client.aclose()

    async def urls(self, shard: int, *, fresh: bool = False) -> list[str]:
        """The URLs of `shard`'s live servers, in the order to try them (turns taken)."""
        if fresh or time.monotonic() - self._read_at > _LIVE_FOR:
            async with self._lock:
                if fresh or time.monotonic() - self._read_at > _LIVE_FOR:
                    live: dict[int, list[str]] = {}
                    for row in await self.registry.live():
                        if row.url and row.server_id != self.registry.server_id:
                            live.setdefault(row.shard_index, []).append(row.url.rstrip("/"))
                    self._live, self._read_at = live, time.monotonic()
        urls = self._live.get(shard, [])
        if len(urls) > 1:
            k = next(self._turn) % len(urls)
            urls = urls[k:] + urls[:k]
        return urls

    async def send(
        self,
        shard: int,
        method: str,
        target: str,
        *,
        headers: list[tuple[bytes, bytes]],
        content: bytes = b"",
        stream: bool = False,
        timeout: float | None = None,
    ) -> httpx.Response:
        """`method target` (path and query) sent to a live server of `shard`, trying the
        next one when a server cannot be reached.

        Raises:
            ShardUnavailable: the shard has no live server with a URL, or none answered.
        """
        import httpx

        urls = await self.urls(shard)
        if not urls:
            urls = await self.urls(shard, fresh=True)
        if not urls:
            metrics.FORWARDED.labels(str(shard), "unavailable").inc()
            raise ShardUnavailable(
                shard, "no live server of it is registered with an --advertise-url"
            )
        last = ""
        for url in urls:
            request = self.client.build_request(
                method,
                url + target,
                headers=headers,
                content=content,
                timeout=self.client.timeout if timeout is None else httpx.Timeout(timeout),
            )
            try:
                response = await self.client.send(request, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                last = f"{url}: {str(exc) or type(exc).__name__}"
                continue
            except httpx.HTTPError as exc:
                # Sent, and no answer: it may have been done there. Not sent again.
                metrics.FORWARDED.labels(str(shard), "unavailable").inc()
                raise ShardUnavailable(shard, f"{url}: {str(exc) or type(exc).__name__}") from None
            metrics.FORWARDED.labels(str(shard), "answered").inc()
            return response
        metrics.FORWARDED.labels(str(shard), "unavailable").inc()
        raise ShardUnavailable(shard, f"no server of it answered ({last})")


def passed_on(headers: list[tuple[bytes, bytes]], by: str) -> list[tuple[bytes, bytes]]:
    """The request's headers as a forwarded request carries them."""
    kept = [(k, v) for k, v in headers if k.lower() not in _HOP and k.lower() != _FORWARDED]
    kept.append((_FORWARDED, by.encode("latin-1", "replace")))
    return kept


class Forwarder:
    """ASGI middleware: a request for another shard's execution goes to its servers.

    `context()` gives (this server's shard, the number of shards, its server id, the
    peers) once the app has started, None before (and then nothing is forwarded).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        context: Callable[[], tuple[int, int, str, Peers | None] | None],
    ) -> None:
        self.app = app
        self.context = context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = self.context() if scope["type"] == "http" else None
        if ctx is None or ctx[1] <= 1:
            await self.app(scope, receive, send)
            return
        own, shards, server_id, peers = ctx
        headers = dict(scope.get("headers") or ())
        try:
            shard = routed_shard(scope["path"], headers, shards)
        except BadRoute as exc:
            await reply(send, 400, str(exc))
            return
        if shard is None or shard == own:
            await self.app(scope, receive, send)
            return
        if _FORWARDED in headers or peers is None:
            await reply(
                send,
                421,
                f"this server serves shard {own}; the request is for shard {shard}"
                " (a forwarded request is not forwarded again: do the servers agree on"
                " the shard map?)",
            )
            return
        await forward(peers, shard, server_id, scope, receive, send)


async def forward(
    peers: Peers, shard: int, by: str, scope: Scope, receive: Receive, send: Send
) -> None:
    """Send the request to `shard`'s servers and stream their answer back."""
    body = bytearray()
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
    except BodyTooLarge as exc:  # a chunked body over the cap (the Gate counts it)
        await reply(send, exc.status_code, str(exc.detail))
        return
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target = bytes(target) + b"?" + scope["query_string"]
    try:
        response = await peers.send(
            shard,
            scope["method"],
            bytes(target).decode("latin-1"),
            headers=passed_on(list(scope.get("headers") or ()), by),
            content=bytes(body),
            stream=True,
        )
    except ShardUnavailable as exc:
        await reply(send, 503, str(exc), shard=shard)
        return
    headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _RESPONSE_HOP]
    try:
        await relay(response, headers, receive, send)
    except Exception as exc:  # noqa: BLE001 - the owner went away mid-answer
        log.warning("forwarding to shard %s broke off: %s", shard, exc)
    finally:
        await response.aclose()


async def reply(send: Send, status: int, message: str, **extra: Any) -> None:
    body = error_body(status, message, **extra)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def forwarded(peers: Peers, shard: int, by: str, request: Any) -> Any:
    """A route's request (a FastAPI `Request` whose body it read) answered by `shard`'s
    servers: for what the path and headers do not route (a body naming the execution).

    Raises:
        ShardUnavailable: see `Peers.send`.
    """
    from fastapi.responses import Response

    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    response = await peers.send(
        shard,
        request.method,
        target,
        headers=passed_on(list(request.headers.raw), by),
        content=await request.body(),
    )
    headers = {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in response.headers.raw
        if k.lower() not in _HOP
    }
    return Response(response.content, response.status_code, headers=headers)


async def gather_shards(
    peers: Peers,
    shards: int,
    own: int,
    by: str,
    target: str,
    headers: list[tuple[bytes, bytes]],
    *,
    timeout: float,
) -> tuple[dict[int, Any], dict[int, str]]:
    """GET `target` from one server of every shard but `own`, in parallel: (JSON answers
    by shard, why by shard for those that gave none within `timeout` seconds)."""
    import httpx

    async def one(shard: int) -> Any:
        response = await peers.send(
            shard, "GET", target, headers=passed_on(headers, by), timeout=timeout
        )
        if response.status_code != 200:
            raise ShardUnavailable(shard, f"HTTP {response.status_code}: {response.text[:300]}")
        return response.json()

    others = [s for s in range(shards) if s != own]
    outcomes = await asyncio.gather(
        *(asyncio.wait_for(one(s), timeout) for s in others), return_exceptions=True
    )
    answers: dict[int, Any] = {}
    missing: dict[int, str] = {}
    for shard, outcome in zip(others, outcomes, strict=True):
        if isinstance(outcome, ShardUnavailable):
            missing[shard] = str(outcome)
        elif isinstance(outcome, (TimeoutError, httpx.HTTPError, ValueError)):
            missing[shard] = (
                f"shard {shard} did not answer in {timeout:g} s"
                if isinstance(outcome, TimeoutError)
                else f"shard {shard}: {outcome}"
            )
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            answers[shard] = outcome
    return answers, missing
