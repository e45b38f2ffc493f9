"""Sending an upstream HTTP answer on to an ASGI client as its bytes come: a server
forwarding a request to another shard's server (`flowtide.server.forwarding`) and the dev
stack's browser proxy (`flowtide.dev.uiproxy`) both do it.

    await relay(response, headers, receive, send)   # response: an httpx streamed answer
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["relay"]

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def relay(
    response: Any, headers: list[tuple[bytes, bytes]], receive: Receive, send: Send
) -> None:
    """Send `response` (status, `headers`, then its body chunk by chunk) until it ends or
    the client goes away (then it stops reading the upstream). The request body must be
    read already: what `receive` gives next is the client's disconnect.

    Raises:
        Exception: what the upstream raised mid-answer; the client's answer is left
            unfinished (a cut answer, never one that looks complete).
    """
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.create_task(watch())
    try:
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        chunks = response.aiter_raw().__aiter__()
        while not gone.is_set():
            step = asyncio.ensure_future(chunks.__anext__())
            waiting = asyncio.ensure_future(gone.wait())
            done, _ = await asyncio.wait({step, waiting}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if step not in done:
                step.cancel()
                with contextlib.suppress(BaseException):
                    await step
                return
            try:
                chunk = step.result()
            except StopAsyncIteration:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        watcher.cancel()
        with contextlib.suppress(BaseException):
            await watcher
