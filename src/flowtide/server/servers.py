"""The live server processes of the cluster and the shard each serves.

Each server process registers itself in the cluster database (`server_endpoint`) when it
starts, beats every few seconds and removes its row when it stops; one that died without
a goodbye drops out of the live set after `LIVE_WITHIN` seconds and its row is deleted
after `FORGET_AFTER`. The topology endpoint shows this set; request routing between
shards will send to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING, Final

from flowtide.errors import StoreError
from flowtide.store import pg
from flowtide.store.pg.servers import ServerRow

if TYPE_CHECKING:
    from flowtide.store.postgres import PostgresStore

__all__ = ["ServerRegistry", "ServerRow"]

log = logging.getLogger("flowtide.server")

BEAT_EVERY: Final = 5.0
LIVE_WITHIN: Final = 15.0
FORGET_AFTER: Final = 3600.0


class ServerRegistry:
    """This process's row in `server_endpoint`, and the cluster's live servers."""

    def __init__(self, store: PostgresStore, shard: int, url: str | None) -> None:
        self.store = store
        self.shard = shard
        self.url = url
        self.server_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self._register)
        self._task = asyncio.create_task(self._beat(), name="flowtide-server-heartbeat")

    def _register(self) -> None:
        with self.store.transaction("server register", "cluster") as conn:
            pg.servers.register(conn, self.server_id, self.shard, self.url)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(BEAT_EVERY)
            try:
                await asyncio.to_thread(self._beat_once)
            except StoreError as exc:
                log.warning("server heartbeat: %s", exc)

    def _beat_once(self) -> None:
        with self.store.transaction("server heartbeat", "cluster") as conn:
            alive = pg.servers.beat(conn, self.server_id)
        if not alive:  # forgotten while away: come back
            self._register()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(StoreError):
            await asyncio.to_thread(self._remove)

    def _remove(self) -> None:
        with self.store.transaction("server deregister", "cluster") as conn:
            pg.servers.remove(conn, self.server_id)

    async def live(self) -> list[ServerRow]:
        """The servers that beat lately, by shard."""

        def read() -> list[ServerRow]:
            with self.store.transaction("live servers", "cluster") as conn:
                return pg.servers.live(conn, LIVE_WITHIN, forget_after=FORGET_AFTER)

        return await asyncio.to_thread(read)
