"""The server's engine: executions advanced inside PostgreSQL transactions.

Any server process handles any request. An execution's writers are serialised by a row
lock on its `execution` row (`flowtide.store.pg.executions.lock`) and, inside one
process, by an asyncio lock per execution. Each process caches the states it has folded; under the row
lock it first applies what other processes appended since, then advances the engine,
then writes events, command rows, execution changes and one outbox row per new command
in the same transaction. Nothing is lost when a process dies: its cache is only an
optimisation, and a transaction that fails leaves no trace and evicts the cache entry.

`Coordinator` is the front of the parts, one concern each:

- `flowtide.server.statecache`: the cached states, their catch-up and snapshots;
- `flowtide.server.steps`: the step transaction and group commit of worker reports;
- `flowtide.server.stale`: which worker reports are stale (pure rules);
- `flowtide.server.claims`: claims, judged by a pure function;
- `flowtide.server.leases`: leases, their expiry and the reaper's transactions;
- `flowtide.store.pg`: every statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.start import start_execution
from flowtide.engine.state import ExecutionState
from flowtide.errors import ExecutionFinished, FlowtideError, NotFoundError
from flowtide.ids import Snowflake
from flowtide.loopstate import LoopState
from flowtide.playbook.model import Playbook
from flowtide.playbook.template import visible_env
from flowtide.runtime.advance import Advancer
from flowtide.server.claims import ClaimBatch, ClaimConflict, ClaimItem, Claims, WrongPool
from flowtide.server.creations import Creation, PrepareMany
from flowtide.server.leases import Leases
from flowtide.server.stale import WORKER_EVENTS
from flowtide.server.statecache import DEFAULT_MAX_BYTES, StateCache
from flowtide.server.steps import Handed, Stepper, SubmitResult, Taker, command_subject
from flowtide.sharding import shard_for
from flowtide.store import pg
from flowtide.store.pg.outbox import OutboxRow
from flowtide.store.postgres import PostgresStore
from flowtide.store.triggers import Firing
from flowtide.triggers.targets import TriggeredRun

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


def _lock_open(conn: psycopg.Connection, execution_id: int) -> str:
    """Lock the execution row; its status. Raises ExecutionFinished when terminal (the
    caller's step then rolls back)."""
    status = pg.executions.lock(conn, execution_id).result()
    if status is None:
        raise NotFoundError(f"execution {execution_id} not found")
    if status in TERMINAL:
        raise ExecutionFinished(execution_id, status)
    return status


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
        cache_bytes: int = DEFAULT_MAX_BYTES,
        step_slots: int = 8,
        template_env: Mapping[str, str] | None = None,
        shard: int = 0,
        shards: int = 1,
    ) -> None:
        self.store = store
        #: The shard this process serves, of how many: a new execution gets an id its
        #: own shard owns (`shard_for(id, shards) == shard`), so it is written here.
        self.shard = shard
        self.shards = shards
        self.loopstate = loopstate
        #: What `env` holds for the templates this server evaluates (arcs, `set`,
        #: admission, the workload): only the variables FLOWTIDE_TEMPLATE_ENV lists, never
        #: the server's own settings (its database DSN, tokens).
        self.template_env = (
            template_env if template_env is not None else visible_env(os.environ, embedded=False)
        )
        self.ids = ids or Snowflake()
        self.lease = lease
        self.advancer = Advancer(loopstate, self.ids.next_id, local_kv=local_kv)
        self.cache = StateCache(
            store, template_env=self.template_env, size=cache_size, max_bytes=cache_bytes
        )
        self.steps = Stepper(
            store, self.cache, self.advancer, self.ids, loopstate, step_slots=step_slots
        )
        self.steps.shard = shard
        self.steps.lease = lease
        self.claims = Claims(store, self.cache, self.ids, lease=lease)
        self.leases = Leases(store, lease=lease)

    @property
    def on_outbox(self) -> Callable[[], None] | None:
        """Called after a commit that added outbox rows (the relay's wake-up)."""
        return self.steps.on_outbox

    @on_outbox.setter
    def on_outbox(self, value: Callable[[], None] | None) -> None:
        self.steps.on_outbox = value

    @property
    def publish(self) -> Callable[[list[OutboxRow]], None] | None:
        """When set, called after a commit with the outbox rows it added, to publish them
        at once (see `Stepper.publish`)."""
        return self.steps.publish

    @publish.setter
    def publish(self, value: Callable[[list[OutboxRow]], None] | None) -> None:
        self.steps.publish = value

    async def state(self, execution_id: int) -> ExecutionState:
        """A caught-up state of the execution (read-only use)."""
        return await self.cache.state(execution_id)

    def own_id(self) -> int:
        """A new id that this process's shard owns: ids are drawn until one hashes here
        (on average `shards` draws, a microsecond each)."""
        while True:
            new = self.ids.next_id()
            if self.shards <= 1 or shard_for(new, self.shards) == self.shard:
                return new

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
        firing: Firing | None = None,
        notify: Sequence[dict[str, Any]] = (),
        traceparent: str | None = None,
    ) -> int:
        """Create an execution and take its first engine step in one transaction;
        `firing` (a trigger's) is recorded in it (AlreadyFired: it fired before, nothing
        is written); `traceparent`: the W3C trace context it starts under."""
        inherited: frozenset[str] = frozenset()
        if parent_execution_id is not None:
            # A sub-playbook's workload comes from its parent's data: it is sealed (and
            # shown) with the parent's secrets.
            inherited = (await self.state(parent_execution_id)).secrets
        start = start_execution(
            playbook,
            workload or {},
            next_id=self.ids.next_id,
            execution_id=self.own_id(),
            now=time.time(),
            env=self.template_env,
            catalog_version=catalog_version,
            parent_execution_id=parent_execution_id,
            parent_command_id=parent_command_id,
            inherited=inherited,
            pool=pool,
            notify=notify,
            traceparent=traceparent,
        )
        execution_id = start.execution_id
        insert = self.store.execution_insert(execution_id, **start.columns(), firing=firing)
        created = start.created
        incoming = start.events

        def create(conn: psycopg.Connection) -> None:
            if parent_execution_id is not None:
                # A share lock on the parent's row: a cancel of the parent either
                # committed before (then it is seen here) or waits for this commit (then
                # its cascade finds this child).
                parent = pg.executions.share_lock(conn, parent_execution_id)
                if parent is None:
                    raise NotFoundError(f"parent execution {parent_execution_id} not found")
                if parent.status in TERMINAL or parent.cancel_requested is not None:
                    raise ExecutionFinished(
                        parent_execution_id,
                        parent.status if parent.status in TERMINAL else "cancelling",
                    )
            if firing is not None:
                self.store.record_firing(conn, firing, execution_id, created)
            conn.execute(*insert)

        fresh = self.cache.new(playbook, execution_id, pool)
        await self.steps.step(execution_id, incoming, prepare=create, fresh=fresh)
        return execution_id

    async def execute_many(self, starts: Sequence[TriggeredRun]) -> list[int | FlowtideError]:
        """Top-level executions created in one transaction (a burst of schedules firing
        together): in the place of each, its id or why it did not start (AlreadyFired: its
        firing fired before; nothing of it is written, the others are)."""
        creations: list[Creation] = []
        made: list[tuple[int, Any, Firing | None, float]] = []
        ids: list[int | FlowtideError] = []
        for new in starts:
            try:
                start = start_execution(
                    new.playbook,
                    new.workload,
                    next_id=self.ids.next_id,
                    execution_id=self.own_id(),
                    now=time.time(),
                    env=self.template_env,
                    catalog_version=new.catalog_version,
                    pool=new.pool,
                    notify=new.notify,
                )
            except FlowtideError as exc:
                ids.append(exc)
                continue
            execution_id = start.execution_id
            insert = self.store.execution_insert(execution_id, **start.columns(), firing=new.firing)
            made.append((execution_id, insert, new.firing, start.created))
            creations.append(
                Creation(self.cache.new(new.playbook, execution_id, new.pool), start.events)
            )
            ids.append(execution_id)
        outcomes = iter(await self.steps.create_many(creations, _creator(self.store, made)))
        return [
            found if isinstance(found, FlowtideError) else _id_or_error(found, next(outcomes))
            for found in ids
        ]

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
        self,
        execution_id: int,
        reports: Sequence[Sequence[Event]],
        takers: Sequence[Taker | None] | None = None,
    ) -> list[SubmitResult | Exception]:
        """`submit` for several reports of one execution (a worker's batch), each judged
        as if it came alone after the ones before it; in the place of each, its result or
        the error it got. `takers`: per report, the worker when it takes a next command in
        the slot the report frees (`SubmitResult.handed`)."""
        for events in reports:
            for e in events:
                if e.execution_id != execution_id:
                    raise FlowtideError(
                        f"event {e.event_id} belongs to execution {e.execution_id},"
                        f" not {execution_id}"
                    )
        return await self.steps.submit_many(execution_id, reports, takers)

    async def handed_replies(self, handed: Sequence[Handed]) -> ClaimBatch:
        """The claim replies of commands claimed for reporting workers by their steps
        (`SubmitResult.handed`), as a claim of them would answer."""
        return await self.claims.replies(
            [h.item for h in handed], [h.taken for h in handed], time.time()
        )

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
            # An ended execution's log is closed: nothing is written to it (the row lock
            # taken here is the one the step takes next, so it cannot end in between).
            status = pg.executions.lock(conn, execution_id).result()
            if status is None:
                raise NotFoundError(f"execution {execution_id} not found")
            if status in TERMINAL:
                raise ExecutionFinished(execution_id, status)
            pg.executions.request_cancel(conn, execution_id, time.time())

        def open_children() -> list[int]:
            with self.store.transaction("cancel children") as conn:
                return pg.executions.open_children(conn, execution_id, TERMINAL)

        result = await self.steps.step(execution_id, [event], prepare=mark)
        # Its sub-playbook executions go with it, and theirs with them. A child being
        # created now is refused (`execute` reads the parent under a share lock).
        for child in await asyncio.to_thread(open_children):
            with contextlib.suppress(ExecutionFinished, NotFoundError):  # ended meanwhile
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
        payload: ev.FinalizedPayload | ev.PlaybookCompletedPayload = {
            "finalized": True,
            "reason": reason,
        }
        error = None if status == "completed" else {"kind": "finalized", "message": reason}
        if status == "completed":
            # What the engine records when it completes (read before the lock: it only
            # informs readers of the log; the execution row takes the result under it).
            state = await self.state(execution_id)
            payload = {
                "finalized": True,
                "reason": reason,
                "last_step": state.last_finished,
                "result": state.result(),
            }
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
            previous.append(_lock_open(conn, execution_id))
            pg.executions.request_stop(conn, execution_id, now)

        try:
            result = await self.steps.step(execution_id, events, prepare=stop_work)
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
        payload: ev.CtxUpdatedPayload = {"source": "api"}
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
            _lock_open(conn, execution_id)

        return await self.steps.step(execution_id, [event], prepare=refuse_finished)

    async def nudge(self, execution_id: int) -> SubmitResult:
        """Re-issue the commands of an execution whose workers lost them (lease expired)."""
        return await self.steps.step(execution_id, [], reissue=True)

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
        return await self.claims.claim_many(worker_id, items, pool=pool)

    # -- leases --------------------------------------------------------------------------

    async def holds_command(self, worker_id: str, execution_id: int, command_id: int) -> bool:
        """Whether `worker_id` holds a live claim (lease not expired) on the command."""
        return await self.leases.holds(worker_id, execution_id, command_id)

    async def extend_leases(self, worker_id: str, command_ids: list[int] | None = None) -> int:
        """Extend the leases `worker_id` holds (its heartbeat): those of `command_ids`, the
        commands the worker says it is working on, or all of them when it does not say.

        A command the worker holds but does not name (a claim whose answer it never got, a
        report it gave up on) keeps its old lease, so the reaper issues it again.
        """
        return await self.leases.extend(worker_id, command_ids)

    async def release(self, worker_id: str, command_ids: list[int]) -> int:
        """Hand back commands `worker_id` holds and will not finish: their leases end now
        and they are issued again (as the reaper would once the lease ran out). Commands
        it does not hold are left alone. Returns how many were released."""
        executions = await self.leases.release(worker_id, command_ids)
        for execution_id in sorted(set(executions)):
            await self.nudge(execution_id)
        return len(executions)

    async def reap(self, limit: int = 100) -> int:
        """Re-issue commands whose lease expired; returns how many executions were nudged."""
        executions = await self.leases.expired(limit)
        for execution_id in executions:
            await self.nudge(execution_id)
        if await self.leases.renotify():
            if self.on_outbox is not None:
                self.on_outbox()
        return len(executions)


def _creator(
    store: PostgresStore, made: list[tuple[int, Any, Firing | None, float]]
) -> PrepareMany:
    """The writes that create `made` (id, row insert, firing, created): the firings that
    start runs in a few statements for all, the rows of those not refused in one pipeline."""

    from psycopg.pq import TransactionStatus

    def create(conn: psycopg.Connection) -> list[FlowtideError | None]:
        refused: list[FlowtideError | None] = [None] * len(made)
        plain = [
            (i, pg.firings.Started(firing, execution_id, created))
            for i, (execution_id, _, firing, created) in enumerate(made)
            if firing is not None and firing.status == "started" and not firing.members
        ]
        if plain:
            outcomes = pg.firings.record_started(conn, [started for _, started in plain])
            for (i, _), outcome in zip(plain, outcomes, strict=True):
                refused[i] = outcome
        chosen = {i for i, _ in plain}
        for i, (execution_id, _, firing, created) in enumerate(made):
            if firing is None or i in chosen:
                continue
            if conn.info.transaction_status == TransactionStatus.IDLE:
                # A statement first: the savepoint below then nests in this transaction
                # (on an idle connection `transaction()` would commit at its end).
                conn.execute("SELECT 1")
            try:
                with conn.transaction():  # a savepoint: a refused one leaves no trace
                    store.record_firing(conn, firing, execution_id, created)
            except FlowtideError as exc:
                refused[i] = exc
        with conn.pipeline():
            for (_, insert, _, _), error in zip(made, refused, strict=True):
                if error is None:
                    conn.execute(*insert)
        return refused

    return create


def _id_or_error(execution_id: int, outcome: SubmitResult | FlowtideError) -> int | FlowtideError:
    return outcome if isinstance(outcome, FlowtideError) else execution_id
