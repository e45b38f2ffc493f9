"""The worker's reports: each command's events, sent back in batches (REPORTS_PATH)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowtide import trace
from flowtide.errors import ServerError
from flowtide.sharding import shard_for
from flowtide.wire import (
    REPORTS_PATH,
    Claimed,
    ExecutionShare,
    Report,
    ReportsReply,
    reports_body,
)
from flowtide.worker._api import Api
from flowtide.worker._shares import ShareCache, known_revisions

__all__ = ["Handed", "Reporter"]

#: A next command the server claimed for the worker with its report, and its execution's
#: share (`Report.take`).
Handed = tuple[Claimed, ExecutionShare]

log = logging.getLogger("flowtide.worker")


@dataclass
class _Pending:
    execution_id: int
    #: The report as JSON text, encoded once (batches are joined from these).
    raw: bytes
    done: asyncio.Future[Handed | None]
    give_up: float
    #: The command reported (for the trace; 0 when not given).
    command_id: int = 0
    #: Called when the server answers the report as stale (409).
    on_stale: Callable[[], None] | None = None

    def shard(self, shards: int) -> int:
        return shard_for(self.execution_id, shards)


_ENDS = frozenset({"command.completed", "command.failed"})


def _halves(events: list[dict[str, Any]]) -> tuple[list[Any], list[Any]] | None:
    """`events` of several loop iterations split in two at the iteration boundary nearest
    the middle (each iteration's events end with its `command.completed`/`failed`); None
    when they are one iteration's."""
    cuts = [i + 1 for i, e in enumerate(events[:-1]) if e.get("type") in _ENDS]
    if not cuts:
        return None
    cut = min(cuts, key=lambda i: abs(2 * i - len(events)))
    return events[:cut], events[cut:]


class Reporter:
    """Sends the worker's reports to the server, as many per request as are waiting.

    One request per shard is in flight at a time; what finishes meanwhile goes in the
    shard's next one, so under load a request carries many reports (one transaction per
    execution on the server) and a lone report leaves at once. A shard that answers
    slowly (its database down, its servers gone) holds back its own reports only. A report the server could not take (a
    restart, a network blip, a 5xx) is sent again for up to `patience` seconds; past
    that its command has been issued again and the report would be stale anyway.
    """

    def __init__(
        self,
        worker_id: str,
        patience: float,
        *,
        max_batch: int = 256,
        max_bytes: int = 4 * 1024 * 1024,
        shares: ShareCache | None = None,
    ) -> None:
        self.worker_id = worker_id
        #: The execution shares this worker holds (a handed command's comes with the
        #: reply, left out when the request says the worker holds its revision).
        self.shares = shares if shares is not None else ShareCache()
        self.patience = patience
        self.max_batch = max_batch
        # Well under the server's request cap (16 MiB by default): a batch holds reports
        # up to this size, or one report alone (a result is at most 4 MiB: pipeline).
        self.max_bytes = max_bytes
        self._waiting: list[_Pending] = []
        self._wake = asyncio.Event()
        #: The cluster's shards (the register reply says): a request carries the
        #: reports of one shard's executions, and says which.
        self.shards = 1

    async def send(
        self,
        execution_id: int,
        events: list[dict[str, Any]],
        command_id: int = 0,
        *,
        take: bool = False,
        on_stale: Callable[[], None] | None = None,
    ) -> Handed | None:
        """Queue one command's report; returns when the server took it (or refused it as
        stale or invalid, which is logged). Raises RuntimeError when it gave up. `take`:
        the worker runs a next command of the execution in the slot this one frees; the
        one the server handed over, if any, is returned. `on_stale`: called when the
        server answers (a part of) the report as stale."""
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[Handed | None]] = []
        for raw in self._parts(execution_id, events, take):
            done: asyncio.Future[Handed | None] = loop.create_future()
            self._waiting.append(
                _Pending(
                    execution_id, raw, done, time.monotonic() + self.patience, command_id, on_stale
                )
            )
            waits.append(done)
        self._wake.set()
        return (await asyncio.gather(*waits))[-1]

    def _parts(self, execution_id: int, events: list[dict[str, Any]], take: bool) -> list[bytes]:
        """The report as JSON text: one, or for a chunk's iterations with large results
        several parts, each under the batch size (a request over the server's cap would be
        refused whole, and sent again forever by the chunk issued again), `take` on the
        last. The parts are queued together, in order: a report queued after them (the
        chunk's next, maybe an iteration that breaks the loop, after which the server
        drops what the chunk reports) never goes before one of them."""
        raw = Report(execution_id, events, take).to_json()
        halves = _halves(events) if len(raw) > self.max_bytes else None
        if halves is None:
            return [raw]
        first, second = halves
        return [*self._parts(execution_id, first, False), *self._parts(execution_id, second, take)]

    def _shard(self, p: _Pending) -> int | None:
        return p.shard(self.shards) if self.shards > 1 else None

    async def run(self, client: Api) -> None:
        # Per shard (None: one shard): its request in flight, when it may be tried again,
        # and the next delay. A shard whose servers or database are down or slow holds
        # back its own reports only: each shard has its own request in flight.
        flying: dict[int | None, asyncio.Task[None]] = {}
        retry_at: dict[int | None, float] = {}
        delays: dict[int | None, float] = {}
        try:
            while True:
                # Cleared before looking: a wake-up set from here on is not lost.
                self._wake.clear()
                now = time.monotonic()
                idle = {self._shard(p) for p in self._waiting} - flying.keys()
                ready_shards = {s for s in idle if retry_at.get(s, 0.0) <= now}
                if not ready_shards:
                    later = [retry_at[s] for s in idle if s in retry_at]
                    timeout = max(0.0, min(later) - now) if later else None
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout)
                    continue
                # The oldest ready report's shard first; the others' on the next turns.
                shard = next(s for p in self._waiting if (s := self._shard(p)) in ready_shards)
                pick = [p for p in self._waiting if self._shard(p) == shard]
                size, n = 0, 0
                for p in pick[: self.max_batch]:
                    size += len(p.raw)
                    if n and size > self.max_bytes:
                        break
                    n += 1
                batch = pick[:n]
                taken = {id(p) for p in batch}
                self._waiting = [p for p in self._waiting if id(p) not in taken]
                flying[shard] = asyncio.create_task(
                    self._deliver(client, batch, shard, flying, retry_at, delays)
                )
        finally:
            for task in flying.values():
                task.cancel()

    async def _deliver(
        self,
        client: Api,
        batch: list[_Pending],
        shard: int | None,
        flying: dict[int | None, asyncio.Task[None]],
        retry_at: dict[int | None, float],
        delays: dict[int | None, float],
    ) -> None:
        """One request of `shard`'s reports; what it could not settle goes back first in
        the queue, for the shard's next request after a delay."""
        try:
            try:
                problem = await self._post(client, batch, shard)
            except Exception as exc:  # noqa: BLE001 - the reports are kept, not lost
                log.exception("sending reports failed")
                problem = f"{type(exc).__name__}: {exc}"
            if problem is None:
                retry_at.pop(shard, None)
                delays.pop(shard, None)
                return
            now = time.monotonic()
            retry = []
            for p in batch:
                if p.done.done():
                    continue
                if now > p.give_up:
                    p.done.set_exception(
                        RuntimeError(f"report for execution {p.execution_id} failed: {problem}")
                    )
                else:
                    retry.append(p)
            self._waiting[:0] = retry
            if retry:
                delay = delays.get(shard, 0.2)
                where = "" if shard is None else f" (shard {shard})"
                log.warning(
                    "%d reports not taken%s, retrying in %.1fs: %s",
                    len(retry),
                    where,
                    delay,
                    problem,
                )
                retry_at[shard] = now + delay
                delays[shard] = min(delay * 2, 5.0)
        finally:
            flying.pop(shard, None)
            self._wake.set()

    async def _post(self, client: Api, batch: list[_Pending], shard: int | None) -> str | None:
        """Settle what the server took; the problem when some of it is to be sent again."""
        kept = self.shares.known({p.execution_id for p in batch})
        body = reports_body(self.worker_id, [p.raw for p in batch], known_revisions(kept))
        if trace.enabled:
            trace.marks([p.command_id for p in batch], "report")
        try:
            r = await client.post_json(REPORTS_PATH, body, shard=shard)
        except ServerError as exc:
            return str(exc)
        if r.status_code >= 500:
            return f"HTTP {r.status_code}"
        if r.status_code >= 400:
            # The whole body was refused (it is ours, so this is a bug): nothing to retry.
            for p in batch:
                p.done.set_exception(RuntimeError(f"reports refused: {r.text[:500]}"))
            return None
        problem = None
        reply = ReportsReply.from_json(r.body)
        try:
            shares = self.shares.resolve(reply.executions, kept)
        except ValueError as exc:
            # Cannot happen with a server of this version: the reports were taken, the
            # handed commands run nowhere (their leases run out and they are issued again).
            log.error("reports reply: %s", exc)
            shares = {}
        for p, result in zip(batch, reply.results, strict=True):
            if result.code >= 500:
                problem = f"HTTP {result.code}: {result.message}"
                continue
            if result.code == 409:
                # Stale: the command was issued again meanwhile (its lease ran out); the
                # newer attempt's report counts. Routine after a pause, not a problem.
                log.debug("report for execution %s stale: %s", p.execution_id, result.to_dict())
                if p.on_stale is not None:
                    p.on_stale()
            elif result.code >= 400:
                log.warning("report for execution %s refused: %s", p.execution_id, result.to_dict())
            claimed = result.claimed
            share = shares.get(claimed.command.execution_id) if claimed else None
            if claimed is not None:
                trace.mark("answered", claimed.command.command_id)
            p.done.set_result(
                (claimed, share) if claimed is not None and share is not None else None
            )
        return problem
