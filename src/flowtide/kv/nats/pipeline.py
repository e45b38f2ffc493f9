"""Pipelined requests on one connection: many publishes sent without waiting for each
reply, the replies gathered on the connection's reply inbox (`create_many`'s writes).

A request/reply per message costs a round trip each; here the publishes go out back to
back (nats-py buffers them and its flusher writes them together) and only the number of
unanswered ones is bounded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

import nats.errors
from nats.aio.msg import Msg

from flowtide.kv.base import KVError
from flowtide.kv.errors import KVUnavailableError
from flowtide.kv.nats.connection import _Connection
from flowtide.kv.nats.protocol import _Lost, _NoResponders, _status, _TooLarge

Request = tuple[str, bytes, dict[str, str] | None]


async def request_pipelined(
    conn: _Connection, requests: Sequence[Request], *, timeout: float, window: int
) -> list[Msg | Exception]:
    """Send each (subject, payload, headers) with a reply subject on the connection's
    inbox, at most `window` of them unanswered at a time.

    Returns:
        Per request, in order: its reply, or the error it met: _NoResponders (a 503
        reply), _TooLarge (over the server's max_payload) or KVError (the publish
        failed, or no reply within `timeout` of sending it). Once a request got no
        reply in time the server is taken as not answering: the requests not sent yet
        are not sent (KVError saying so) and those unanswered fail at once.
    Raises:
        KVError: the connection is closed, or its reply inbox cannot be subscribed.
    """
    prefix = await conn.reply_inbox()
    nc = conn.client
    loop = asyncio.get_running_loop()
    out: list[Msg | Exception | None] = [None] * len(requests)
    waiting: deque[tuple[int, str, asyncio.Future[Msg], float]] = deque()
    stalled: KVError | None = None

    async def settle() -> None:
        nonlocal stalled
        index, token, future, deadline = waiting.popleft()
        subject = requests[index][0]
        if not future.done() and stalled is None:
            await asyncio.wait((future,), timeout=max(0.0, deadline - loop.time()))
        conn.forget_reply(token)
        if not future.done():
            error = conn.transport_error(TimeoutError(), timeout, subject)
            out[index] = error
            stalled = stalled or error
        elif isinstance(future.exception(), _Lost):
            out[index] = conn.lost(subject)
        else:
            msg = future.result()
            out[index] = _NoResponders(subject) if _status(msg) == "503" else msg

    try:
        for index, (subject, payload, headers) in enumerate(requests):
            while len(waiting) >= window and stalled is None:
                await settle()
            if stalled is not None:
                kind = KVUnavailableError if isinstance(stalled, KVUnavailableError) else KVError
                out[index] = kind(f"not sent after an earlier write failed: {stalled.message}")
                continue
            token, future = conn.expect_reply()
            try:
                await nc.publish(subject, payload, reply=prefix + token, headers=headers)
            except nats.errors.MaxPayloadError:
                conn.forget_reply(token)
                out[index] = _TooLarge(subject)
                continue
            except (nats.errors.Error, OSError) as exc:
                conn.forget_reply(token)
                out[index] = conn.transport_error(exc, timeout, subject)
                continue
            waiting.append((index, token, future, loop.time() + timeout))
        while waiting:
            await settle()
    finally:
        # Cancelled: late replies find no waiter and are dropped.
        for _, token, _, _ in waiting:
            conn.forget_reply(token)
    return [KVError("internal: no outcome") if o is None else o for o in out]
