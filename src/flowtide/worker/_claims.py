"""Claims: the notifications that arrived together, claimed in one request (CLAIM_PATH).
Per command exactly one claimer wins; a loser acks and moves on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from flowtide import trace
from flowtide.sharding import shard_for
from flowtide.wire import (
    CLAIM_PATH,
    Claimed,
    ClaimReply,
    ClaimRequest,
    ExecutionShare,
    Notification,
)
from flowtide.worker._api import Api
from flowtide.worker._shares import ShareCache, known_revisions

__all__ = ["claim"]

log = logging.getLogger("flowtide.worker")


async def claim(
    api: Api,
    worker_id: str,
    msgs: list[Any],
    release: Callable[[int], None],
    shards: int = 1,
    cache: ShareCache | None = None,
) -> list[tuple[Claimed, ExecutionShare]]:
    """Claim the notifications `msgs` and settle them (ack, nak or term): one request
    per shard of a cluster of `shards` (each to the shard that owns the executions, at
    once); the commands won, each with what its execution's commands share (`cache`:
    the shares the worker holds, named in the request and kept up to date).
    `release(n)` gives back the slots of the notifications that won nothing."""
    cache = cache if cache is not None else ShareCache()
    delivered = time.time()
    by_shard: dict[int | None, tuple[list[Notification], list[Any]]] = {}
    for msg in msgs:
        try:
            note = Notification.from_json(msg.data)
        except ValueError as exc:
            # Not ours to run, ever: dropped rather than redelivered forever.
            log.warning("unreadable notification %r: %s", msg.data[:200], exc)
            with contextlib.suppress(Exception):
                await msg.term()
            release(1)
            continue
        shard = shard_for(note.execution_id, shards) if shards > 1 else None
        notes, kept = by_shard.setdefault(shard, ([], []))
        notes.append(note)
        kept.append(msg)
        trace.mark("delivered", note.command_id, delivered)
    if len(by_shard) == 1:
        [(shard, (notes, kept))] = by_shard.items()
        return await _claim(api, worker_id, notes, kept, release, shard, cache)
    won: list[tuple[Claimed, ExecutionShare]] = []
    for part in await asyncio.gather(
        *(
            _claim(api, worker_id, notes, kept, release, shard, cache)
            for shard, (notes, kept) in by_shard.items()
        )
    ):
        won.extend(part)
    return won


async def _claim(
    api: Api,
    worker_id: str,
    notes: list[Notification],
    kept: list[Any],
    release: Callable[[int], None],
    shard: int | None,
    cache: ShareCache,
) -> list[tuple[Claimed, ExecutionShare]]:
    if not notes:
        return []
    held = cache.known({n.execution_id for n in notes})
    request = ClaimRequest(worker_id, [n.claim_item() for n in notes], known_revisions(held))
    if trace.enabled:
        trace.marks([n.command_id for n in notes], "claim")
    try:
        r = await api.post_json(CLAIM_PATH, request.to_json(), shard=shard)
        r.raise_for_status()
        reply = ClaimReply.from_json(r.body)
        shares = cache.resolve(reply.executions, held)
    except Exception as exc:  # noqa: BLE001 - the notifications come back later
        log.warning("claim of %d commands failed: %s", len(notes), exc)
        for msg in kept:
            with contextlib.suppress(Exception):
                await msg.nak(delay=1.0)
        release(len(kept))
        return []
    # Claimed or not, the notifications have done their job: the claim row is the
    # durable record, and the reaper re-issues a claimed command that is lost.
    for msg in kept:
        with contextlib.suppress(Exception):
            await msg.ack()
    if trace.enabled:
        trace.marks([n.command_id for n in notes], "answered")
    won = []
    for result in reply.results:
        if isinstance(result, Claimed):
            won.append((result, shares[result.command.execution_id]))
        else:
            release(1)
    return won
