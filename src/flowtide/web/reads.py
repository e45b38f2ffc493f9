"""The read port of the executions API: what the one executions router
(`flowtide.web.executions`) asks of the app that mounts it.

Two apps implement it: the server, over its PostgreSQL shard and its coordinator
(`flowtide.server.reads`), and `flowtide ui`, over the embedded store and the runtime it
runs executions on (`flowtide.ui.reads`). Everything a document needs beyond these calls
it reads from the store port (`store`) through `flowtide.documents`, the same for both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import Request
from fastapi.responses import Response

if TYPE_CHECKING:
    from flowtide.auth.principal import Principal
    from flowtide.documents.listing import ExecutionItem, ShardMissing
    from flowtide.documents.summary import Progress
    from flowtide.engine.events import Event
    from flowtide.engine.state import ExecutionState
    from flowtide.logfiles import LiveLog
    from flowtide.playbook.model import Playbook
    from flowtide.store.base import ExecutionRow, Store
    from flowtide.store.triggers import Firing
    from flowtide.web.bodies import ExecuteRequest

__all__ = ["EventFeed", "ExecutionReads", "FeedRead", "ResumableReads", "reads_of"]


@dataclass(frozen=True)
class FeedRead:
    """One read of a live event stream's feed."""

    #: The events written since the last read, in the order to send them.
    events: list[Event] = field(default_factory=list)
    #: A full batch: read again at once (a backlog).
    more: bool = False
    #: (status, error) once the execution has ended and every event was read.
    ended: tuple[str, Any] | None = None


class EventFeed(Protocol):
    """An execution's log read forward from a position, each event once."""

    async def read(self) -> FeedRead:
        """The events written since the last read (blocking work in a thread)."""
        ...


class ExecutionReads(Protocol):
    """What the executions API reads and asks of the app that serves it."""

    #: The app runs executions in its own process (`flowtide ui`): a stopped one may be
    #: resumed from the page.
    local: bool

    @property
    def store(self) -> Store:
        """The store the documents read (event log, execution rows, kept summaries,
        the catalog)."""
        ...

    async def check(self, who: Principal, execution_id: int) -> None:
        """Refuse (AuthError) a caller who may not read the execution: a worker reads
        only what the commands it holds need."""
        ...

    async def row(self, execution_id: int) -> ExecutionRow:
        """The execution's row. Raises NotFoundError."""
        ...

    async def state(self, execution_id: int) -> ExecutionState:
        """The execution's state, caught up with its log (read-only use). Raises
        NotFoundError."""
        ...

    async def progress(self, running: list[int]) -> dict[int, Progress]:
        """The progress of those of the `running` executions whose progress is cheap to
        know (the list shows the others without)."""
        ...

    async def stopped(self, running: list[int]) -> dict[int, float]:
        """Of the `running` executions (their rows say running), those that no process
        runs any more, each with when it stopped (its last event): shown `interrupted`,
        never written so. A server answers none (its own sweep finds stalled ones);
        `flowtide ui` asks the run locks (`flowtide.runlock.stopped_runs`)."""
        ...

    async def merge_shards(
        self, page: Awaitable[list[ExecutionItem]], limit: int, request: Request
    ) -> tuple[list[ExecutionItem], list[ShardMissing]]:
        """This store's list `page` (awaited here, while the other shards are asked)
        merged with the other shards' pages in a cluster of several shards (each asked
        with the same request), newest first, at most `limit`; and the shards that did
        not answer in time."""
        ...

    async def feed(self, execution_id: int, after: int | None) -> EventFeed:
        """The execution's events after the event `after` (None: from the start), as
        they are written. Raises NotFoundError, or LookupError when `after` is not an
        event of the execution (where the store can tell)."""
        ...

    def runs_here(self, execution_id: int) -> bool:
        """Whether this process runs the execution (and could cancel it at once)."""
        ...

    async def live_logs(self, execution_id: int, skip: Set[int]) -> dict[int, LiveLog]:
        """The rings of the execution's commands that printed (`flowtide.logs`), by
        command id, but those in `skip`."""
        ...

    async def admit(
        self, body: ExecuteRequest, who: Principal, request: Request
    ) -> Response | None:
        """Check a request to start an execution before its playbook is read: refuse it
        (raising), answer it elsewhere (the response of the shard that owns its parent),
        or None to go on."""
        ...

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
        """Start an execution of `playbook` (under the W3C trace context `traceparent`,
        with traces on); its id. Raises PlaybookError, TemplateError, ExecutionFinished
        (a parent that is ending)."""
        ...

    async def cancel(self, execution_id: int, reason: str) -> str:
        """Cancel the execution; its status after the call."""
        ...

    def owns(self, owner_id: int) -> bool:
        """Whether this process serves the shard of `owner_id` (an execution's or a
        trigger's id): the one that fires a trigger and writes what it starts."""
        ...

    async def route_to(self, request: Request, owner_id: int) -> Response | None:
        """None when this process owns `owner_id`; else the answer of a server of its
        shard (the request forwarded once)."""
        ...


class ResumableReads(ExecutionReads, Protocol):
    """An app that runs executions itself (`flowtide ui`): one whose process stopped
    before it ended may be resumed there."""

    async def resume(self, execution_id: int) -> None:
        """Carry on the execution from its log in this process."""
        ...


async def reads_of(request: Request) -> ExecutionReads:
    """The read port of the app serving the request (a dependency; a coroutine, so no
    thread hop)."""
    reads: ExecutionReads = request.app.state.reads
    return reads
