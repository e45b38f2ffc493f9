"""Command notifications pulled from the pool's JetStream consumer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from flowtide.wire import COMMAND_STREAM

__all__ = ["Puller", "check_consumer"]

log = logging.getLogger("flowtide.worker")


class Puller:
    """Pull requests on a JetStream consumer kept open for a worker's free slots, with the
    messages handed over as they arrive.

    nats-py's `fetch(batch=n)` returns once it has n messages or its pull request ends:
    when fewer than n arrive on a lingering request, the ones that did wait for its
    expiry (up to a second here, seen as 0.8 s gaps in a loop's log). Here each message
    is the caller's as soon as it lands, with whatever else landed meanwhile.

    `credit` counts the messages asked for and not delivered: a request that expires
    ends with a 408 status saying how many of its batch it did not deliver. The credit
    of requests lost otherwise (a reconnect, a 409) is dropped once every request asked
    for must have expired, or at once when the connection was re-established (the
    requests lived on the old one: in a NATS cluster, the node that held them may have
    died, and its consumer's next leader never heard of them).
    """

    def __init__(
        self, nc: Any, stream: str, consumer: str, changed: asyncio.Event, *, expires: float = 5.0
    ) -> None:
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.expires = expires
        self.credit = 0
        self._asked_at = 0.0
        self._reconnects = self._reconnects_now()
        self._inbox = nc.new_inbox()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._sub: Any = None
        #: Set when credit was returned (a request ended) or nothing arrived for a while:
        #: the asker looks again.
        self.changed = changed

    async def start(self) -> None:
        async def deliver(msg: Any) -> None:
            self._queue.put_nowait(msg)

        self._sub = await self.nc.subscribe(self._inbox, cb=deliver)

    async def ask(self, free: int, *, top_up: bool = False) -> bool:
        """Ask for messages up to `free` minus what is already asked for; small top-ups
        wait until a quarter of the slots are free (or the caller says `top_up`), so
        that a busy worker keeps a few requests open rather than one per finished
        command. True when a top-up was left for later."""
        now = time.monotonic()
        if self.credit and now - self._asked_at > self.expires + 2.0:
            self.credit = 0  # every request asked for has expired by now
        reconnects = self._reconnects_now()
        if reconnects != self._reconnects:
            self._reconnects = reconnects
            self.credit = 0  # asked for on a connection that is gone
        want = free - self.credit
        if want <= 0:
            return False
        if self.credit and want < max(1, free // 4) and not top_up:
            return True

        body = {"batch": want, "expires": int(self.expires * 1e9)}
        await self.nc.publish(self.subject, json.dumps(body).encode(), reply=self._inbox)
        self.credit += want
        self._asked_at = now
        return False

    def _reconnects_now(self) -> int:
        stats = getattr(self.nc, "stats", None)
        return int(stats.get("reconnects", 0)) if isinstance(stats, dict) else 0

    async def take(self, timeout: float) -> list[Any]:
        """The messages that arrived (at least one, or none after `timeout` seconds)."""
        try:
            # (asyncio.timeout, not wait_for: on 3.11 wait_for runs the get in a task of
            # its own, one more turn of the loop before the message is the caller's.)
            async with asyncio.timeout(timeout):
                first = await self._queue.get()
        except TimeoutError:
            self.changed.set()  # a stale credit is dropped by the next ask
            return []
        got = [first]
        while not self._queue.empty():
            got.append(self._queue.get_nowait())
        msgs = []
        for msg in got:
            status = msg.headers.get("Status") if msg.headers else None
            if status is None and msg.reply:
                self.credit -= 1
                msgs.append(msg)
            elif status is not None:
                # 408: the request expired; 409: it was ended (consumer changed, too
                # many waiting). Either way its undelivered part is no longer asked for.
                undelivered = msg.headers.get("Nats-Pending-Messages")
                if undelivered is not None:
                    self.credit -= int(undelivered)
                elif status != "100":
                    log.info("pull request ended: %s %s", status, msg.headers.get("Description"))
                self.changed.set()
        self.credit = max(0, self.credit)
        return msgs

    async def close(self) -> list[Any]:
        """Stop receiving; the messages received and not taken (to be nak'ed)."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        left = []
        while not self._queue.empty():
            msg = self._queue.get_nowait()
            if msg.reply and "Status" not in (msg.headers or {}):
                left.append(msg)
        return left


async def check_consumer(js: Any, durable: str, *, nats_url: str, pool: str) -> None:
    """Fail clearly when the pool's consumer is missing or out of reach. The server
    creates it (`ensure_consumer`) when the worker registers: a worker's NATS user
    may pull from it, never create it.

    Raises:
        NatsError: the consumer is missing, or this NATS user may not read its info.
    """
    import nats.errors
    from nats.js.errors import NotFoundError

    from flowtide.errors import NatsError
    from flowtide.urls import redact_url

    where = f"consumer {durable} of stream {COMMAND_STREAM} at {redact_url(nats_url)}"
    try:
        await js.consumer_info(COMMAND_STREAM, durable)
    except NotFoundError:
        raise NatsError(
            f"no {where}: the server creates it when a worker registers"
            " (is the server connected to the same NATS, with --nats?)",
            url=redact_url(nats_url),
        ) from None
    except nats.errors.TimeoutError:
        # A refused request gets no reply; the refusal itself is logged just before.
        raise NatsError(
            f"no answer about {where} (a permissions violation logged above means"
            " this NATS user is not the one for pool " + repr(pool) + ")",
            url=redact_url(nats_url),
        ) from None
