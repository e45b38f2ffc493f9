"""The cluster's shape as this server sees it: its shards and their live servers."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from flowtide.errors import StoreError
from flowtide.server.forwarding import LIST_TIMEOUT, gather_shards
from flowtide.server.runtime import RuntimeDep
from flowtide.store import pg

__all__ = ["router"]

router = APIRouter()

TOPOLOGY_PATH = "/api/internal/shards/topology"


@router.get(TOPOLOGY_PATH, tags=["cluster"])
async def shard_topology(request: Request, runtime: RuntimeDep) -> dict[str, Any]:
    """The shards (index, database without its password, where the map comes from), the
    live server processes of each (URL, seconds since their last heartbeat), this
    server's own shard, and per shard whether it answers (`healthy`, else `error`) and an
    estimate of its executions (PostgreSQL's statistics, not a count): the other shards
    are asked at once through their servers. `map_problem`: why the last read of the
    shard map was not taken (a changed number of shards)."""
    topo = runtime.topology
    assert topo is not None and runtime.servers is not None
    own = runtime.servers.shard

    def estimate() -> int | None:
        with runtime.store.transaction("execution estimate") as conn:
            return pg.executions.count_estimate(conn)

    async def own_health() -> dict[str, Any]:
        # Answered within the time the asking server waits (LIST_TIMEOUT): a database that
        # just went down can hold a pooled connection's wait longer, and the answer would
        # then say only that this server was slow, not why.
        wait = LIST_TIMEOUT * 0.6
        try:
            found = await asyncio.wait_for(asyncio.to_thread(estimate), timeout=wait)
        except StoreError as exc:
            return {"healthy": False, "error": f"shard {own}: {exc}", "executions_estimate": None}
        except TimeoutError:
            why = f"shard {own}: its database did not answer in {wait:g} s"
            return {"healthy": False, "error": why, "executions_estimate": None}
        return {"healthy": True, "executions_estimate": found}

    everywhere = runtime.fan_out(request)
    live, mine, (answers, missing) = await asyncio.gather(
        runtime.servers.live(),
        own_health(),
        gather_shards(
            everywhere[3],
            everywhere[1],
            own,
            everywhere[2],
            TOPOLOGY_PATH,
            list(request.headers.raw),
            timeout=LIST_TIMEOUT,
        )
        if everywhere is not None
        else _nothing(),
    )
    health: dict[int, dict[str, Any]] = {own: mine}
    for shard, answer in answers.items():
        theirs: dict[str, Any] = next(
            (m for m in answer.get("map", []) if m.get("shard") == shard), {}
        )
        health[shard] = {
            "healthy": bool(theirs.get("healthy")),
            "executions_estimate": theirs.get("executions_estimate"),
            **({"error": theirs["error"]} if theirs.get("error") else {}),
        }
    for shard, why in missing.items():
        health[shard] = {"healthy": False, "error": why, "executions_estimate": None}
    return {
        "shards": topo.count,
        "source": topo.source,
        "self": {"server_id": runtime.servers.server_id, "shard": own},
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
                # Without an answer (this server was asked for its own part only).
                **health.get(shard.index, {"healthy": None, "executions_estimate": None}),
            }
            for shard in topo.shards
        ],
    }


async def _nothing() -> tuple[dict[int, Any], dict[int, str]]:
    return {}, {}
