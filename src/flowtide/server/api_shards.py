"""The cluster's shape as this server sees it: its shards and their live servers."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from flowtide.server.runtime import RuntimeDep
from flowtide.store import pg

__all__ = ["router"]

router = APIRouter()

TOPOLOGY_PATH = "/api/internal/shards/topology"


@router.get(TOPOLOGY_PATH, tags=["cluster"])
async def shard_topology(runtime: RuntimeDep) -> dict[str, Any]:
    """The shards (index, database without its password, where the map comes from), the
    live server processes of each (URL, seconds since their last heartbeat), this
    server's own shard, and an estimate of its shard's executions (PostgreSQL's
    statistics, not a count)."""
    topo = runtime.topology
    assert topo is not None and runtime.servers is not None
    live = await runtime.servers.live()

    def estimate() -> int | None:
        with runtime.store.transaction("execution estimate") as conn:
            return pg.executions.count_estimate(conn)

    own_estimate = await asyncio.to_thread(estimate)
    own = runtime.servers.shard
    return {
        "shards": topo.count,
        "source": topo.source,
        "self": {"server_id": runtime.servers.server_id, "shard": own},
        # Why the last read of the map was not taken (a changed number of shards).
        "map_problem": runtime.map_problem,
        "map": [
            {
                "shard": shard.index,
                "database": shard.display,
                "servers": [
                    {"server_id": s.server_id, "url": s.url, "heartbeat_age": round(s.age, 3)}
                    for s in live
                    if s.shard_index == shard.index
                ],
                "executions_estimate": own_estimate if shard.index == own else None,
            }
            for shard in topo.shards
        ],
    }
