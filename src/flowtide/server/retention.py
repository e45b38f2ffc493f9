"""A server's retention: with `FLOWTIDE_RETENTION` set (`30d`), every server removes the
executions of its shard that ended longer ago than that, with their rows (`flowtide.gc`,
in batches of 500 per transaction), once an hour and shortly after it starts. Servers of
one shard may race: a row removed twice is removed once. Files on workers' machines are
theirs to prune (`flowtide prune` there)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from flowtide.gc import collect_garbage
from flowtide.store.postgres import PostgresStore

__all__ = ["RetentionWatch"]

log = logging.getLogger("flowtide.server")

#: Seconds between two collections (the first comes a minute after the start).
INTERVAL: Final = 3600.0
FIRST: Final = 60.0


class RetentionWatch:
    def __init__(self, store: PostgresStore, keep: float) -> None:
        self.store = store
        self.keep = keep

    async def run(self) -> None:
        await asyncio.sleep(FIRST)
        while True:
            try:
                await self.collect(time.time())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("retention: %s", exc)
            await asyncio.sleep(INTERVAL)

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
