"""The outbox as a service, for external relays and autoscalers: how many notifications
wait, and claiming and marking rows as the built-in relay does
(`flowtide.server.outbox`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter

from flowtide.server.runtime import OutboxDep
from flowtide.server.schemas import OutboxClaim, OutboxMark

__all__ = ["router"]

router = APIRouter()


@router.get("/api/internal/outbox/pending-count")
async def pending_count(rows: OutboxDep) -> dict[str, Any]:
    """Unpublished command notifications (scale workers or relays on this)."""
    return await asyncio.to_thread(rows.pending)


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
