"""The worker's reports: each command's events, sent back in batches (REPORTS_PATH)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from flowtide.errors import ServerError
from flowtide.wire import REPORTS_PATH, Report, ReportsReply, reports_body
from flowtide.worker._api import Api

__all__ = ["Reporter"]

log = logging.getLogger("flowtide.worker")


@dataclass
class _Pending:
    execution_id: int
    #: The report as JSON text, encoded once (batches are joined from these).
    raw: bytes
    done: asyncio.Future[None]
    give_up: float


class Reporter:
    """Sends the worker's reports to the server, as many per request as are waiting.

    One request is in flight at a time; what finishes meanwhile goes in the next one, so
    under load a request carries many reports (one transaction per execution on the
    server) and a lone report leaves at once. A report the server could not take (a
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
    ) -> None:
        self.worker_id = worker_id
        self.patience = patience
        self.max_batch = max_batch
        # Well under the server's request cap (16 MiB by default): a batch holds reports
        # up to this size, or one report alone (a result is at most 4 MiB: pipeline).
        self.max_bytes = max_bytes
        self._waiting: list[_Pending] = []
        self._wake = asyncio.Event()

    async def send(self, execution_id: int, events: list[dict[str, Any]]) -> None:
        """Queue one command's report; returns when the server took it (or refused it as
        stale or invalid, which is logged). Raises RuntimeError when it gave up."""
        done = asyncio.get_running_loop().create_future()
        raw = Report(execution_id, events).to_json()
        self._waiting.append(_Pending(execution_id, raw, done, time.monotonic() + self.patience))
        self._wake.set()
        await done

    async def run(self, client: Api) -> None:
        delay = 0.2
        while True:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            size, n = 0, 0
            for p in self._waiting[: self.max_batch]:
                size += len(p.raw)
                if n and size > self.max_bytes:
                    break
                n += 1
            batch = self._waiting[:n]
            del self._waiting[:n]
            problem = await self._post(client, batch)
            if problem is None:
                delay = 0.2
                continue
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
                log.warning(
                    "%d reports not taken, retrying in %.1fs: %s", len(retry), delay, problem
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _post(self, client: Api, batch: list[_Pending]) -> str | None:
        """Settle what the server took; the problem when some of it is to be sent again."""
        body = reports_body(self.worker_id, [p.raw for p in batch])
        try:
            r = await client.post_json(REPORTS_PATH, body)
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
        for p, result in zip(batch, ReportsReply.from_json(r.body).results, strict=True):
            if result.code >= 500:
                problem = f"HTTP {result.code}: {result.message}"
                continue
            if result.code >= 400:
                # 409: stale (the command was issued again meanwhile).
                log.warning("report for execution %s refused: %s", p.execution_id, result.to_dict())
            p.done.set_result(None)
        return problem
