"""Credentials of flowtide's NATS connections, and connecting with them.

Every process that talks to NATS (server, worker, `run --kv`, `kv` commands) takes its
credentials from, first to last:

1. the URL: `nats://user:password@host:4222` (or `nats://token@host:4222`);
2. a `.creds` file (`--nats-creds FILE` or FLOWTIDE_NATS_CREDS): a user JWT and its
   nkey seed, for NATS's decentralised JWT authentication;
3. FLOWTIDE_NATS_USER and FLOWTIDE_NATS_PASSWORD.

The last two keep secrets off command lines, which any local user can read in `ps`: the
dev stack hands each process its own user this way. Messages name a URL as
`nats://user:***@host` and never carry a password.

TLS: a server that requires it (its INFO says `tls_required`, or the URL is `tls://`) is
verified against the CA file in FLOWTIDE_NATS_CA (PEM), or the system's trusted CAs when
that is unset. The dev stack with TLS on (the default) runs nats-server with a certificate
of its own CA and sets FLOWTIDE_NATS_CA for every process it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from flowtide.errors import NatsError
from flowtide.urls import redact_url, scrub_url

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = [
    "NatsAuth",
    "bounded_connect",
    "close_quietly",
    "connect_nats",
    "is_refusal",
    "is_tls_failure",
    "tls_hint",
    "url_has_credentials",
]

log = logging.getLogger("flowtide.nats")

#: The largest .creds file read (one is a JWT and a seed: a few KiB).
MAX_CREDS_BYTES: Final = 64 * 1024


def _nonblocking(path: str, flags: int) -> int:
    """Open without waiting for a FIFO's writer (it is refused right after)."""
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


ENV_USER: Final = "FLOWTIDE_NATS_USER"
ENV_PASSWORD: Final = "FLOWTIDE_NATS_PASSWORD"
ENV_CREDS: Final = "FLOWTIDE_NATS_CREDS"
ENV_CA: Final = "FLOWTIDE_NATS_CA"

_CONNECT_TIMEOUT: Final = 2.0
_CONNECT_ATTEMPTS: Final = 2
_RECONNECT_WAIT: Final = 0.5
#: Seconds between the client's pings, and the pings unanswered before the connection
#: counts as dead: a node that froze (SIGSTOP, a VM paused) keeps its sockets open, and
#: nats-py's defaults (2 min x 2) would keep a process on it that long; with these it
#: goes to another node of a cluster after 6 to 8 s. NATS_PING_INTERVAL and
#: NATS_MAX_PINGS are shared with the KV adapter (flowtide.kv.nats.connection).
NATS_PING_INTERVAL: Final = 2
NATS_MAX_PINGS: Final = 3
_RETRY_WAIT: Final = 1.0


def url_has_credentials(url: str) -> bool:
    """Whether any server of `url` (comma-separated) carries `user:password@` or `token@`."""
    return any("@" in part.partition("://")[2] for part in url.split(","))


def is_refusal(exc: BaseException) -> bool:
    """Whether `exc` is nats-py's word that the server refused the credentials."""
    import nats.errors

    # (nats-py lowercases the server's -ERR text once connected, not while connecting.)
    return isinstance(exc, nats.errors.AuthorizationError) or (
        "authorization violation" in str(exc).lower()
    )


def is_tls_failure(exc: BaseException) -> bool:
    """Whether `exc` is a failed TLS handshake (an untrusted certificate, say): as final
    as a refused password, never worth retrying."""
    return isinstance(exc, ssl.SSLError)


def tls_hint(exc: BaseException) -> str:
    """What to say about a failed TLS handshake."""
    reason = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or str(exc)
    return (
        f"TLS handshake failed ({reason}; certificate verify failed?): set {ENV_CA} to the"
        " PEM file of the CA that signed the server's certificate"
    )


async def bounded_connect(nc: Client, arguments: Mapping[str, Any]) -> None:
    """`nc.connect(**arguments)`, over as soon as a TLS handshake fails, and within the
    time its attempts may take.

    nats-py 2.16 never returns from a first connect whose TLS handshake failed when it
    may retry (it hangs closing the half-open transport after error_cb reported the
    failure); an untrusted certificate stays untrusted, so the first such failure ends
    the connect (raised as that ssl.SSLError), and a bound turns any other hang into a
    TimeoutError (error_cb has the cause).
    """
    _quiet_asyncio_tls_notice()
    attempts = max(1, int(arguments.get("max_reconnect_attempts", 1)) + 1)
    per_attempt = float(arguments.get("connect_timeout", 2)) + float(
        arguments.get("reconnect_time_wait", 2)
    )
    inner = arguments.get("error_cb")
    failures: list[BaseException] = []
    failed = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        if inner is not None:
            await inner(exc)
        if is_tls_failure(exc) and not nc.is_connected:
            failures.append(exc)
            failed.set()

    connect = asyncio.ensure_future(nc.connect(**{**arguments, "error_cb": on_error}))
    waiter = asyncio.ensure_future(failed.wait())
    try:
        done, _ = await asyncio.wait(
            {connect, waiter}, timeout=attempts * per_attempt + 2.0, return_when="FIRST_COMPLETED"
        )
    finally:
        waiter.cancel()
    if connect in done:
        connect.result()
        return
    connect.cancel()
    with contextlib.suppress(BaseException):
        await connect
    if failures:
        raise failures[0]
    raise TimeoutError(f"no connection after {attempts} attempts")


class _TlsNoticeFilter(logging.Filter):
    # asyncio logs this for every TLS connection nats-py closes: noise, not a problem.
    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


_NOTICE_FILTER = _TlsNoticeFilter()


def _quiet_asyncio_tls_notice() -> None:
    logger = logging.getLogger("asyncio")
    if _NOTICE_FILTER not in logger.filters:
        logger.addFilter(_NOTICE_FILTER)


async def close_quietly(nc: Client) -> None:
    """Close a client that failed to connect, within two seconds (see bounded_connect)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 2.0)


@dataclass(frozen=True)
class NatsAuth:
    """Credentials for NATS connections besides those a URL carries (which win).

    Frozen and hashable: connections are shared per (URL, credentials).
    """

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    #: Path of a `.creds` file (user JWT + nkey seed).
    creds: str | None = None
    #: Path of the PEM file of the CA(s) that sign the NATS servers' certificates.
    ca: str | None = None
    #: A token (`authorization { token }` of nats-server), instead of a user; only
    #: given by a `kind: nats` step's credential, never read from the environment.
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, creds: str | None = None
    ) -> NatsAuth:
        """FLOWTIDE_NATS_USER / FLOWTIDE_NATS_PASSWORD / FLOWTIDE_NATS_CREDS; `creds` (the
        `--nats-creds` flag) wins over the variable."""
        from flowtide.settings import NatsSection, read

        tree = read(NatsSection, environ)
        return cls(
            user=tree.user or None,
            password=tree.password or None,
            creds=creds or tree.creds or None,
            ca=tree.ca or None,
        )

    def __bool__(self) -> bool:
        return bool(self.user or self.password or self.creds or self.token)

    def env(self) -> dict[str, str]:
        """The variables that hand these credentials to a child process."""
        out = {}
        if self.user:
            out[ENV_USER] = self.user
        if self.password:
            out[ENV_PASSWORD] = self.password
        if self.creds:
            out[ENV_CREDS] = self.creds
        if self.ca:
            out[ENV_CA] = self.ca
        return out

    def secrets(self) -> list[str]:
        """Values no message may show."""
        return [secret for secret in (self.password, self.token) if secret]

    def scrub(self, text: str, url: str) -> str:
        """`text` without the secrets of `url` and of these credentials."""
        text = scrub_url(text, url)
        for secret in self.secrets():
            text = text.replace(secret, "***")
        return text

    def check(self) -> None:
        """Raises NatsError when the credentials are incomplete or the creds file is
        unusable (before any connection attempt, so the message says what is wrong)."""
        if self.creds and (self.user or self.password):
            raise NatsError(
                f"give NATS credentials one way: --nats-creds/{ENV_CREDS} or "
                f"{ENV_USER}/{ENV_PASSWORD}, not both"
            )
        if bool(self.user) != bool(self.password):
            given, missing = (ENV_USER, ENV_PASSWORD) if self.user else (ENV_PASSWORD, ENV_USER)
            raise NatsError(f"{given} is set but {missing} is not")
        if self.creds:
            try:
                # A regular file of a creds file's size: a path such as /dev/zero (or a
                # FIFO) would be read (or waited on) forever.
                with open(self.creds, "rb", opener=_nonblocking) as handle:
                    facts = os.fstat(handle.fileno())
                    if not stat.S_ISREG(facts.st_mode) or facts.st_size > MAX_CREDS_BYTES:
                        raise NatsError(
                            f"{self.creds} is not a NATS .creds file (a regular file of at"
                            f" most {MAX_CREDS_BYTES // 1024} KiB)"
                        )
                    text = handle.read(MAX_CREDS_BYTES + 1)
            except OSError as exc:
                raise NatsError(
                    f"cannot read the NATS credentials file {self.creds}: {exc.strerror}"
                ) from None
            if b"BEGIN NATS USER JWT" not in text or b"BEGIN USER NKEY SEED" not in text:
                raise NatsError(
                    f"{self.creds} is not a NATS .creds file (a user JWT and an nkey seed)"
                )
            if importlib.util.find_spec("nkeys") is None:
                raise NatsError(
                    "a NATS .creds file needs the nkeys package: pip install 'flowtide[nats]'"
                )
        if self.ca and not os.path.isfile(self.ca):
            raise NatsError(f"{ENV_CA}: no such file {self.ca}")

    def options(self, url: str) -> dict[str, Any]:
        """Keyword arguments of nats-py's `connect` for `url`. A URL with credentials
        keeps them: nats-py would otherwise prefer the user and password options."""
        self.check()
        out: dict[str, Any] = {}
        if self.ca:
            try:
                out["tls"] = ssl.create_default_context(cafile=self.ca)
            except (OSError, ssl.SSLError) as exc:
                raise NatsError(f"{ENV_CA}: cannot load {self.ca}: {exc}") from None
        if url_has_credentials(url):
            return out
        if self.creds:
            out["user_credentials"] = self.creds
        elif self.user and self.password:
            out.update(user=self.user, password=self.password)
        elif self.token:
            out["token"] = self.token
        return out


async def connect_nats(
    url: str,
    auth: NatsAuth,
    *,
    name: str,
    wait: bool = True,
    **options: Any,
) -> Client:
    """A nats-py client connected to `url`, reconnecting forever once connected.

    Args:
        url: one or more NATS URLs (comma-separated), maybe with credentials.
        auth: credentials for a URL without them.
        name: the connection's name (nats-server's monitoring shows it).
        wait: keep trying while the server cannot be reached (it may start later);
            False to fail after a few attempts.
        options: more keyword arguments of nats-py's `connect` (`inbox_prefix`).
    Returns:
        The connected client.
    Raises:
        NatsError: the server refused the credentials (never retried: a wrong password
            stays wrong), the credentials are incomplete, or (`wait` False) the server
            cannot be reached. The message names the URL without its password.
    """
    from nats.aio.client import Client

    shown = redact_url(url)
    try:
        credentials = auth.options(url)
    except NatsError as exc:
        raise NatsError(f"NATS at {shown}: {exc.message}", url=shown) from None
    state = {"connected": False, "refused": False, "warned": False, "waiting": False}
    last: list[BaseException] = []

    async def on_error(exc: Exception) -> None:
        last[:] = [exc]
        if not state["connected"]:
            state["refused"] = state["refused"] or is_refusal(exc)
            return
        # Once per outage: the client retries every half second and reports each failure.
        # A permission violation is logged every time: each is a refused operation.
        denied = "permissions violation" in str(exc).lower()
        level = logging.DEBUG if state["warned"] and not denied else logging.WARNING
        state["warned"] = state["warned"] or not denied
        log.log(level, "NATS at %s: %s", shown, auth.scrub(str(exc), url))

    async def on_reconnected() -> None:
        state["warned"] = False
        log.info("NATS connection to %s re-established", shown)

    async def on_disconnected() -> None:
        if state["connected"] and not nc.is_closed:
            log.info("NATS connection to %s lost; reconnecting", shown)

    # (nats-py annotates the timeouts as int; they are seconds as floats.)
    arguments: dict[str, Any] = {
        "servers": [part.strip() for part in url.split(",")],
        "name": name,
        "connect_timeout": _CONNECT_TIMEOUT,
        "reconnect_time_wait": _RECONNECT_WAIT,
        "max_reconnect_attempts": _CONNECT_ATTEMPTS,
        "ping_interval": NATS_PING_INTERVAL,
        "max_outstanding_pings": NATS_MAX_PINGS,
        "error_cb": on_error,
        "reconnected_cb": on_reconnected,
        "disconnected_cb": on_disconnected,
        **credentials,
        **options,
    }
    while True:
        nc = Client()
        try:
            await bounded_connect(nc, arguments)
        except Exception as exc:
            await close_quietly(nc)
            cause = last[0] if last else exc
            if state["refused"] or is_refusal(cause):
                raise NatsError(
                    f"cannot connect to NATS at {shown}: authorization violation "
                    "(wrong user, password, token or credentials file)",
                    url=shown,
                ) from None
            if is_tls_failure(cause):
                raise NatsError(
                    f"cannot connect to NATS at {shown}: {tls_hint(cause)}", url=shown
                ) from None
            # `from None`: a transport error may quote the URL, password included.
            reason = auth.scrub(str(cause) or type(cause).__name__, url)
            if not wait:
                raise NatsError(f"cannot connect to NATS at {shown}: {reason}", url=shown) from None
            level = logging.DEBUG if state["waiting"] else logging.WARNING
            state["waiting"] = True
            log.log(level, "NATS at %s not reachable (%s); trying again", shown, reason)
            last.clear()
            await asyncio.sleep(_RETRY_WAIT)
            continue
        # The attempt limit is for the first connect only: a connection that worked
        # keeps trying, so a NATS restart never strands the process.
        nc.options["max_reconnect_attempts"] = -1
        state["connected"] = True
        return nc
