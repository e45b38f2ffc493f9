"""The outbox as a service, for external relays and autoscalers: how many notifications
wait, and claiming and marking rows as the built-in relay does
(`flowtide.server.outbox`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request

from flowtide.server.forwarding import LIST_TIMEOUT, gather_shards
from flowtide.server.runtime import OutboxDep, RuntimeDep
from flowtide.server.schemas import OutboxClaim, OutboxMark

__all__ = ["router"]

router = APIRouter()


@router.get("/api/internal/outbox/pending-count")
async def pending_count(request: Request, rows: OutboxDep, runtime: RuntimeDep) -> dict[str, Any]:
    """Unpublished command notifications (scale workers or relays on this). In a cluster
    of several shards, the sum over every shard (asked at once), each shard's own in
    `shards`, and the shards that did not answer in `unavailable_shards`; one shard's
    alone with `X-Flowtide-Shard`. The claim and mark endpoints below are a shard's own:
    an external relay calls them once per shard, with `X-Flowtide-Shard`."""
    local = asyncio.to_thread(rows.pending)
    everywhere = runtime.fan_out(request)
    if everywhere is None:
        return await local
    own, shards, server_id, peers = everywhere
    mine, (answers, missing) = await asyncio.gather(
        local,
        gather_shards(
            peers,
            shards,
            own,
            server_id,
            request.url.path,
            list(request.headers.raw),
            timeout=LIST_TIMEOUT,
        ),
    )
    each = {own: mine, **answers}
    return {
        "pending": sum(int(v["pending"]) for v in each.values()),
        "oldest_age_seconds": max(float(v["oldest_age_seconds"]) for v in each.values()),
        "shards": [{"shard": k, **each[k]} for k in sorted(each)],
        "unavailable_shards": [{"shard": k, "error": why} for k, why in sorted(missing.items())],
    }


@router.post("/api/internal/outbox/claim")
async def outbox_claim(body: OutboxClaim, rows: OutboxDep) -> dict[str, Any]:
    claimed = await asyncio.to_thread(rows.claim, body.limit, body.lease)
    return {
        "rows": [
            {
                "id": r.id,
                "execution_id": str(r.execution_id),
                "command_id": str(r.command_id),
                "subject": r.subject,
                "payload": json.loads(r.payload),
                "attempts": r.attempts,
            }
            for r in claimed
        ]
    }


@router.post("/api/internal/outbox/mark-published")
async def outbox_published(body: OutboxMark, rows: OutboxDep) -> dict[str, Any]:
    return {"updated": await asyncio.to_thread(rows.mark_published, body.ids)}


@router.post("/api/internal/outbox/mark-failed")
async def outbox_failed(body: OutboxMark, rows: OutboxDep) -> dict[str, Any]:
    error = body.error or "failed"
    return {"updated": await asyncio.to_thread(rows.mark_failed, body.ids, error)}
