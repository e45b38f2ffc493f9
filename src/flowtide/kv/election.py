"""Leader election on the KV port: a `KVLock` campaigned for again after every term.

See `flowtide.kv.lock` for how a lease works and what it guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import NoReturn

from flowtide.kv.base import KeyValue
from flowtide.kv.errors import KVError
from flowtide.kv.lock import DEFAULT_SAFETY, Clock, KVLock, Lease, LeaseLostError, LockInfo

__all__ = ["Election"]

_log = logging.getLogger("flowtide.kv.lock")


class Election:
    """Leader election among processes sharing a bucket: a `KVLock` on `key`, campaigned
    for again after every term.

        election = Election(kv, "scheduler", ttl=10, holder="server-1")
        await election.run(lead)   # lead(lease) runs while this process leads

    `run` never returns: it acquires, runs `lead(lease)` (cancelled when the term is
    lost), releases, and campaigns again. `terms()` is the same as an iterator of
    leases for callers that drive each term themselves. Arguments as for `KVLock`.
    """

    def __init__(
        self,
        kv: KeyValue,
        key: str,
        *,
        ttl: float,
        holder: str | None = None,
        safety: float = DEFAULT_SAFETY,
        clock: Clock = time.monotonic,
    ) -> None:
        self.lock = KVLock(kv, key, ttl=ttl, holder=holder, safety=safety, clock=clock)
        self.lease: Lease | None = None
        self.terms_won = 0

    @property
    def leading(self) -> bool:
        """Whether this process leads now (no I/O)."""
        return self.lease is not None and self.lease.held

    async def leader(self) -> LockInfo | None:
        """Who leads as the key says now (None: nobody)."""
        return await self.lock.current()

    async def terms(self) -> AsyncGenerator[Lease, None]:
        """Yield a lease each time this process becomes leader; the term ends when its
        lease is lost or when the caller asks for the next one (then it is released).

        A failure of the bucket while campaigning (unreachable, timed out) is logged and
        the campaign tried again after `min(ttl, 5)` seconds; an error that refuses the
        request itself (the bucket does not exist, the key is invalid) is raised. Cancel
        the campaign before closing the bucket's handle."""
        while True:
            try:
                lease = await self.lock.acquire()
            except KVError as exc:
                if exc.refused:
                    raise
                pause = min(self.lock.ttl, 5.0)
                _log.warning(
                    "election %r: campaign failed (%s); again in %g s", self.lock.key, exc, pause
                )
                await asyncio.sleep(pause)
                continue
            self.lease = lease
            self.terms_won += 1
            try:
                yield lease
            finally:
                self.lease = None
                await lease.release()

    async def run(self, lead: Callable[[Lease], Awaitable[None]]) -> NoReturn:
        """Campaign forever; while leading, run `lead(lease)`, cancelled when the term is
        lost. A `lead` that returns ends its term (released) and campaigns again; one
        that raises ends `run` with its error (the term released)."""
        async with contextlib.aclosing(self.terms()) as terms:
            async for lease in terms:
                try:
                    async with lease:
                        await lead(lease)
                except LeaseLostError as exc:
                    _log.warning(
                        "election %r: term (token %d) lost: %s", lease.key, exc.token, exc.reason
                    )
        raise AssertionError("unreachable")  # pragma: no cover
