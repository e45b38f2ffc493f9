"""A server's retention: with `FLOWTIDE_RETENTION` set (`30d`), every server removes the
executions of its shard that ended longer ago than that, with their rows (`flowtide.gc`,
in batches of 500 per transaction), once an hour and shortly after it starts. With a
shared KV (NATS), one server of a shard collects at a time: each round goes to whoever
holds the shard's `duty.retention.<shard>` lease (flowtide.kv.lock); the others skip it.
On `memory://` every server collects, and a row removed twice is removed once. Files on
workers' machines are theirs to prune (`flowtide prune` there)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from flowtide.gc import collect_garbage
from flowtide.kv import KeyValue, KVLock, LockTimeoutError
from flowtide.store.postgres import PostgresStore

__all__ = ["RetentionWatch"]

log = logging.getLogger("flowtide.server")

#: Seconds between two collections (the first comes a minute after the start).
INTERVAL: Final = 3600.0
FIRST: Final = 60.0
#: The duty's lease: renewed every third of it while a collection runs.
LEASE_TTL: Final = 60.0


class RetentionWatch:
    def __init__(
        self,
        store: PostgresStore,
        keep: float,
        *,
        kv: KeyValue | None = None,
        shard: int = 0,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.keep = keep
        #: With a KV shared by the shard's servers: the lease a round needs.
        self.duty = (
            KVLock(kv, f"duty.retention.{shard}", ttl=LEASE_TTL, holder=holder)
            if kv is not None
            else None
        )

    async def run(self) -> None:
        await asyncio.sleep(FIRST)
        while True:
            try:
                await self.round(time.time())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("retention: %s", exc)
            await asyncio.sleep(INTERVAL)

    async def round(self, now: float) -> int | None:
        """One collection if this server holds the duty (or there is no lease to hold);
        None when another server of the shard holds it."""
        if self.duty is None:
            return await self.collect(now)
        try:
            lease = await self.duty.acquire(timeout=0)
        except LockTimeoutError:
            log.debug("retention: another server of the shard collects this round")
            return None
        async with lease:
            return await self.collect(now)

    async def collect(self, now: float) -> int:
        """One collection; how many executions went."""
        done = await asyncio.to_thread(collect_garbage, self.store, None, before=now - self.keep)
        if done.executions:
            log.info(
                "retention: removed %s executions that ended before %s days ago",
                done.executions,
                round(self.keep / 86400, 1),
            )
        return done.executions
