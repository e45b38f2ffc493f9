"""The server's engine: executions advanced inside PostgreSQL transactions.

Any server process handles any request. An execution's writers are serialised by a row
lock on its `execution` row (`SELECT ... FOR UPDATE`) and, inside one process, by an
asyncio lock per execution. Each process caches the states it has folded; under the row
lock it first applies what other processes appended since (the log's `seq` column is the
insertion order, while event ids of workers are not in arrival order), then advances the
engine, then writes events, command rows, execution changes and one outbox row per new
command in the same transaction. Nothing is lost when a process dies: its cache is only
an optimisation, and a transaction that fails leaves no trace and evicts the cache entry.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from flowtide.engine import events as ev
from flowtide.engine.events import Command, Event
from flowtide.engine.start import start_execution
from flowtide.engine.state import CommandRecord, ExecutionState, LoopRecord
from flowtide.errors import (
    ClaimConflict,
    ExecutionFinished,
    FlowtideError,
    NotFoundError,
    WrongPool,
)
from flowtide.ids import Snowflake
from flowtide.loopstate import LoopState
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook
from flowtide.playbook.template import visible_env
from flowtide.redaction import remember
from flowtide.runtime.advance import Advance, Advancer
from flowtide.server import metrics
from flowtide.server.outbox import OUTBOX_HOLD, OutboxRow
from flowtide.store.base import CommandUpdate
from flowtide.store.codec import (
    EVENT_COLUMNS,
    command_params,
    event_params,
    event_row,
)
from flowtide.store.postgres import PostgresStore
from flowtide.wire import Claimed, ClaimItem, ExecutionShare, Notification, command_subject

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "FINALIZE_STATUSES",
    "ClaimBatch",
    "ClaimConflict",
    "ClaimItem",
    "Coordinator",
    "ExecutionFinished",
    "FinalizeResult",
    "SubmitResult",
    "TERMINAL",
    "WORKER_EVENTS",
    "WrongPool",
    "command_subject",
]

_REPORTS: Final = (ev.COMMAND_COMPLETED, ev.COMMAND_FAILED)
#: The seq of an execution's last event (a subquery of the step's last statement).
_LAST_SEQ: Final = "SELECT seq FROM event WHERE execution_id = %s ORDER BY seq DESC LIMIT 1"
#: What an execution's log got after a `seq` (EVENT_COLUMNS, seq), in insertion order.
_SINCE: Final = (
    f"SELECT {EVENT_COLUMNS}, seq FROM event WHERE execution_id = %s AND seq > %s ORDER BY seq"
)
_ATTEMPT_EVENTS: Final = frozenset({ev.COMMAND_STARTED, ev.COMMAND_COMPLETED, ev.COMMAND_FAILED})
#: The events a worker reports (each of one command); nothing else is taken from one.
WORKER_EVENTS: Final = frozenset(
    {
        ev.SECRETS_ADDED,
        ev.COMMAND_STARTED,
        ev.COMMAND_HEARTBEAT,
        ev.CALL_DONE,
        ev.CALL_ERROR,
        ev.COMMAND_COMPLETED,
        ev.COMMAND_FAILED,
    }
)


#: The terminal statuses `finalize` can force, with the engine's events for each.
FINALIZE_STATUSES: Final = {
    "failed": (ev.WORKFLOW_FAILED, ev.PLAYBOOK_FAILED),
    "cancelled": (ev.PLAYBOOK_CANCELLED,),
    "completed": (ev.WORKFLOW_COMPLETED, ev.PLAYBOOK_COMPLETED),
}
#: The statuses an execution ends in.
TERMINAL: Final = frozenset(FINALIZE_STATUSES)


@dataclass
class FinalizeResult:
    #: False when the execution was already terminal (nothing was written).
    changed: bool
    status: str
    previous: str


@dataclass
class SubmitResult:
    accepted: int = 0
    duplicates: int = 0
    #: Reports rejected because the command is no longer held by the reporting worker
    #: (its lease expired and it was issued again) or is already closed.
    stale: int = 0
    #: Commands issued again because their worker's lease expired (`nudge`).
    reissued: int = 0
    status: str = ""


#: What `_after` needs of a committed step: execution id, pool, the parts' results, the
#: step's output and the outbox rows to publish.
_After = tuple[int, str, list[SubmitResult], Advance, list[OutboxRow]]


@dataclass
class ClaimBatch:
    """The reply to `claim_many`: per item, the command's part of the reply or the error
    it got; per execution, what its commands share (playbook, context, cancelled)."""

    results: list[Claimed | Exception] = field(default_factory=list)
    executions: dict[int, ExecutionShare] = field(default_factory=dict)


@dataclass
class _Taken:
    """What the claim transaction read of a command it gave (or gave again) to a worker."""

    step: str
    attempt: int
    instance: int | None
    index: int | None
    pool: str
    stopping: bool
    repeat: bool = False
    issued_at: float | None = None


@dataclass
class _Cached:
    state: ExecutionState
    pool: str
    last_seq: int = 0


@dataclass(frozen=True)
class _Snapshot:
    """What a claim's reply reads from a state, taken while no step was changing it.

    A claim reads it without the execution lock: the state itself is mutated by steps
    (in the event loop and in worker threads) and may hold uncommitted events.
    """

    playbook: Playbook
    parts: dict[str, Any]
    status: str
    commands: dict[int, CommandRecord]
    loops: dict[tuple[str, int], LoopRecord]

    @classmethod
    def of(cls, state: ExecutionState) -> _Snapshot:
        return cls(
            state.playbook,
            state.context_parts(),
            state.status,
            dict(state.commands),
            dict(state.loops),
        )


@dataclass
class _Report:
    """One `submit` call waiting for the step that takes it (see `submit`)."""

    events: list[Event]
    result: asyncio.Future[SubmitResult]


class Coordinator:
    """Starts, advances, cancels executions and hands out commands; one per process."""

    def __init__(
        self,
        store: PostgresStore,
        *,
        loopstate: LoopState | None,
        local_kv: bool,
        ids: Snowflake | None = None,
        lease: float = 30.0,
        cache_size: int = 2000,
        step_slots: int = 8,
        template_env: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.loopstate = loopstate
        #: What `env` holds for the templates this server evaluates (arcs, `set`,
        #: admission, the workload): only the variables FLOWTIDE_TEMPLATE_ENV lists, never
        #: the server's own settings (its database DSN, tokens).
        self.template_env = (
            template_env if template_env is not None else visible_env(os.environ, embedded=False)
        )
        #: Steps hold a pooled connection across awaits. Fewer of them than the pool has
        #: connections leaves some for the one-shot reads and claims that take theirs in a
        #: worker thread: otherwise every thread can end up waiting in getconn() for a
        #: connection held by a step that needs a thread to finish (a stall until the
        #: pool's timeout).
        self._step_slots = asyncio.Semaphore(step_slots)
        self.ids = ids or Snowflake()
        self.lease = lease
        self.advancer = Advancer(loopstate, self.ids.next_id, local_kv=local_kv)
        self._cache: OrderedDict[int, _Cached] = OrderedDict()
        self._cache_size = cache_size
        self._locks: dict[int, asyncio.Lock] = {}
        #: Reports waiting for their execution's lock, taken together by the first of
        #: them to get it (group commit).
        self._queued: dict[int, list[_Report]] = {}
        #: Committed states as claim replies read them (one per cached execution).
        self._snapshots: dict[int, _Snapshot] = {}
        #: Called after a commit that added outbox rows (the relay's wake-up).
        self.on_outbox: Callable[[], None] | None = None
        #: When set, called after a commit with the outbox rows it added, to publish them
        #: at once. They are written locked for `OUTBOX_HOLD` seconds, so the relay only
        #: publishes the ones this process fails to mark published by then.
        self.publish: Callable[[list[OutboxRow]], None] | None = None

    # -- the cache ---------------------------------------------------------------------

    def _lock(self, execution_id: int) -> asyncio.Lock:
        lock = self._locks.get(execution_id)
        if lock is None:
            lock = self._locks[execution_id] = asyncio.Lock()
            if len(self._locks) > 4 * self._cache_size:
                for key in [k for k, v in self._locks.items() if not v.locked()][
                    : self._cache_size
                ]:
                    del self._locks[key]
        return lock

    def _remember(self, execution_id: int, cached: _Cached) -> None:
        """Keep a committed state (the caller holds the execution's lock)."""
        self._cache[execution_id] = cached
        self._cache.move_to_end(execution_id)
        self._snapshots[execution_id] = _Snapshot.of(cached.state)
        while len(self._cache) > self._cache_size:
            old, _ = self._cache.popitem(last=False)
            self._snapshots.pop(old, None)

    def _forget(self, execution_id: int) -> None:
        self._cache.pop(execution_id, None)
        self._snapshots.pop(execution_id, None)

    def _catch_up(self, conn: psycopg.Connection, execution_id: int) -> _Cached:
        """The execution's state including everything committed so far (caller serialises)."""
        cached = self._cache.get(execution_id)
        if cached is None:
            row = conn.execute(
                "SELECT playbook_text, playbook_file, workload FROM execution"
                " WHERE execution_id = %s",
                (execution_id,),
            ).fetchone()
            if row is None:
                raise NotFoundError(f"execution {execution_id} not found")
            playbook = parse_playbook(row[0], row[1])
            pool = "default"
            cached = _Cached(ExecutionState(playbook, execution_id, self.template_env), pool)
        rows = conn.execute(
            _SINCE,
            (execution_id, cached.last_seq),
        ).fetchall()
        self._apply_rows(cached, rows)
        return cached

    def _apply_rows(self, cached: _Cached, rows: list[Any]) -> None:
        """Apply log rows (EVENT_COLUMNS, seq; in seq order) to a cached state."""
        sealer = self.store.sealer
        for r in rows:
            event = event_row(r, sealer)
            cached.state.apply(event)
            cached.last_seq = r[11]
            if event.type == ev.PLAYBOOK_INITIALIZED:
                cached.pool = (event.payload or {}).get("pool") or cached.pool
            elif event.type == ev.SECRETS_ADDED:
                # Logged by another server process: this one masks them in its logs too.
                remember(cached.state.secrets)

    async def state(self, execution_id: int) -> ExecutionState:
        """A caught-up state of the execution (read-only use)."""
        async with self._lock(execution_id):
            cached = await self._read_locked(execution_id)
            return cached.state

    async def _read_locked(self, execution_id: int) -> _Cached:
        try:
            cached = await asyncio.to_thread(self._read_state, execution_id)
        except BaseException:
            # The catch-up may have applied part of the log to the cached state.
            self._forget(execution_id)
            raise
        self._remember(execution_id, cached)
        return cached

    def _read_state(self, execution_id: int) -> _Cached:
        with self.store.transaction("read state") as conn:
            return self._catch_up(conn, execution_id)

    # -- writes --------------------------------------------------------------------------

    async def execute(
        self,
        playbook: Playbook,
        *,
        workload: dict[str, Any] | None = None,
        catalog_version: int | None = None,
        parent_execution_id: int | None = None,
        parent_command_id: int | None = None,
        pool: str = "default",
    ) -> int:
        """Create an execution and take its first engine step in one transaction."""
        inherited: frozenset[str] = frozenset()
        if parent_execution_id is not None:
            # A sub-playbook's workload comes from its parent's data: it is sealed (and
            # shown) with the parent's secrets.
            inherited = (await self.state(parent_execution_id)).secrets
        start = start_execution(
            playbook,
            workload or {},
            next_id=self.ids.next_id,
            now=time.time(),
            env=self.template_env,
            catalog_version=catalog_version,
            parent_execution_id=parent_execution_id,
            parent_command_id=parent_command_id,
            inherited=inherited,
            pool=pool,
        )
        execution_id = start.execution_id
        insert = self.store.execution_insert(execution_id, **start.columns())
        incoming = start.events

        def create(conn: psycopg.Connection) -> None:
            if parent_execution_id is not None:
                # A share lock on the parent's row: a cancel of the parent either
                # committed before (then it is seen here) or waits for this commit (then
                # its cascade finds this child).
                row = conn.execute(
                    "SELECT status, cancel_requested FROM execution"
                    " WHERE execution_id = %s FOR SHARE",
                    (parent_execution_id,),
                ).fetchone()
                if row is None:
                    raise NotFoundError(f"parent execution {parent_execution_id} not found")
                if row[0] in TERMINAL or row[1] is not None:
                    raise ExecutionFinished(
                        parent_execution_id, row[0] if row[0] in TERMINAL else "cancelling"
                    )
            conn.execute(*insert)

        cached = _Cached(ExecutionState(playbook, execution_id, self.template_env), pool)
        await self._step(execution_id, incoming, prepare=create, fresh=cached)
        return execution_id

    async def submit(self, execution_id: int, events: Sequence[Event]) -> SubmitResult:
        """Apply worker events (idempotent: events already in the log are skipped).

        A report for a command that its worker no longer holds (the lease expired and the
        command was issued again, or it is closed) is rejected as stale: none of that
        command's events are written.
        """
        outcome = (await self.submit_many(execution_id, [events]))[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def submit_many(
        self, execution_id: int, reports: Sequence[Sequence[Event]]
    ) -> list[SubmitResult | Exception]:
        """`submit` for several reports of one execution (a worker's batch), each judged
        as if it came alone after the ones before it; in the place of each, its result or
        the error it got."""
        for events in reports:
            for e in events:
                if e.execution_id != execution_id:
                    raise FlowtideError(
                        f"event {e.event_id} belongs to execution {e.execution_id},"
                        f" not {execution_id}"
                    )
        # Group commit: reports that queue up behind a step of their execution are taken
        # by whichever of them gets the lock first, in one transaction, each judged as if
        # it came alone after the ones before it.
        loop = asyncio.get_running_loop()
        mine = [_Report(list(events), loop.create_future()) for events in reports]
        self._queued.setdefault(execution_id, []).extend(mine)
        afters: list[_After] = []
        async with self._lock(execution_id):
            if not all(r.result.done() for r in mine):
                group = self._queued.pop(execution_id, [])
                # Cannot happen: a leader settles all it takes.
                group += [r for r in mine if not r.result.done() and r not in group]
                afters = await self._take_reports(execution_id, group)
        for after in afters:
            await self._after(*after)
        out: list[SubmitResult | Exception] = []
        for r in mine:
            exc = r.result.exception()
            out.append(exc if isinstance(exc, Exception) else r.result.result())
        return out

    async def _take_reports(self, execution_id: int, group: list[_Report]) -> list[_After]:
        """Advance `group` in one step and settle each report (the caller holds the lock
        and runs `_after` on what this returns once it let go).

        When the step fails and there was more than one report, each is tried alone, so
        one bad report does not fail the others."""
        afters: list[_After] = []
        try:
            try:
                results, after = await self._step_locked(
                    execution_id, [r.events for r in group], check_workers=True
                )
            except Exception as exc:
                if len(group) == 1:
                    group[0].result.set_exception(exc)
                    return afters
                for r in group:
                    try:
                        results, after = await self._step_locked(
                            execution_id, [r.events], check_workers=True
                        )
                    except Exception as one:
                        r.result.set_exception(one)
                    else:
                        r.result.set_result(results[0])
                        afters.append(after)
                return afters
            for r, result in zip(group, results, strict=True):
                r.result.set_result(result)
            afters.append(after)
            return afters
        finally:
            # Cancelled midway: what is not settled goes back for its own caller to take.
            unsettled = [r for r in group if not r.result.done()]
            if unsettled:
                self._queued[execution_id] = unsettled + self._queued.get(execution_id, [])

    async def cancel(self, execution_id: int, reason: str) -> SubmitResult:
        event = Event(
            event_id=self.ids.next_id(),
            execution_id=execution_id,
            type=ev.EXECUTION_CANCELLED,
            status="cancelled",
            error={"kind": "cancelled", "message": reason},
            time=time.time(),
        )

        def mark(conn: psycopg.Connection) -> None:
            conn.execute(
                "UPDATE execution SET cancel_requested = %s WHERE execution_id = %s",
                (time.time(), execution_id),
            )

        def open_children() -> list[int]:
            with self.store.transaction("cancel children") as conn:
                rows = conn.execute(
                    "SELECT execution_id FROM execution WHERE parent_execution_id = %s"
                    " AND status <> ALL(%s)",
                    (execution_id, sorted(TERMINAL)),
                ).fetchall()
            return [int(r[0]) for r in rows]

        result = await self._step(execution_id, [event], prepare=mark)
        # Its sub-playbook executions go with it, and theirs with them. A child being
        # created now is refused (`execute` reads the parent under a share lock).
        for child in await asyncio.to_thread(open_children):
            await self.cancel(child, f"parent execution {execution_id} cancelled")
        return result

    async def finalize(self, execution_id: int, status: str, reason: str) -> FinalizeResult:
        """Force an execution to a terminal `status` (an operator's tool for executions
        stuck on a lost worker or an idle pool).

        The engine's terminal events (`workflow.*` and `playbook.*`, carrying `reason`)
        are appended under the execution lock; open commands are closed with it, so later
        worker reports are rejected as stale, and workers see the execution as cancelled
        through cancellation-check. An execution that is already terminal is left as it is.

        Raises:
            NotFoundError: no such execution.
            ValueError: `status` is not one of FINALIZE_STATUSES.
        """
        if status not in FINALIZE_STATUSES:
            raise ValueError(f"cannot finalize to {status!r}")
        now = time.time()
        payload: dict[str, Any] = {"finalized": True, "reason": reason}
        error = None if status == "completed" else {"kind": "finalized", "message": reason}
        if status == "completed":
            # What the engine records when it completes (read before the lock: it only
            # informs readers of the log; the execution row takes the result under it).
            state = await self.state(execution_id)
            payload |= {"last_step": state.last_finished, "result": state.result()}
        events = [
            Event(
                event_id=self.ids.next_id(),
                execution_id=execution_id,
                type=type_,
                status=status,
                payload=payload,
                error=error,
                time=now,
            )
            for type_ in FINALIZE_STATUSES[status]
        ]
        previous: list[str] = []

        def stop_work(conn: psycopg.Connection) -> None:
            previous.append(self._lock_open(conn, execution_id))
            conn.execute(
                "UPDATE execution SET cancel_requested = COALESCE(cancel_requested, %s)"
                " WHERE execution_id = %s",
                (now, execution_id),
            )

        try:
            result = await self._step(execution_id, events, prepare=stop_work)
        except ExecutionFinished as exc:
            return FinalizeResult(changed=False, status=exc.status, previous=exc.status)
        return FinalizeResult(changed=True, status=result.status, previous=previous[0])

    async def update_ctx(
        self, execution_id: int, values: dict[str, Any] | None = None, unset: Sequence[str] = ()
    ) -> SubmitResult:
        """Set and remove top-level keys of the execution's `ctx` (what templates read as
        `ctx.*` and `vars.*`) with one `ctx.updated` event, under the execution lock.

        Raises:
            NotFoundError: no such execution.
            ExecutionFinished: the execution is terminal (its variables are read-only).
        """
        payload: dict[str, Any] = {"source": "api"}
        if values:
            payload["set"] = dict(values)
        if unset:
            payload["unset"] = list(unset)
        event = Event(
            event_id=self.ids.next_id(),
            execution_id=execution_id,
            type=ev.CTX_UPDATED,
            status="ok",
            payload=payload,
            time=time.time(),
        )

        def refuse_finished(conn: psycopg.Connection) -> None:
            self._lock_open(conn, execution_id)

        return await self._step(execution_id, [event], prepare=refuse_finished)

    @staticmethod
    def _lock_open(conn: psycopg.Connection, execution_id: int) -> str:
        """Lock the execution row; its status. Raises ExecutionFinished when terminal (the
        caller's step then rolls back)."""
        row = conn.execute(
            "SELECT status FROM execution WHERE execution_id = %s FOR UPDATE", (execution_id,)
        ).fetchone()
        if row is None:
            raise NotFoundError(f"execution {execution_id} not found")
        if row[0] in TERMINAL:
            raise ExecutionFinished(execution_id, row[0])
        return str(row[0])

    async def nudge(self, execution_id: int) -> SubmitResult:
        """Re-issue the commands of an execution whose workers lost them (lease expired)."""
        return await self._step(execution_id, [], reissue=True)

    async def _step(
        self,
        execution_id: int,
        incoming: list[Event],
        *,
        prepare: Callable[[psycopg.Connection], None] | None = None,
        fresh: _Cached | None = None,
        check_workers: bool = False,
        reissue: bool = False,
    ) -> SubmitResult:
        async with self._lock(execution_id):
            results, after = await self._step_locked(
                execution_id,
                [incoming],
                prepare=prepare,
                fresh=fresh,
                check_workers=check_workers,
                reissue=reissue,
            )
        await self._after(*after)
        return results[0]

    async def _step_locked(
        self,
        execution_id: int,
        parts: list[list[Event]],
        *,
        prepare: Callable[[psycopg.Connection], None] | None = None,
        fresh: _Cached | None = None,
        check_workers: bool = False,
        reissue: bool = False,
    ) -> tuple[list[SubmitResult], _After]:
        """One transaction over `parts` (one per caller, in order); the caller holds the
        execution's lock and calls `_after` with the second value once it let go."""
        pool = self.store.pool("shard")
        async with self._step_slots:
            # The connection is taken in the step's first thread call and given back in
            # its last, after the commit (each thread hop costs a GIL hand-over under load).
            held: list[psycopg.Connection] = []
            ok = False
            try:
                results, out, cached, notices = await self._step_in(
                    pool, held, execution_id, parts, prepare, fresh, check_workers, reissue
                )
                ok = True
            finally:
                if not ok:
                    self._forget(execution_id)
                    if held:
                        await asyncio.to_thread(self._give_back, pool, held[0])
        self._remember(execution_id, cached)
        return results, (execution_id, cached.pool, results, out, notices)

    @staticmethod
    def _give_back(pool: Any, conn: psycopg.Connection) -> None:
        """Return a connection whose transaction failed (rolled back first)."""
        try:
            conn.rollback()
        finally:
            pool.putconn(conn)

    async def _after(
        self,
        execution_id: int,
        pool: str,
        results: list[SubmitResult],
        out: Advance,
        notices: list[OutboxRow],
    ) -> None:
        """What follows a committed step, outside the lock."""
        self._count(pool, results, out)
        if notices and self.publish is not None:
            self.publish(notices)
            # Two turns of the loop: the publish task hands the notifications to the
            # NATS client, its flusher writes them to the socket. Without them the
            # notifications would wait behind the caller's HTTP reply (~1 ms).
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        elif out.commands and self.on_outbox is not None:
            self.on_outbox()
        if out.finished and self.loopstate is not None:
            await self.loopstate.cleanup(execution_id)

    async def _step_in(
        self,
        pool: Any,
        held: list[psycopg.Connection],
        execution_id: int,
        parts: list[list[Event]],
        prepare: Callable[[psycopg.Connection], None] | None,
        fresh: _Cached | None,
        check_workers: bool,
        reissue: bool,
    ) -> tuple[list[SubmitResult], Advance, _Cached, list[OutboxRow]]:
        results = [SubmitResult() for _ in parts]
        ids = [e.event_id for part in parts for e in part]
        # The rows of every command the reports name (those already in the log too: a
        # few more rows locked is cheaper than a second round trip).
        named = (
            sorted(
                {
                    e.command_id
                    for part in parts
                    for e in part
                    if e.type in WORKER_EVENTS and e.command_id is not None
                }
            )
            if check_workers
            else []
        )

        def lock_and_load() -> tuple[
            psycopg.Connection, _Cached, set[int], dict[int, tuple[Any, Any, Any]]
        ]:
            conn = pool.getconn()
            held.append(conn)
            if prepare is not None:
                prepare(conn)
            cached = fresh or self._cache.get(execution_id)
            # One round trip: the execution's row lock first, then (under it) what was
            # committed since this process last stepped it, the event ids of the reports
            # already in the log, and the reported commands' rows.
            with conn.pipeline():
                lock = conn.execute(
                    "SELECT status FROM execution WHERE execution_id = %s FOR UPDATE",
                    (execution_id,),
                )
                since = None
                if cached is not None and fresh is None:
                    since = conn.execute(
                        _SINCE,
                        (execution_id, cached.last_seq),
                    )
                dup = None
                if ids:
                    dup = conn.execute(
                        "SELECT event_id FROM event WHERE execution_id = %s AND event_id = ANY(%s)",
                        (execution_id, ids),
                    )
                rows = None
                if named:
                    rows = conn.execute(
                        "SELECT command_id, status, worker_id, attempt FROM command"
                        " WHERE command_id = ANY(%s) FOR UPDATE",
                        (named,),
                    )
                if lock.fetchone() is None:
                    raise NotFoundError(f"execution {execution_id} not found")
                if cached is None:
                    cached = self._catch_up(conn, execution_id)
                elif since is not None:
                    self._apply_rows(cached, since.fetchall())
                known = {r[0] for r in dup.fetchall()} if dup is not None else set()
                current = {r[0]: (r[1], r[2], r[3]) for r in rows.fetchall()} if rows else {}
            return conn, cached, known, current

        conn, cached, seen, current = await asyncio.to_thread(lock_and_load)
        state = cached.state
        reissued: list[Event] = []
        if reissue:
            reissued = await asyncio.to_thread(self._expired_commands, conn, state)
        out = Advance()
        recorded = await self._record_ahead(state, parts, seen, current) if check_workers else None
        for i, (part, result) in enumerate(zip(parts, results, strict=True)):
            # Each part is judged against the log and command rows as the parts before it
            # left them, as if it had come in its own transaction.
            result.duplicates = sum(1 for e in part if e.event_id in seen)
            todo = [e for e in part if e.event_id not in seen]
            if check_workers and todo:
                todo = self._drop_stale(current, todo, result)
            seen.update(e.event_id for e in todo)
            batch = reissued + todo if i == 0 else todo
            if batch or i == 0:
                done = await self.advancer.advance(
                    {execution_id: state}, batch, time.time(), recorded=recorded
                )
                out.recorded += done.recorded
                out.commands += done.commands
                out.command_rows += done.command_rows
                out.execution_rows += done.execution_rows
                out.finished += done.finished
                out.dropped += done.dropped
                for row in done.command_rows:
                    if row.command_id in current:
                        current[row.command_id] = (row.status, *current[row.command_id][1:])
                if state.terminal:
                    for command_id, (status, *rest) in list(current.items()):
                        if status in ("issued", "claimed"):
                            current[command_id] = ("cancelled", *rest)
            result.accepted = len(todo)
            result.status = state.status
        result = results[0]
        commands = list(out.commands)
        command_rows = list(out.command_rows)
        for event in reissued:
            record = state.commands.get(event.command_id or -1)
            if record is not None:
                command = record.to_command(execution_id)
                commands.append(command)
                command_rows.append(CommandUpdate.from_command(command, time=time.time()))
        if state.terminal:
            commands = []

        notices: list[OutboxRow] = []
        publish_now = self.publish is not None

        def write_and_commit() -> int:
            """Write the step, commit, give the connection back; the log's last seq."""
            now = time.time()
            # Written with the set as the step left it: a report's `secrets.added` came
            # before the events holding the values, and seals them all.
            secrets = state.secrets
            rows = [
                (u.execution_id, *self.store.execution_update(u, secrets))
                for u in out.execution_rows
            ]
            subject = command_subject(cached.pool, execution_id)
            payloads = [Notification.of(c).to_json() for c in commands]
            # One round trip for all of it (the statements run in order on the server).
            with conn.pipeline():
                PostgresStore.write_batch(
                    conn,
                    event_params(
                        out.recorded,
                        self.store.sealer,
                        {execution_id: secrets} if secrets else None,
                    ),
                    command_params(command_rows),
                    rows,
                )
                # The last statement's rows are (outbox id, command id, the log's last
                # seq): one per command issued, or one (None, None, seq) without any.
                if commands:
                    issued = [c.command_id for c in commands]
                    # One statement: the commands' pool, their outbox rows and the seq (the
                    # CTE and the subquery see the writes above; each statement less is
                    # ~0.1 ms of the issue's path).
                    tail = conn.execute(
                        "WITH p AS (UPDATE command SET pool = %s WHERE command_id = ANY(%s)),"
                        " o AS (INSERT INTO outbox (execution_id, command_id, subject, payload,"
                        " created, locked_until, attempts)"
                        " SELECT %s, u.command_id, %s, u.payload, %s, %s, %s"
                        " FROM unnest(%s::bigint[], %s::text[]) WITH ORDINALITY"
                        " AS u(command_id, payload, n) ORDER BY u.n RETURNING id, command_id)"
                        f" SELECT o.id, o.command_id, ({_LAST_SEQ}) FROM o",
                        (
                            cached.pool,
                            issued,
                            execution_id,
                            subject,
                            now,
                            now + OUTBOX_HOLD if publish_now else None,
                            int(publish_now),
                            issued,
                            payloads,
                            execution_id,
                        ),
                    )
                else:
                    if state.terminal:
                        # Nothing runs any more: open commands are closed with the execution.
                        conn.execute(
                            "UPDATE command SET status = 'cancelled', updated = %s"
                            " WHERE execution_id = %s AND status IN ('issued', 'claimed')",
                            (now, execution_id),
                        )
                    tail = conn.execute(f"SELECT NULL, NULL, ({_LAST_SEQ})", (execution_id,))
                # The COMMIT is queued behind the writes and goes with the pipeline's sync:
                # one round trip for the whole step, the commit's wait included.
                conn.commit()
            held.clear()
            pool.putconn(conn)
            got = tail.fetchall()
            if commands and publish_now:
                outbox_id = {int(r[1]): int(r[0]) for r in got}
                notices.extend(
                    OutboxRow(outbox_id[c.command_id], execution_id, c.command_id, subject, p, 1)
                    for c, p in zip(commands, payloads, strict=True)
                )
            last = got[0][2]
            return int(last) if last is not None else 0

        cached.last_seq = await asyncio.to_thread(write_and_commit)
        out.commands = commands
        result.reissued = len(reissued)
        return results, out, cached, notices

    async def _record_ahead(
        self,
        state: ExecutionState,
        parts: list[list[Event]],
        seen: set[int],
        current: dict[int, tuple[Any, Any, Any]],
    ) -> dict[int, bool] | None:
        """Record the loop iterations of all parts in the KV at once (one round trip for
        the step, not one per part), when the parts name disjoint commands: then what a
        part does to the command rows cannot make a later part's report stale, except by
        ending the execution, and an iteration recorded for a finished execution is
        harmless. None (each part records its own) otherwise."""
        if len(parts) < 2:
            return None
        owner: dict[int, int] = {}
        candidates: list[Event] = []
        for i, part in enumerate(parts):
            for e in part:
                if e.command_id is None or e.event_id in seen:
                    continue
                if owner.setdefault(e.command_id, i) != i:
                    return None
                candidates.append(e)
        fresh = self._drop_stale(current, candidates, SubmitResult())
        return await self.advancer.record_iterations({state.execution_id: state}, fresh)

    @staticmethod
    def _count(pool: str, results: list[SubmitResult], out: Advance) -> None:
        """Count what a committed step wrote (counting before the commit would count
        steps that roll back)."""
        if out.commands:
            metrics.COMMANDS_ISSUED.labels(pool).inc(len(out.commands))
        reissued = sum(r.reissued for r in results)
        if reissued:
            metrics.COMMANDS_REISSUED.labels(pool).inc(reissued)
        stale = sum(r.stale for r in results)
        if stale:
            metrics.REPORTS_STALE.labels(pool).inc(stale)
        for row in out.command_rows:
            if row.status == "completed":
                metrics.COMMANDS_COMPLETED.labels(pool).inc()
            elif row.status == "failed":
                metrics.COMMANDS_FAILED.labels(pool).inc()

    @staticmethod
    def _drop_stale(
        current: dict[int, tuple[Any, Any, Any]], events: list[Event], result: SubmitResult
    ) -> list[Event]:
        """Drop every event of a command whose report would be stale (see `submit`);
        `current` holds the rows (status, worker_id, attempt) of the commands named."""
        by_command: dict[int, list[Event]] = {}
        for e in events:
            if e.type in WORKER_EVENTS and e.command_id is not None:
                by_command.setdefault(e.command_id, []).append(e)
        if not by_command:
            return events
        stale: set[int] = set()
        for command_id, group in by_command.items():
            status, holder, attempt = current.get(command_id, (None, None, None))
            for e in group:
                # call.done/call.error carry the tool call's retry attempt, not the command's.
                reported = (e.payload or {}).get("attempt") if e.type in _ATTEMPT_EVENTS else None
                if (
                    status != "claimed"
                    or (holder is not None and e.worker_id != holder)
                    or (reported is not None and attempt is not None and reported != attempt)
                ):
                    stale.add(command_id)
        if stale:
            result.stale = sum(1 for e in events if e.command_id in stale and e.type in _REPORTS)
        return [e for e in events if e.command_id not in stale or e.type not in WORKER_EVENTS]

    def _expired_commands(self, conn: psycopg.Connection, state: ExecutionState) -> list[Event]:
        """`command.issued` events re-issuing the claimed commands whose lease expired."""
        now = time.time()
        rows = conn.execute(
            "SELECT command_id, lease_until FROM command WHERE execution_id = %s"
            " AND status = 'claimed' AND lease_until < %s FOR UPDATE",
            (state.execution_id, now),
        ).fetchall()
        out: list[Event] = []
        for command_id, lease_until in rows:
            record = state.commands.get(command_id)
            if record is None:
                continue
            payload: dict[str, Any] = {
                "command_id": command_id,
                "attempt": record.attempt + 1,
                "reissued": True,
                # `release` ends a lease at 0: the worker handed the command back.
                "reason": "released by its worker" if not lease_until else "lease expired",
            }
            if record.loop_instance is not None:
                payload["loop_instance"] = record.loop_instance
            if record.loop_index is not None:
                payload["loop_index"] = record.loop_index
            if record.cursor:
                payload["cursor"] = True
            out.append(
                Event(
                    event_id=self.ids.next_id(),
                    execution_id=state.execution_id,
                    type=ev.COMMAND_ISSUED,
                    step=record.step,
                    status="issued",
                    payload=payload,
                    command_id=command_id,
                    time=now,
                )
            )
        return out

    # -- claims --------------------------------------------------------------------------

    async def claim(
        self,
        execution_id: int,
        command_id: int,
        event_id: int,
        worker_id: str,
        *,
        pool: str | None = None,
    ) -> dict[str, Any]:
        """Claim a command for `worker_id` and return what the worker needs to run it.

        Raises:
            NotFoundError: no such command.
            ClaimConflict: another worker holds it, it is closed, or the notification is
                for an earlier issue of the command (`event_id` is not its latest).
            WrongPool: `pool` is given and the command belongs to another.
        """
        batch = await self.claim_many(
            worker_id, [ClaimItem(execution_id, command_id, event_id)], pool=pool
        )
        outcome = batch.results[0]
        if isinstance(outcome, Exception):
            raise outcome
        return {**outcome.to_dict(), **batch.executions[execution_id].to_dict()}

    async def claim_many(
        self, worker_id: str, items: Sequence[ClaimItem], *, pool: str | None = None
    ) -> ClaimBatch:
        """Claim several commands for `worker_id` in one transaction (a worker's batch of
        notifications). Each item is judged alone, in order, as `claim` judges one: the
        result in its place is the command's part of the reply, or the NotFoundError /
        ClaimConflict / WrongPool it would have raised. What the commands of one execution
        share (the playbook, the context) is in `executions` once. `pool`: the worker's,
        when it may claim only that pool's commands.
        """
        now = time.time()
        taken = await asyncio.to_thread(self._take_claims, worker_id, items, now, pool)
        batch = ClaimBatch()
        snaps: dict[int, _Snapshot] = {}
        for item, got in zip(items, taken, strict=True):
            if isinstance(got, Exception):
                batch.results.append(got)
                continue
            if not got.repeat:
                metrics.COMMANDS_CLAIMED.labels(got.pool).inc()
            if got.issued_at is not None:
                metrics.CLAIM_LATENCY.labels(got.pool).observe(max(0.0, now - got.issued_at))
            snap = await self._claim_snapshot(snaps, item)
            record = snap.commands.get(item.command_id)
            command = Command(
                command_id=item.command_id,
                execution_id=item.execution_id,
                step=got.step,
                attempt=got.attempt,
                loop_instance=got.instance,
                loop_index=got.index,
                issued_event_id=item.event_id,
                extra={"cursor": True} if record is not None and record.cursor else {},
            )
            part = Claimed(command, lease=self.lease)
            if got.index is not None and not command.extra:
                loop = snap.loops.get((got.step, got.instance or 0))
                if loop is not None:
                    part.iterator = loop.iterator
                    part.element = loop.collection[got.index]
            batch.results.append(part)
            shared = batch.executions.get(item.execution_id)
            cancelled = got.stopping or snap.status in ("cancelling", "cancelled")
            if shared is None:
                batch.executions[item.execution_id] = ExecutionShare(
                    snap.playbook.text, snap.playbook.file, snap.parts, cancelled
                )
            elif cancelled:
                shared.cancelled = True
        return batch

    async def _claim_snapshot(self, snaps: dict[int, _Snapshot], item: ClaimItem) -> _Snapshot:
        """The committed state a claim's reply reads: the last one this process holds when
        it already has this issue of the command (the usual case: this process issued
        it), so a claim does not wait behind the execution's running step; otherwise the
        execution is caught up under its lock. Any state at or after the issue is one the
        command may run against. One snapshot per execution per batch."""
        snap = snaps.get(item.execution_id) or self._snapshots.get(item.execution_id)
        record = snap.commands.get(item.command_id) if snap is not None else None
        if snap is None or record is None or record.issued_event_id != item.event_id:
            async with self._lock(item.execution_id):
                await self._read_locked(item.execution_id)
                snap = self._snapshots[item.execution_id]
        snaps[item.execution_id] = snap
        return snap

    def _take_claims(
        self, worker_id: str, items: Sequence[ClaimItem], now: float, only_pool: str | None
    ) -> list[_Taken | Exception]:
        """The claims' transaction: command rows locked in id order (two batches never
        wait on each other in a cycle), each item judged against the rows as the items
        before it left them."""
        with self.store.transaction("claim") as conn:
            found = {
                r[0]: list(r[1:])
                for r in conn.execute(
                    "SELECT c.command_id, c.execution_id, c.status, c.worker_id, c.attempt,"
                    " c.payload, c.step, c.loop_instance, c.loop_index, c.pool, e.status,"
                    " e.cancel_requested"
                    " FROM command c JOIN execution e ON e.execution_id = c.execution_id"
                    " WHERE c.command_id = ANY(%s) ORDER BY c.command_id FOR UPDATE OF c",
                    (sorted({i.command_id for i in items}),),
                ).fetchall()
            }
            out: list[_Taken | Exception] = []
            renew: list[tuple[Any, ...]] = []
            claims: list[tuple[Any, ...]] = []
            events: list[tuple[Any, ...]] = []
            for item in items:
                row = found.get(item.command_id)
                if row is None or row[0] != item.execution_id:
                    out.append(NotFoundError(f"command {item.command_id} not found"))
                    continue
                _, status, holder, attempt, payload, step, instance, index, pool = row[:9]
                # Read here, not only from a state: another server process may have
                # cancelled the execution since this one last stepped it.
                stopping = row[9] == "cancelled" or row[10] is not None
                issued = (json.loads(payload) if payload else {}).get("issued_event_id")
                taken = _Taken(step, attempt, instance, index, pool or "default", stopping)
                if only_pool is not None and taken.pool != only_pool:
                    out.append(
                        WrongPool(
                            f"command {item.command_id} is of pool {taken.pool!r}, not the"
                            f" worker's {only_pool!r}"
                        )
                    )
                elif issued is not None and int(issued) != item.event_id:
                    out.append(
                        ClaimConflict(
                            f"command {item.command_id}: event {item.event_id} is not its"
                            " latest issue"
                        )
                    )
                elif status == "claimed" and holder == worker_id:
                    # The same worker again: its first claim went through but the answer
                    # was lost (a server restart, a broken connection). Same claim, new lease.
                    renew.append((now + self.lease, now, item.command_id))
                    taken.repeat = True
                    out.append(taken)
                elif status != "issued":
                    out.append(
                        ClaimConflict(
                            f"command {item.command_id} is {status}"
                            + (f" by {holder}" if status == "claimed" and holder else ""),
                            holder=holder,
                        )
                    )
                else:
                    row[1], row[2] = "claimed", worker_id
                    claims.append((worker_id, now, now + self.lease, now, item.command_id))
                    events.append(
                        (
                            item.execution_id,
                            self.ids.next_id(),
                            ev.COMMAND_CLAIMED,
                            step,
                            json.dumps({"attempt": attempt}),
                            item.event_id,
                            item.command_id,
                            worker_id,
                            now,
                        )
                    )
                    out.append(taken)
            # The writes, the read of the issue times and the commit in one round trip.
            times = None
            with conn.pipeline():
                with conn.cursor() as cur:
                    if renew:
                        cur.executemany(
                            "UPDATE command SET lease_until = %s, updated = %s"
                            " WHERE command_id = %s",
                            renew,
                        )
                    if claims:
                        cur.executemany(
                            "UPDATE command SET status = 'claimed', worker_id = %s, claimed = %s,"
                            " lease_until = %s, updated = %s WHERE command_id = %s",
                            claims,
                        )
                        cur.executemany(
                            "INSERT INTO event (execution_id, event_id, type, step, status,"
                            " payload, parent_event_id, command_id, worker_id, time)"
                            " VALUES (%s, %s, %s, %s, 'claimed', %s, %s, %s, %s, %s)",
                            events,
                        )
                if claims:
                    times = conn.execute(
                        "SELECT event_id, time FROM event WHERE execution_id = ANY(%s)"
                        " AND event_id = ANY(%s)",
                        (sorted({e[0] for e in events}), [e[5] for e in events]),
                    )
                conn.commit()
            if times is not None:
                issued_at = dict(times.fetchall())
                for item, got in zip(items, out, strict=True):
                    if isinstance(got, _Taken) and not got.repeat:
                        got.issued_at = issued_at.get(item.event_id)
            return out

    async def holds_command(self, worker_id: str, execution_id: int, command_id: int) -> bool:
        """Whether `worker_id` holds a live claim (lease not expired) on the command."""

        def read() -> bool:
            with self.store.transaction("command holder") as conn:
                row = conn.execute(
                    "SELECT 1 FROM command WHERE command_id = %s AND execution_id = %s"
                    " AND status = 'claimed' AND worker_id = %s AND lease_until > %s",
                    (command_id, execution_id, worker_id, time.time()),
                ).fetchone()
            return row is not None

        return await asyncio.to_thread(read)

    async def extend_leases(self, worker_id: str, command_ids: list[int] | None = None) -> int:
        """Extend the leases `worker_id` holds (its heartbeat): those of `command_ids`, the
        commands the worker says it is working on, or all of them when it does not say.

        A command the worker holds but does not name (a claim whose answer it never got, a
        report it gave up on) keeps its old lease, so the reaper issues it again.
        """
        now = time.time()

        def extend() -> int:
            with self.store.transaction("heartbeat") as conn:
                if command_ids is None:
                    return conn.execute(
                        "UPDATE command SET lease_until = %s WHERE worker_id = %s"
                        " AND status = 'claimed'",
                        (now + self.lease, worker_id),
                    ).rowcount
                if not command_ids:
                    return 0
                return conn.execute(
                    "UPDATE command SET lease_until = %s WHERE worker_id = %s"
                    " AND status = 'claimed' AND command_id = ANY(%s)",
                    (now + self.lease, worker_id, command_ids),
                ).rowcount

        return int(await asyncio.to_thread(extend))

    async def release(self, worker_id: str, command_ids: list[int]) -> int:
        """Hand back commands `worker_id` holds and will not finish: their leases end now
        and they are issued again (as the reaper would once the lease ran out). Commands
        it does not hold are left alone. Returns how many were released."""

        def expire() -> list[int]:
            with self.store.transaction("release") as conn:
                rows = conn.execute(
                    "UPDATE command SET lease_until = 0 WHERE worker_id = %s"
                    " AND status = 'claimed' AND command_id = ANY(%s) RETURNING execution_id",
                    (worker_id, command_ids),
                ).fetchall()
            return [int(r[0]) for r in rows]

        if not command_ids:
            return 0
        executions = await asyncio.to_thread(expire)
        for execution_id in sorted(set(executions)):
            await self.nudge(execution_id)
        return len(executions)

    async def reap(self, limit: int = 100) -> int:
        """Re-issue commands whose lease expired; returns how many executions were nudged."""

        def expired() -> list[int]:
            with self.store.transaction("reap") as conn:
                rows = conn.execute(
                    "SELECT DISTINCT execution_id FROM command WHERE status = 'claimed'"
                    " AND lease_until < %s LIMIT %s",
                    (time.time(), limit),
                ).fetchall()
                return [r[0] for r in rows]

        executions = await asyncio.to_thread(expired)
        for execution_id in executions:
            await self.nudge(execution_id)
        if await asyncio.to_thread(self._renotify):
            if self.on_outbox is not None:
                self.on_outbox()
        return len(executions)

    def _renotify(self) -> int:
        """Publish again the notification of commands nobody claimed for two leases (it
        went to a worker that died before claiming; a duplicate only loses a claim)."""
        cutoff = time.time() - 2 * self.lease
        with self.store.transaction("renotify") as conn:
            return conn.execute(
                "INSERT INTO outbox (execution_id, command_id, subject, payload, created)"
                " SELECT o.execution_id, o.command_id, o.subject, o.payload, %s"
                " FROM command c JOIN LATERAL (SELECT * FROM outbox x"
                "  WHERE x.command_id = c.command_id ORDER BY x.id DESC LIMIT 1) o ON true"
                " WHERE c.status = 'issued' AND c.updated < %s"
                " AND o.published IS NOT NULL AND o.published < %s",
                (time.time(), cutoff, cutoff),
            ).rowcount
