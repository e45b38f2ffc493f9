"""The server's side of the executions API (`flowtide.web.reads.ExecutionReads`): the
states its coordinator holds, its shard's PostgreSQL database, the other shards asked for
cluster-wide lists, and the live event stream read in commit order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from fastapi import Request
from fastapi.responses import Response

from flowtide.documents.summary import Progress, progress_of
from flowtide.errors import AuthError, ExecutionFinished, FlowtideError, NotFoundError
from flowtide.server.coordinator import TERMINAL, Coordinator
from flowtide.server.forwarding import LIST_TIMEOUT, gather_shards
from flowtide.sharding import shard_for
from flowtide.store import pg
from flowtide.store.codec import load_json
from flowtide.store.pg.events import LogPosition
from flowtide.store.triggers import Firing
from flowtide.triggers.targets import TriggeredRun
from flowtide.web.problems import RequestError
from flowtide.web.reads import FeedRead

if TYPE_CHECKING:
    from flowtide.auth.principal import Principal
    from flowtide.documents.listing import ExecutionItem, ShardMissing
    from flowtide.engine.state import ExecutionState
    from flowtide.logfiles import LiveLog
    from flowtide.playbook.model import Playbook
    from flowtide.server.runtime import Runtime
    from flowtide.server.worker_registry import WorkerRegistry
    from flowtide.store.base import ExecutionRow
    from flowtide.store.postgres import PostgresStore
    from flowtide.web.bodies import ExecuteRequest

__all__ = ["ServerReads"]

#: Events one read of a live stream takes at most.
_BATCH: Final = 500


class ServerReads:
    """The executions API over a server process's `Runtime` (its parts exist once the
    app has started)."""

    local = False

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @property
    def store(self) -> PostgresStore:
        store: PostgresStore = self.runtime.store
        return store

    @property
    def coordinator(self) -> Coordinator:
        held = self.runtime.coordinator
        assert held is not None, "the app has not started"
        return held

    @property
    def workers(self) -> WorkerRegistry:
        held = self.runtime.workers
        assert held is not None, "the app has not started"
        return held

    async def check(self, who: Principal, execution_id: int) -> None:
        await self.workers.require_holder(who, execution_id, parent=True)

    async def row(self, execution_id: int) -> ExecutionRow:
        return await asyncio.to_thread(self.store.get_execution, execution_id)

    async def state(self, execution_id: int) -> ExecutionState:
        return await self.coordinator.state(execution_id)

    async def progress(self, running: list[int]) -> dict[int, Progress]:
        """From the snapshot this server last took of each one's state (no read, no
        fold): its loops (and spark loops' items) only; none of those it holds no state of."""
        cache = self.coordinator.cache
        out = {}
        for execution_id in running:
            snap = cache.snapshot(execution_id)
            if snap is not None:
                out[execution_id] = progress_of(snap.loops.values(), items=snap.items)
        return out

    async def stopped(self, running: list[int]) -> dict[int, float]:
        """None: a server's executions are its to run (`flowtide.server.stale` finds the
        stalled ones)."""
        return {}

    async def merge_shards(
        self, page: Awaitable[list[ExecutionItem]], limit: int, request: Request
    ) -> tuple[list[ExecutionItem], list[ShardMissing]]:
        everywhere = self.runtime.fan_out(request)
        if everywhere is None:
            return await page, []
        own, shards, server_id, peers = everywhere
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        mine, (answers, missing) = await asyncio.gather(
            page,
            gather_shards(
                peers,
                shards,
                own,
                server_id,
                target,
                list(request.headers.raw),
                timeout=LIST_TIMEOUT,
            ),
        )
        items = list(mine)
        for answer in answers.values():
            items.extend(answer.get("items", []))
        items.sort(key=lambda item: int(item["execution_id"]), reverse=True)
        return items[:limit], [
            {"shard": shard, "error": why} for shard, why in sorted(missing.items())
        ]

    async def feed(self, execution_id: int, after: int | None) -> _LogFeed:
        cursor = await asyncio.to_thread(_open_stream, self.store, execution_id, after)
        return _LogFeed(self.store, execution_id, cursor)

    def runs_here(self, execution_id: int) -> bool:
        return False

    async def live_logs(self, execution_id: int, skip: Set[int]) -> dict[int, LiveLog]:
        """What the workers published of the execution's commands (the log stream)."""
        nc = self.runtime.nc
        if nc is None:
            return {}
        from flowtide.server.logs import own_rings, read_rings

        cache = self.coordinator.cache
        cached = cache.get(execution_id)
        if cached is None:
            async with cache.lock(execution_id):
                cached = await cache.read_locked(execution_id)
        rings = await read_rings(nc.jetstream(), execution_id, skip, pool=cached.pool)
        return own_rings(rings, cached.state.commands)

    async def trigger_elsewhere(self, request: Request, trigger_id: int) -> Response | None:
        """A trigger's request (a webhook's delivery or page) goes to the shard that owns
        the trigger, where its firings and runs are written (`flowtide.web.hooks`)."""
        return await self.runtime.elsewhere(request, trigger_id)

    async def admit(
        self, body: ExecuteRequest, who: Principal, request: Request
    ) -> Response | None:
        """A sub-playbook's request goes to its parent's shard; a worker may start only
        sub-playbooks of the commands it holds, on its own pool."""
        if body.parent_execution_id is not None:
            there = await self.runtime.elsewhere(request, body.parent_execution_id)
            if there is not None:
                return there
        elif who.role != "worker":
            # A new top-level run goes to the shards in turn (or the one asked for).
            placed = await self.runtime.placed(request, body.shard)
            if placed is not None:
                return placed
        if who.role == "worker" and not who.insecure:
            if body.parent_execution_id is None:
                raise AuthError("a worker starts sub-playbooks only (parent_execution_id)")
            if who.pool is not None and body.pool != who.pool:
                raise AuthError(f"{who.describe()} serves pool {who.pool!r}, not {body.pool!r}")
            await self.workers.require_holder(who, body.parent_execution_id)
        return None

    async def start(
        self,
        playbook: Playbook,
        *,
        workload: dict[str, Any],
        catalog_version: int | None,
        parent_execution_id: int | None = None,
        parent_command_id: int | None = None,
        pool: str = "default",
        firing: Firing | None = None,
        notify: Sequence[dict[str, Any]] = (),
        traceparent: str | None = None,
    ) -> int:
        return await self.coordinator.execute(
            playbook,
            workload=workload,
            catalog_version=catalog_version,
            parent_execution_id=parent_execution_id,
            parent_command_id=parent_command_id,
            pool=pool,
            firing=firing,
            notify=notify,
            traceparent=traceparent,
        )

    async def start_many(self, runs: Sequence[TriggeredRun]) -> list[int | FlowtideError]:
        """Top-level runs created together (few transactions for a burst of firings):
        in the place of each, its id or why it did not start (AlreadyFired...)."""
        return await self.coordinator.execute_many(runs)

    def owns(self, owner_id: int) -> bool:
        """Whether this server's shard owns the id (one shard: always)."""
        coordinator = self.coordinator
        return shard_for(owner_id, coordinator.shards) == coordinator.shard

    async def route_to(self, request: Request, owner_id: int) -> Response | None:
        return await self.runtime.elsewhere(request, owner_id)

    async def cancel(self, execution_id: int, reason: str) -> str:
        """Recorded at once; running workers see it through cancellation-check. An
        ended execution is refused (409) and its log left as it is."""
        try:
            result = await self.coordinator.cancel(execution_id, reason)
        except ExecutionFinished as exc:
            raise RequestError(409, f"execution {execution_id} is already {exc.status}") from None
        return result.status


# -- the live stream: the log in commit-consistent order ------------------------------


def _open_stream(store: PostgresStore, execution_id: int, after: int | None) -> LogPosition:
    """The stream's starting position. Raises NotFoundError (no execution) or LookupError
    (`after` is not an event of it)."""
    with store.transaction("event stream") as conn:
        if not pg.executions.exists(conn, execution_id):
            raise NotFoundError(f"execution {execution_id} not found")
        if not after:
            return pg.events.START
        found = pg.events.position(conn, execution_id, after)
    if found is None:
        raise LookupError(after)
    return found


@dataclass
class _LogFeed:
    """An execution's log from a position, read in the order its transactions commit
    (`pg.events.settled_after`), so an event written late never lands behind the
    position a reader has passed."""

    store: PostgresStore
    execution_id: int
    cursor: LogPosition

    async def read(self) -> FeedRead:
        # A short transaction per read: no connection is held while the stream waits.
        return await asyncio.to_thread(self._read)

    def _read(self) -> FeedRead:
        sealer = self.store.sealer
        with self.store.transaction("event stream") as conn:
            # One snapshot for the status, the horizon and the rows.
            pg.events.read_snapshot(conn)
            row = pg.executions.outcome(conn, self.execution_id)
            if row is None:
                raise NotFoundError(f"execution {self.execution_id} not found")
            found = pg.events.settled_after(conn, self.execution_id, self.cursor, _BATCH, sealer)
            finished = False
            if row.status in TERMINAL and len(found) < _BATCH:
                last = found[-1][1] if found else self.cursor
                finished = not pg.events.any_after(conn, self.execution_id, last)
        if found:
            self.cursor = found[-1][1]
        ended = None
        if finished:
            what = f"execution {self.execution_id}: error"
            ended = (row.status, load_json(row.error, sealer, what) if row.error else None)
        return FeedRead([e for e, _ in found], more=len(found) == _BATCH, ended=ended)
