"""The worker's own calls to the server (claims, reports, heartbeats), on one aiohttp
session."""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flowtide.errors import ServerError
from flowtide.wire import SHARD_HEADER

__all__ = ["Api", "Reply"]


@dataclass(frozen=True)
class Reply:
    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise ServerError(f"HTTP {self.status_code}: {self.text[:500]}", self.status_code)


class Api:
    """The worker's own calls to the server, on one aiohttp session (kept-alive
    connections). aiohttp rather than httpx here: on a claim's path it takes about 1 ms
    less per request than httpx's async client (bench/RESULTS.md)."""

    def __init__(
        self, server: str, timeout: float, headers: Mapping[str, str], tls: ssl.SSLContext
    ) -> None:
        self.server = server
        self.timeout = timeout
        self.headers = dict(headers)
        self.tls = tls
        self._session: Any = None

    async def __aenter__(self) -> Api:
        import aiohttp

        self._errors: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            headers=self.headers,
            connector=aiohttp.TCPConnector(ssl=self.tls),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    async def post(self, path: str, body: Any, *, shard: int | None = None) -> Reply:
        """POST `body` as JSON; the reply, whatever its status. Raises ServerError when none
        came (connection refused or lost, timeout). `shard`: the shard the body is for
        (`X-Flowtide-Shard`: whichever server gets it forwards it there)."""
        return await self.post_json(path, json.dumps(body).encode(), shard=shard)

    async def post_json(self, path: str, data: bytes, *, shard: int | None = None) -> Reply:
        """POST JSON text already encoded (see `post`)."""
        headers = {"content-type": "application/json"}
        if shard is not None:
            headers[SHARD_HEADER] = str(shard)
        try:
            async with self._session.post(self.server + path, data=data, headers=headers) as r:
                return Reply(r.status, await r.read())
        except self._errors as exc:
            raise ServerError(f"POST {path}: {str(exc) or type(exc).__name__}") from exc
