"""The NATS connection under the adapter, and the pool that shares it.

One `_Connection` per (URL, credentials, event loop) serves every handle and watcher
opened from that loop and closes with the last handle (or with the loop). It owns
connecting (with reasons a person can act on, credentials scrubbed), request/reply with
nats-py's errors turned into KVError, JetStream API requests, and the one wildcard reply
inbox that collects Direct Get's multi-message replies.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, Protocol
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from flowtide.errors import NatsError
from flowtide.kv.base import KVError
from flowtide.kv.errors import KVUnavailableError
from flowtide.kv.nats.protocol import _ApiError, _Lost, _NoResponders, _status, _TooLarge
from flowtide.natsauth import (
    NATS_MAX_PINGS,
    NATS_PING_INTERVAL,
    NatsAuth,
    bounded_connect,
    close_quietly,
    is_refusal,
    is_tls_failure,
    tls_hint,
)

# One logger for the whole adapter, named as the package: levels and handlers set on
# "flowtide.kv.nats" cover every module.
_log = logging.getLogger("flowtide.kv.nats")

_CONNECT_TIMEOUT: Final = 2.0
_CONNECT_ATTEMPTS: Final = 2
_RECONNECT_WAIT: Final = 0.5


def redact_url(url: str) -> str:
    """Hide the password (or token) of each server in a NATS URL, for messages and reprs.

    Args:
        url: one URL or several separated by commas.
    Returns:
        The URL with `user:***@` (`***@` for a token) in place of the credentials.
    """
    return ",".join(_redact_one(part.strip()) for part in url.split(","))


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"
    return urlunsplit(parts._replace(netloc=f"{shown}@{hostport}"))


def _secrets(url: str) -> list[str]:
    found: list[str] = []
    for part in url.split(","):
        netloc = urlsplit(part.strip()).netloc
        if "@" in netloc:
            userinfo = netloc.rpartition("@")[0]
            user, colon, password = userinfo.partition(":")
            secret = password if colon else user
            if secret:
                found.append(secret)
    return found


def _is_auth_error(exc: BaseException) -> bool:
    return is_refusal(exc)


# nats-py lowercases the server's -ERR text, subject included: compared lowercased.
_DENIED_RE: Final = re.compile(
    r'permissions violation for (publish|subscription) to "?([^"\s]+)', re.IGNORECASE
)


class _Handle(Protocol):
    """A bucket handle, as its connection keeps it: destroy() through one handle ends
    the others on the same bucket."""

    @property
    def bucket(self) -> str: ...

    def _bucket_gone(self) -> None: ...


class _Watch(Protocol):
    """A watcher, as its connection and its handle keep it."""

    def _schedule_reset(self) -> None: ...

    def _finish(self) -> None: ...


class _Connection:
    """One NATS connection shared by every handle of one (URL, credentials, event loop)."""

    def __init__(
        self, url: str, loop: asyncio.AbstractEventLoop, auth: NatsAuth | None = None
    ) -> None:
        self.url = url
        self.auth = auth if auth is not None else NatsAuth()
        self.shown = redact_url(url)
        self.loop = loop
        self.nc: Client | None = None
        self.refs = 0
        self.closed = False
        self.handles: weakref.WeakSet[_Handle] = weakref.WeakSet()
        self.watchers: weakref.WeakSet[_Watch] = weakref.WeakSet()
        self._secrets = _secrets(url) + self.auth.secrets()
        # Subjects the server refused this user ("publish" or "subscription" -> subjects):
        # a refused request gets no reply, only an asynchronous -ERR; its timeout then
        # says why.
        self._denied: dict[str, set[str]] = {"publish": set(), "subscription": set()}
        self._connecting: asyncio.Task[None] | None = None
        self._waiting = 0
        self._connected_once = False
        self._last_error: BaseException | None = None
        # Any connect attempt refused for credentials: later attempts of the same
        # connect may only see the server hang up, which would hide the reason.
        self._refused = False
        # One warning per outage: the client retries every 0.5 s and reports each failure.
        self._warned = False
        self._mux_prefix: str | None = None
        self._mux_lock = asyncio.Lock()
        self._mux_waiters: dict[str, _Replies] = {}
        # Single-message replies on the same inbox (pipelined publishes' acks).
        self._mux_single: dict[str, asyncio.Future[Msg]] = {}
        self._mux_next = 0
        # Clean-up work (unsubscribe, consumer delete) that must not be cancelled with
        # the caller; awaited before the connection closes.
        self._tasks: set[asyncio.Task[Any]] = set()
        self._guard: asyncio.Task[None] | None = None

    # -- lifecycle

    async def acquire(self) -> None:
        if self._connecting is None:
            self._connecting = self.loop.create_task(self._connect())
        self._waiting += 1
        try:
            # Shielded: one caller giving up must not cancel the others' connect.
            await asyncio.shield(self._connecting)
        except BaseException:
            self._waiting -= 1
            if self._waiting == 0 and self.refs == 0:
                self._connecting.add_done_callback(self._close_if_unused)
            raise
        self._waiting -= 1
        self.refs += 1

    def _close_if_unused(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        if self.refs == 0 and self._waiting == 0 and not self.closed:
            _forget_connection(self)
            self.closed = True
            if self._guard is not None:
                self._guard.cancel()
            if self.nc is not None:
                self.spawn(self.nc.close())

    async def _connect(self) -> None:
        from nats.aio.client import Client

        try:
            credentials = self.auth.options(self.url)
        except NatsError as exc:
            raise KVError(f"NATS at {self.shown}: {exc.message}") from None
        # (nats-py annotates the timeouts as int; they are seconds as floats.)
        options: dict[str, Any] = {
            **credentials,
            "servers": [part.strip() for part in self.url.split(",")],
            "name": "flowtide",
            "allow_reconnect": True,
            "connect_timeout": _CONNECT_TIMEOUT,
            "reconnect_time_wait": _RECONNECT_WAIT,
            "max_reconnect_attempts": _CONNECT_ATTEMPTS,
            # A frozen node is left after 6-8 s (flowtide.natsauth.NATS_PING_INTERVAL).
            "ping_interval": NATS_PING_INTERVAL,
            "max_outstanding_pings": NATS_MAX_PINGS,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "closed_cb": self._on_closed,
        }
        nc = Client()
        try:
            await bounded_connect(nc, options)
        except Exception as exc:
            # A failed connect leaves its transport open (a ws:// one holds an aiohttp
            # session that would otherwise be collected unclosed).
            await close_quietly(nc)
            # `from None`: a parser or transport error may quote the URL, password included.
            raise KVError(f"cannot connect to NATS at {self.shown}: {self._reason(exc)}") from None
        # The attempt limit is for the first connect only: a connection that worked
        # keeps trying, so a server restart never strands the handles.
        nc.options["max_reconnect_attempts"] = -1
        self.nc = nc
        self._connected_once = True
        self._guard = self.loop.create_task(self._close_with_loop())

    async def _close_with_loop(self) -> None:
        """Wait to be cancelled: by release(), or by the loop shutting down
        (asyncio.run cancels every task before it closes the loop). In the second case
        handles were dropped without close(); close the connection while the loop can
        still run, so its socket does not outlive the loop."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not self.closed:
                self.closed = True
                _forget_connection(self)
                if self.nc is not None:
                    try:
                        await self.nc.close()
                    except Exception as exc:  # the loop is going away: nothing else to do
                        _log.debug("closing NATS connection to %s: %s", self.shown, exc)
            raise

    def _reason(self, exc: BaseException) -> str:
        gave_up = isinstance(exc, nats.errors.NoServersError | TimeoutError)
        cause = self._last_error if gave_up else exc
        if cause is None:
            cause = exc
        if self._refused or _is_auth_error(cause):
            text = "authorization violation (wrong user, password or token)"
        elif is_tls_failure(cause):
            text = tls_hint(cause)
        elif isinstance(cause, ImportError):
            text = "ws:// and wss:// need aiohttp (pip install aiohttp)"
        else:
            text = str(cause) or type(cause).__name__
        return self.scrub(text)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    async def _on_error(self, exc: Exception) -> None:
        self._last_error = exc
        if not self._connected_once and _is_auth_error(exc):
            self._refused = True
        denied = _DENIED_RE.search(str(exc))
        if denied is not None:
            self._denied[denied.group(1).lower()].add(denied.group(2).lower())
            _log.warning("NATS at %s: %s", self.shown, self.scrub(str(exc)))
            return
        if self._connected_once:
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            _log.log(level, "NATS connection to %s: %s", self.shown, self.scrub(str(exc)))

    async def _on_disconnected(self) -> None:
        if self._connected_once and not self.closed:
            _log.info("NATS connection to %s lost; reconnecting", self.shown)
        # What waits for a reply stops waiting now rather than at its timeout: a reply
        # the node that died held never comes (KVUnavailableError: its caller may try
        # again on the next connection, to another node of a cluster).
        for future in self._mux_single.values():
            if not future.done():
                future.set_exception(_Lost())
        for waiter in self._mux_waiters.values():
            if not waiter.done.done():
                waiter.done.set_exception(_Lost())

    async def _on_reconnected(self) -> None:
        _log.info("NATS connection to %s re-established", self.shown)
        self._warned = False
        # Ephemeral consumers may not have survived (a restarted server forgets them).
        for watcher in list(self.watchers):
            watcher._schedule_reset()

    async def _on_closed(self) -> None:
        self.closed = True
        _forget_connection(self)

    async def release(self) -> None:
        self.refs -= 1
        if self.refs > 0:
            return
        _forget_connection(self)
        self.closed = True
        if self._guard is not None:
            self._guard.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
        if self.nc is not None:
            try:
                await self.nc.close()
            except Exception as exc:  # closing a dead connection: nothing left to do
                _log.debug("closing NATS connection to %s: %s", self.shown, exc)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.debug("NATS clean-up on %s failed: %s", self.shown, task.exception())

    # -- requests

    @property
    def client(self) -> Client:
        if self.nc is None or self.closed or self.nc.is_closed:
            raise KVError(f"the NATS connection to {self.shown} is closed")
        return self.nc

    def _refusal(self, subject: str | None) -> str | None:
        """Why a request on `subject` got no reply, if the server refused it: publishing
        to the subject, or subscribing to the reply inbox."""
        if subject is not None and subject.lower() in self._denied["publish"]:
            return f"permissions violation: this NATS user may not publish to {subject}"
        if self._denied["subscription"]:
            inbox = sorted(self._denied["subscription"])[0]
            return (
                "permissions violation: this NATS user may not subscribe to its reply inbox"
                f" ({inbox})"
            )
        return None

    def transport_error(
        self, exc: BaseException, timeout: float, subject: str | None = None
    ) -> KVError:
        if isinstance(exc, nats.errors.TimeoutError | asyncio.TimeoutError):
            refusal = self._refusal(subject)
            if refusal is not None:
                return KVError(f"NATS at {self.shown} refused the request: {refusal}")
            state = " (disconnected, reconnecting)" if self.nc and self.nc.is_reconnecting else ""
            return KVUnavailableError(
                f"no reply from NATS at {self.shown} within {timeout:g} s{state}"
            )
        if isinstance(exc, nats.errors.ConnectionClosedError):
            return KVError(f"the NATS connection to {self.shown} is closed")
        if isinstance(exc, nats.errors.OutboundBufferLimitError):
            return KVUnavailableError(
                f"NATS at {self.shown} is unreachable and the send buffer is full"
            )
        return KVError(f"NATS request to {self.shown} failed: {self.scrub(str(exc) or repr(exc))}")

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        *,
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> Msg:
        # On the connection's own reply inbox (not nats-py's request), so that a lost
        # connection ends the wait at once (_on_disconnected).
        prefix = await self._mux()
        token, future = self.expect_reply()
        try:
            try:
                await self.client.publish(subject, payload, reply=prefix + token, headers=headers)
            except nats.errors.MaxPayloadError:
                raise _TooLarge(subject) from None
            except (nats.errors.Error, OSError) as exc:
                raise self.transport_error(exc, timeout, subject) from exc
            await asyncio.wait((future,), timeout=timeout)
            if not future.done():
                raise self.transport_error(TimeoutError(), timeout, subject)
            try:
                msg = future.result()
            except _Lost:
                raise self.lost(subject) from None
        finally:
            self.forget_reply(token)
        if _status(msg) == "503":
            raise _NoResponders(subject)
        return msg

    def lost(self, subject: str | None = None) -> KVUnavailableError:
        """The error of a request whose connection dropped before its reply came."""
        where = f" ({subject})" if subject else ""
        return KVUnavailableError(
            f"the NATS connection to {self.shown} dropped before the reply{where}; the"
            " request may or may not have been applied"
        )

    async def api(self, subject: str, body: dict[str, Any] | None, *, timeout: float) -> Any:
        payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        try:
            msg = await self.request(subject, payload, timeout=timeout)
        except _NoResponders:
            raise KVError(f"JetStream is not enabled on the NATS server at {self.shown}") from None
        try:
            reply = json.loads(msg.data)
        except ValueError:
            raise KVError(f"unreadable JetStream reply on {subject}") from None
        if isinstance(reply, dict) and reply.get("error"):
            raise _ApiError(reply["error"])
        return reply

    async def _mux(self) -> str:
        if self._mux_prefix is None:
            async with self._mux_lock:
                if self._mux_prefix is None:
                    nc = self.client
                    prefix = nc.new_inbox() + "."
                    try:
                        await nc.subscribe(prefix + "*", cb=self._on_mux_msg)
                    except (nats.errors.Error, OSError) as exc:
                        raise self.transport_error(exc, 0) from exc
                    self._mux_prefix = prefix
        return self._mux_prefix

    async def reply_inbox(self) -> str:
        """The prefix of this connection's wildcard reply inbox (subscribed on first use);
        a reply subject is the prefix plus a token from `expect_reply`."""
        return await self._mux()

    def expect_reply(self) -> tuple[str, asyncio.Future[Msg]]:
        """A fresh token on the reply inbox and the future its one reply completes
        (a status reply too); `forget_reply` when no longer waiting."""
        self._mux_next += 1
        token = str(self._mux_next)
        future: asyncio.Future[Msg] = self.loop.create_future()
        self._mux_single[token] = future
        return token, future

    def forget_reply(self, token: str) -> None:
        self._mux_single.pop(token, None)

    async def _on_mux_msg(self, msg: Msg) -> None:
        prefix = self._mux_prefix or ""
        token = msg.subject[len(prefix) :]
        single = self._mux_single.pop(token, None)
        if single is not None:
            if not single.done():
                single.set_result(msg)
            return
        reply = self._mux_waiters.get(token)
        if reply is None or reply.done.done():
            return
        if _status(msg) is None:
            reply.msgs.append(msg)
        else:
            reply.end = msg
            reply.done.set_result(None)

    async def request_many(
        self, subject: str, body: dict[str, Any], *, timeout: float
    ) -> tuple[list[Msg], Msg]:
        """Send a request whose reply is several messages ended by a status message.

        Returns the data messages and the status message that ended them (204 EOB,
        404, 408, 413). Raises _NoResponders for a 503. Times out only when no
        message arrives for `timeout` seconds, however long the whole reply is.
        """
        prefix = await self._mux()
        self._mux_next += 1
        token = str(self._mux_next)
        reply = _Replies(self.loop.create_future())
        self._mux_waiters[token] = reply
        try:
            try:
                await self.client.publish(
                    subject, json.dumps(body, separators=(",", ":")).encode(), reply=prefix + token
                )
            except nats.errors.MaxPayloadError:
                raise _TooLarge(subject) from None
            except (nats.errors.Error, OSError) as exc:
                raise self.transport_error(exc, timeout) from exc
            await self.wait_progress(reply.done, reply.msgs.__len__, timeout, subject)
        finally:
            del self._mux_waiters[token]
        assert reply.end is not None
        if _status(reply.end) == "503":
            raise _NoResponders(subject)
        return reply.msgs, reply.end

    async def wait_progress(
        self,
        done: asyncio.Future[Any],
        progress: Callable[[], int],
        timeout: float,
        subject: str | None = None,
    ) -> None:
        """Wait for `done`; fail when `progress()` stays put for `timeout` seconds.

        One future for a whole run of messages: a wait per message (wait_for creates a
        task each time) cost more than handling the message."""
        seen = -1
        while not done.done():
            now = progress()
            if now == seen:
                raise self.transport_error(TimeoutError(), timeout, subject)
            seen = now
            await asyncio.wait((done,), timeout=timeout)
        if not done.cancelled() and isinstance(done.exception(), _Lost):
            raise self.lost(subject)


@dataclass(slots=True)
class _Replies:
    done: asyncio.Future[None]
    msgs: list[Msg] = field(default_factory=list)
    end: Msg | None = None


_POOL: dict[tuple[str, NatsAuth, asyncio.AbstractEventLoop], _Connection] = {}
# Handles on different threads (each with its own loop) share the pool dictionary.
_POOL_LOCK: Final = threading.Lock()


def _forget_connection(conn: _Connection) -> None:
    with _POOL_LOCK:
        key = (conn.url, conn.auth, conn.loop)
        if _POOL.get(key) is conn:
            del _POOL[key]


async def _acquire(url: str, auth: NatsAuth) -> _Connection:
    loop = asyncio.get_running_loop()
    key = (url, auth, loop)
    while True:
        with _POOL_LOCK:
            for stale in [k for k in _POOL if k[2].is_closed()]:
                del _POOL[stale]
            conn = _POOL.get(key)
            if conn is None or conn.closed:
                conn = _Connection(url, loop, auth)
                _POOL[key] = conn
        try:
            await conn.acquire()
        except KVError:
            _forget_connection(conn)
            raise
        if not conn.closed:
            return conn
        # It closed between connecting and now (server gone for good): start over.
        conn.refs -= 1
