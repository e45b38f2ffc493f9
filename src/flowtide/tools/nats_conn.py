"""Where a nats task connects, and the connections it gets.

**Which server.** As NoETL's `noetl/tools/nats/auth.py` does: `auth` names a credential
alias (or is a mapping: `{credential: alias}` plus fields that override it, or the
fields themselves) whose body holds the server's `url` (also `nats_url`, `server`,
`servers`) and `user`/`password` (also `username`, `nats_user`, `nats_password`) or a
`token` (`nats_token`); `tls_ca` is the PEM file of the CA of a TLS server, `creds` a
`.creds` file. The task's own `nats_url`, `nats_user`, `nats_password` and `nats_token`
win over the credential's, as NoETL's task fields do. Every password, token and URL
with credentials goes to `ctx.secrets`; what a message shows of a URL is
`nats://user:***@host`. flowtide's own NATS credentials (FLOWTIDE_NATS_*) are never
used: a playbook reaches only what its credentials open.

**Connections.** Every NATS call of every nats task runs on one event loop, in a thread
of its own, so connections outlive a task: one per (URL, credentials), shared by all
tasks and threads. A `Link` holds the nats-py client (publish, request, JetStream,
object store) and the KV handles by bucket (`flowtide.kv.connect`, whose NATS adapter
itself shares one connection per URL and credentials on that loop). `close_connections`
closes them all (at exit; tests call it too).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from flowtide.errors import ToolError
from flowtide.natsauth import NatsAuth, connect_nats, url_has_credentials
from flowtide.tools.base import ToolContext
from flowtide.urls import redact_url

if TYPE_CHECKING:
    from nats.aio.client import Client

    from flowtide.kv import KeyValue

__all__ = ["Link", "NatsTarget", "close_connections", "link_count", "run_on_loop", "target_of"]

T = TypeVar("T")

# NoETL's field names (noetl/tools/nats/auth.py `field_mapping`) -> ours.
_CREDENTIAL_FIELDS: dict[str, tuple[str, ...]] = {
    "url": ("nats_url", "url", "server", "servers"),
    "user": ("nats_user", "user", "username"),
    "password": ("nats_password", "password"),
    "token": ("nats_token", "token"),
    "ca": ("tls_ca", "ca"),
    "creds": ("creds", "credentials_file"),
}
# The task's own fields that override the credential's (NoETL's task_with).
_TASK_FIELDS: dict[str, str] = {
    "url": "nats_url",
    "user": "nats_user",
    "password": "nats_password",
    "token": "nats_token",
}


@dataclass(frozen=True)
class NatsTarget:
    """A server and the credentials to use on it (a URL may carry its own); `shown` is
    the URL without secrets."""

    url: str
    auth: NatsAuth
    shown: str


def _invalid(message: str) -> ToolError:
    return ToolError(message, kind="config_error")


def _first(body: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        value = body.get(name)
        if value not in (None, ""):
            return value
    return None


def _credential_body(config: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    ref = config.get("auth")
    if ref in (None, ""):
        ref = config.get("credential")
    if ref in (None, ""):
        return {}
    if isinstance(ref, str):
        return ctx.resolve_credential(ref.strip())
    if isinstance(ref, Mapping):
        body = dict(ref)
        alias = body.get("credential") or body.get("key") or body.get("alias")
        if isinstance(alias, str) and alias:
            resolved = ctx.resolve_credential(alias)
            resolved.update(
                {k: v for k, v in body.items() if k not in ("credential", "key", "alias")}
            )
            body = resolved
        return body
    raise _invalid(f"nats `auth` must be a credential alias or a mapping, not {type(ref).__name__}")


def target_of(config: Mapping[str, Any], ctx: ToolContext) -> NatsTarget:
    """The server and credentials of a nats task; every secret is added to ctx.secrets.

    Raises:
        ToolError: kind `credential` (unknown alias) or `config_error` (no URL, client
            certificates).
    """
    body = _credential_body(config, ctx)
    fields = {name: _first(body, names) for name, names in _CREDENTIAL_FIELDS.items()}
    for name, task_field in _TASK_FIELDS.items():
        if config.get(task_field) not in (None, ""):
            fields[name] = config[task_field]
    for name in ("password", "token"):
        if fields[name] is not None:
            ctx.add_secret(str(fields[name]))
    if _first(body, ("tls_cert", "tls_key")) is not None:
        raise _invalid(
            "nats: client certificates (tls_cert, tls_key) are not supported; use a user and"
            " password, a token or a .creds file"
        )
    url = fields["url"]
    if isinstance(url, list | tuple):
        url = ",".join(str(part) for part in url)
    if not isinstance(url, str) or not url.strip():
        raise _invalid(
            "NATS URL is not configured: use `auth: <credential>` (a credential with `url`)"
            " or `nats_url` on the task"
        )
    servers = [part.strip() for part in url.split(",") if part.strip()]
    url = ",".join(part if "://" in part else f"nats://{part}" for part in servers)
    if url_has_credentials(url):
        ctx.add_secret(url)
        for part in url.split(","):
            userinfo = part.partition("://")[2].rpartition("@")[0]
            ctx.add_secret(userinfo.rpartition(":")[2])
    user, password = fields["user"], fields["password"]
    if user is None or password is None:
        user = password = None  # a user and a password, or neither (NoETL's rule)

    def text(value: Any) -> str | None:
        return None if value is None else str(value)

    auth = NatsAuth(
        user=text(user),
        password=text(password),
        creds=text(fields["creds"]),
        ca=text(fields["ca"]),
        token=None if user is not None else text(fields["token"]),
    )
    return NatsTarget(url, auth, redact_url(url))


# ---------------------------------------------------------------------------------------
# The loop the calls run on, and the pooled connections
# ---------------------------------------------------------------------------------------


class Link:
    """The connections to one (URL, credentials): a nats-py client and KV handles.
    Used only on the loop's thread."""

    def __init__(self, target: NatsTarget) -> None:
        self.target = target
        self.nc: Client | None = None
        self.buckets: dict[str, KeyValue] = {}
        self.lock = asyncio.Lock()

    async def client(self) -> Client:
        async with self.lock:
            if self.nc is None or self.nc.is_closed:
                t = self.target
                self.nc = await connect_nats(t.url, t.auth, name="flowtide-nats-tool", wait=False)
            return self.nc

    async def bucket(self, name: str, *, create: bool, **config: Any) -> KeyValue:
        from flowtide.kv import connect

        async with self.lock:
            kv = self.buckets.get(name)
            if kv is None:
                t = self.target
                kv = await connect(t.url, name, create=create, nats_auth=t.auth, **config)
                self.buckets[name] = kv
            return kv

    async def forget(self, name: str) -> None:
        kv = self.buckets.pop(name, None)
        if kv is not None:
            with contextlib.suppress(Exception):
                await kv.close()

    async def close(self) -> None:
        for name in list(self.buckets):
            await self.forget(name)
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), 5.0)


class _Loop:
    """An event loop running in a daemon thread, and the links opened on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.links: dict[tuple[str, NatsAuth], Link] = {}
        self.thread = threading.Thread(target=self._main, name="flowtide-nats-tool", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def link(self, target: NatsTarget) -> Link:
        key = (target.url, target.auth)
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = Link(target)
        return link

    def close(self) -> None:
        async def close_all() -> None:
            links, self.links = list(self.links.values()), {}
            for link in links:
                await link.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(15.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        if not self.thread.is_alive():
            self.loop.close()


_loop: _Loop | None = None
_loop_lock = threading.Lock()


def _the_loop() -> _Loop:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = _Loop()
            atexit.register(close_connections)
        return _loop


def close_connections() -> None:
    """Close every pooled NATS connection of the nats tool and stop its loop (at exit;
    tests call it too). The next call starts afresh."""
    global _loop
    with _loop_lock:
        loop, _loop = _loop, None
    if loop is not None:
        loop.close()
    with contextlib.suppress(ValueError):
        atexit.unregister(close_connections)


def link_count() -> int:
    """How many (URL, credentials) the tool holds connections to."""
    loop = _loop
    return len(loop.links) if loop is not None else 0


def run_on_loop(
    call: Callable[[Link], Coroutine[Any, Any, T]],
    target: NatsTarget,
    *,
    timeout: float,
    cancelled: Callable[[], bool] | None,
    what: str,
) -> T:
    """Run `call(link)` on the tool's loop with the link of `target`; wait for it at
    most `timeout` seconds, asking `cancelled()` meanwhile.

    Raises:
        ToolError: kind `timeout` (retryable) or `cancelled`; whatever `call` raises.
    """
    loop = _the_loop()

    async def with_link() -> T:
        return await call(loop.link(target))

    future = asyncio.run_coroutine_threadsafe(with_link(), loop.loop)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        done, _ = concurrent.futures.wait([future], timeout=max(0.0, min(0.1, left)))
        if done:
            return future.result()
        if cancelled is not None and cancelled():
            future.cancel()
            raise ToolError(f"{what} stopped: the execution was cancelled", kind="cancelled")
        if left <= 0:
            future.cancel()
            raise ToolError(
                f"{what} on NATS at {target.shown} took longer than {timeout:g} s",
                kind="timeout",
                retryable=True,
                code="timeout",
            )
