"""`flowtide ui`'s side of the executions API (`flowtide.web.reads.ExecutionReads`): the
embedded store `flowtide run` writes, states folded from it (`flowtide.ui.fold`), and an
embedded runtime of its own for the runs started, re-run or resumed from the page.

Those runs run in this process, like `flowtide run`'s, which holds each one's run lock
(`flowtide.runlock`) so no other process resumes it meanwhile; this process can cancel
them. A run of another live process is its own to stop (409 naming the pid); one that no
process runs any more is closed as cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence, Set
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from fastapi import Request
from fastapi.responses import Response

from flowtide.documents.summary import Progress, execution_summary, keep_summary
from flowtide.errors import NotFoundError, PlaybookError
from flowtide.logfiles import LiveLog, read_live
from flowtide.runlock import ExecutionBusy, RunLocks, stopped_runs
from flowtide.store.base import ENDED_STATUSES, ExecutionRow, Store
from flowtide.store.triggers import Firing
from flowtide.ui.fold import FoldCache, overlap_floor
from flowtide.web.executions import sse_stream
from flowtide.web.problems import RequestError
from flowtide.web.reads import FeedRead

if TYPE_CHECKING:
    from flowtide.auth.principal import Principal
    from flowtide.documents.listing import ExecutionItem, ShardMissing
    from flowtide.engine.events import Event
    from flowtide.engine.state import ExecutionState
    from flowtide.playbook.model import Playbook
    from flowtide.runtime.local import LocalRuntime
    from flowtide.web.bodies import ExecuteRequest

__all__ = ["LocalReads", "follow_events"]

#: The list computes progress bars for at most this many running executions per page
#: (each is a fold of its log; cached and caught up afterwards).
PROGRESS_PER_PAGE: Final = 10
#: Events one read of a live stream takes at most.
_BATCH: Final = 500


class LocalReads:
    """The executions API over the local store, with the runtime that runs the page's
    runs (opened with the app, by its lifespan: `open`)."""

    local = True

    def __init__(self, store: Store, folds: FoldCache, home: Path, locks: RunLocks) -> None:
        self._store = store
        self.folds = folds
        self.home = home
        self.locks = locks
        self.runtime: LocalRuntime | None = None

    @property
    def store(self) -> Store:
        return self._store

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        """Run the page's runs on an embedded runtime while the app serves. A run still
        going when the UI stops is left `running`, for `flowtide resume`."""
        from flowtide.credentials import CredentialVault
        from flowtide.runtime.local import LocalRuntime

        async with LocalRuntime(
            self._store,
            credentials=CredentialVault(self._store, self.home),
            data_dir=self.home / "data",
            locks=self.locks,
            on_finished=partial(keep_summary, self._store),
        ) as runtime:
            self.runtime = runtime
            try:
                yield
            finally:
                self.runtime = None

    def _live(self) -> LocalRuntime:
        if self.runtime is None:
            raise RuntimeError("the UI's runtime is not open")
        return self.runtime

    async def check(self, who: Principal, execution_id: int) -> None:
        return None  # the one local user may read everything

    async def row(self, execution_id: int) -> ExecutionRow:
        return await asyncio.to_thread(self._store.get_execution, execution_id)

    async def state(self, execution_id: int) -> ExecutionState:
        _, state = await asyncio.to_thread(self.folds.state, execution_id)
        return state

    async def progress(self, running: list[int]) -> dict[int, Progress]:
        """From the folded states of the first `PROGRESS_PER_PAGE`."""

        def fold() -> dict[int, Progress]:
            out = {}
            for execution_id in running[:PROGRESS_PER_PAGE]:
                with contextlib.suppress(NotFoundError, PlaybookError):
                    state = self.folds.state(execution_id)[1]
                    out[execution_id] = execution_summary(state)["progress"]
            return out

        return await asyncio.to_thread(fold) if running else {}

    async def stopped(self, running: list[int]) -> dict[int, float]:
        """By the run locks: nobody holds one any more (its process went away)."""
        if not running:
            return {}
        return await asyncio.to_thread(stopped_runs, self._store, self.locks, running)

    async def merge_shards(
        self, page: Awaitable[list[ExecutionItem]], limit: int, request: Request
    ) -> tuple[list[ExecutionItem], list[ShardMissing]]:
        return await page, []  # one store

    async def feed(self, execution_id: int, after: int | None) -> _StoreFeed:
        await self.row(execution_id)  # NotFoundError
        return _StoreFeed(self._store, execution_id, after)

    def runs_here(self, execution_id: int) -> bool:
        """Whether this process runs the execution (until it ends)."""
        return self.locks.holds(execution_id)

    async def live_logs(self, execution_id: int, skip: Set[int]) -> dict[int, LiveLog]:
        """The command logs the embedded runtimes write (this one's and `flowtide run`'s)."""
        root = self.home / "data" / "logs"
        return await asyncio.to_thread(read_live, root, execution_id, skip)

    async def admit(
        self, body: ExecuteRequest, who: Principal, request: Request
    ) -> Response | None:
        if body.parent_execution_id is not None:
            raise RequestError(
                400, "sub-playbooks start from their parent's step", field="parent_execution_id"
            )
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
        """In this process (`pool` names a server's workers: nothing here)."""
        return await self._live().start(
            playbook,
            workload=workload,
            catalog_version=catalog_version,
            firing=firing,
            notify=notify,
            traceparent=traceparent,
        )

    async def cancel(self, execution_id: int, reason: str) -> str:
        """Cancel a run of this process; close one that no process runs any more as
        cancelled; refuse (409) one that another live process runs."""
        row = await self.row(execution_id)
        if row.status in ENDED_STATUSES:
            raise RequestError(409, f"execution {execution_id} is already {row.status}")
        runtime = self._live()
        if self.runs_here(execution_id):
            await runtime.cancel(execution_id, reason)
        else:
            try:
                await asyncio.to_thread(runtime.cancel_stopped, execution_id, reason)
            except ExecutionBusy as exc:
                raise _busy(execution_id, exc.pid, "stop") from None
        return "cancelling"

    def owns(self, owner_id: int) -> bool:
        """One store: everything is this process's."""
        return True

    async def route_to(self, request: Request, owner_id: int) -> Response | None:
        return None

    async def resume(self, execution_id: int) -> None:
        """Carry on a run that stopped (its process ended before it did) in this
        process, from its log: finished steps and iterations are kept."""
        row = await self.row(execution_id)
        if row.status in ENDED_STATUSES:
            raise RequestError(409, f"execution {execution_id} is {row.status}: nothing to resume")
        if self.runs_here(execution_id):
            raise RequestError(409, f"execution {execution_id} is running here already")
        try:
            await self._live().resume(execution_id)
        except ExecutionBusy as exc:
            raise _busy(execution_id, exc.pid, "resume") from None


def _busy(execution_id: int, pid: int | None, what: str) -> RequestError:
    who = f"process {pid}" if pid else "another process"
    return RequestError(
        409,
        f"execution {execution_id} is running in {who} (`flowtide run`):"
        f" {what} it there (Ctrl-C stops it; `flowtide resume` continues it)",
    )


@dataclass
class _StoreFeed:
    """An execution's events from the local store, each once, as written. The embedded
    runtime writes a worker's events after it made their ids, so each read looks
    `OVERLAP_MS` back (`flowtide.ui.fold`) and skips the ids already sent (an event can
    then come after one with a higher id: the stream is in write order, and a client that
    reconnects after the highest id it saw may miss an event written late with a lower
    one; the end always comes once everything is written)."""

    store: Store
    execution_id: int
    #: Never before `after`: what a reconnecting client saw already.
    after: int | None
    sent: set[int] = field(default_factory=set)
    last_id: int = 0
    #: The next read's `after_event_id`.
    cursor: int | None = None

    def __post_init__(self) -> None:
        self.last_id = self.after or 0
        self.cursor = self.after or None

    async def read(self) -> FeedRead:
        events, status = await asyncio.to_thread(self._read)
        fresh = [e for e in events if e.event_id not in self.sent]
        for e in fresh:
            self.sent.add(e.event_id)
            self.last_id = max(self.last_id, e.event_id)
        if fresh:
            floor = overlap_floor(self.last_id)
            self.sent = {i for i in self.sent if i >= floor}
        if len(events) == _BATCH:
            # A backlog: read on after this batch (always forward, even when the
            # look-back window held a whole batch already sent).
            self.cursor = events[-1].event_id
            return FeedRead(fresh, more=True)
        # Caught up: the next read looks back over the window for late writes.
        start = self.after or 0
        self.cursor = max(overlap_floor(self.last_id), start) if self.last_id else None
        if status in ENDED_STATUSES and not fresh:
            row = await asyncio.to_thread(self.store.get_execution, self.execution_id)
            return FeedRead(ended=(row.status, row.error))
        return FeedRead(fresh)

    def _read(self) -> tuple[list[Event], str]:
        status = self.store.get_execution(self.execution_id).status
        return self.store.events(
            self.execution_id, after_event_id=self.cursor, limit=_BATCH
        ), status


def follow_events(
    store: Store, execution_id: int, after: int | None, secrets: frozenset[str]
) -> AsyncIterator[str]:
    """The live event stream of an execution of the local store, as Server-Sent Events."""
    return sse_stream(_StoreFeed(store, execution_id, after), execution_id, secrets)
