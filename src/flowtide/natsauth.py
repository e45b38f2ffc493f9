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
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from flowtide.errors import NatsError
from flowtide.urls import redact_url, scrub_url

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = ["NatsAuth", "connect_nats", "is_refusal", "url_has_credentials"]

log = logging.getLogger("flowtide.nats")

ENV_USER: Final = "FLOWTIDE_NATS_USER"
ENV_PASSWORD: Final = "FLOWTIDE_NATS_PASSWORD"
ENV_CREDS: Final = "FLOWTIDE_NATS_CREDS"

_CONNECT_TIMEOUT: Final = 2.0
_CONNECT_ATTEMPTS: Final = 2
_RECONNECT_WAIT: Final = 0.5
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


@dataclass(frozen=True)
class NatsAuth:
    """Credentials for NATS connections besides those a URL carries (which win).

    Frozen and hashable: connections are shared per (URL, credentials).
    """

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    #: Path of a `.creds` file (user JWT + nkey seed).
    creds: str | None = None

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, creds: str | None = None
    ) -> NatsAuth:
        """FLOWTIDE_NATS_USER / FLOWTIDE_NATS_PASSWORD / FLOWTIDE_NATS_CREDS; `creds` (the
        `--nats-creds` flag) wins over the variable."""
        env = os.environ if environ is None else environ
        return cls(
            user=env.get(ENV_USER) or None,
            password=env.get(ENV_PASSWORD) or None,
            creds=creds or env.get(ENV_CREDS) or None,
        )

    def __bool__(self) -> bool:
        return bool(self.user or self.password or self.creds)

    def env(self) -> dict[str, str]:
        """The variables that hand these credentials to a child process."""
        out = {}
        if self.user:
            out[ENV_USER] = self.user
        if self.password:
            out[ENV_PASSWORD] = self.password
        if self.creds:
            out[ENV_CREDS] = self.creds
        return out

    def secrets(self) -> list[str]:
        """Values no message may show."""
        return [self.password] if self.password else []

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
                with open(self.creds, "rb") as handle:
                    text = handle.read()
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

    def options(self, url: str) -> dict[str, Any]:
        """Keyword arguments of nats-py's `connect` for `url`. A URL with credentials
        keeps them: nats-py would otherwise prefer the user and password options."""
        self.check()
        if url_has_credentials(url):
            return {}
        if self.creds:
            return {"user_credentials": self.creds}
        if self.user and self.password:
            return {"user": self.user, "password": self.password}
        return {}


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
        "error_cb": on_error,
        "reconnected_cb": on_reconnected,
        "disconnected_cb": on_disconnected,
        **credentials,
        **options,
    }
    while True:
        nc = Client()
        try:
            await nc.connect(**arguments)
        except Exception as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            cause = last[0] if last else exc
            if state["refused"] or is_refusal(cause):
                raise NatsError(
                    f"cannot connect to NATS at {shown}: authorization violation "
                    "(wrong user, password, token or credentials file)",
                    url=shown,
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
