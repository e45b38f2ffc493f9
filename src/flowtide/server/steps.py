"""The step transaction: an execution advanced by one engine step inside PostgreSQL
(the worker reports that queue up behind it are taken together: `flowtide.server.
group_commit`).

A step holds the execution's lock in this process (`StateCache.lock`) and, in the
database, its row lock. In one round trip it takes the row lock, reads what other
processes appended since this one last stepped it, which reported events are already in
the log, and the reported commands' rows. It drops stale reports
(`flowtide.server.stale`), advances the engine, and writes the events, the command rows,
the execution row and one outbox row per command issued, then commits: again one round
trip. A step that fails leaves no trace in the database and evicts the cached state.

A report whose worker can run a next command in the slot it frees (`Taker`) gets one
of the commands the step issues claimed for that worker in the same transaction (its
row claimed with a lease, its `command.claimed` event, its outbox row written already
published: the worker has it, nothing to notify). Every command still has its outbox
row, and a claimed one whose answer never reaches its worker is issued again when its
lease runs out, as any claimed command is.

What follows a commit (`After`: metrics, publishing the notifications, cleaning up the
loop state of a finished execution) runs once the lock is let go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowtide import trace, tracing
from flowtide.documents.summary import SUMMARY_FORMAT, kept_part
from flowtide.engine import events as ev
from flowtide.engine.events import Command, Event
from flowtide.engine.state import ExecutionState
from flowtide.errors import NotFoundError, StoreError
from flowtide.ids import Snowflake
from flowtide.loopstate import LoopState
from flowtide.notify.owed import owed
from flowtide.playbook.notify import NotifyTarget
from flowtide.runtime.advance import Advance, Advancer
from flowtide.runtime.spans import execution_ended
from flowtide.server.claims import Taken
from flowtide.server.creations import Creations
from flowtide.server.group_commit import GroupCommit
from flowtide.server.leases import reissue_events
from flowtide.server.outbox import OUTBOX_HOLD
from flowtide.server.results import After, Handed, SubmitResult, Taker, count_step
from flowtide.server.stale import disjoint_events, drop_stale, reported_commands, settle
from flowtide.server.statecache import CachedState, StateCache, apply_logged
from flowtide.store import pg
from flowtide.store.base import CommandUpdate
from flowtide.store.codec import command_params, encode_value, event_params
from flowtide.store.notifications import PendingNotification
from flowtide.store.pg.commands import Holder
from flowtide.store.pg.outbox import OutboxRow
from flowtide.store.postgres import PostgresStore
from flowtide.wire import ClaimItem, Notification, command_subject

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "After",
    "Handed",
    "Prepare",
    "Stepper",
    "SubmitResult",
    "Taker",
    "Written",
    "command_subject",
]

log = logging.getLogger(__name__)

#: Runs first in a step's transaction, on its connection (a check or a write of the
#: caller's); raising rolls the step back.
Prepare = Callable[["psycopg.Connection"], None]


@dataclass
class _Loaded:
    """What a step read under the execution's row lock."""

    conn: psycopg.Connection
    cached: CachedState
    #: Event ids of the step's events the log already holds.
    seen: set[int]
    #: The reported commands' rows.
    current: dict[int, Holder]


@dataclass
class Written:
    """One execution's writes of a step, queued in a pipeline: what to read back once
    it committed."""

    execution_id: int
    subject: str
    commands: list[Command]
    payloads: list[str]
    publish_now: bool
    deliveries: list[PendingNotification]
    #: Reads the commands' outbox rows once committed (`Pending.result`).
    issued: Callable[[], pg.commands.Issued] | None = None
    last_seq: pg.Pending[int] | None = None

    def settle(self, claims: list[Event], notices: list[OutboxRow]) -> int:
        """After the commit: the log's last seq; the outbox rows to publish now (those
        of the commands not handed to reporting workers) go to `notices`."""
        if self.issued is None:
            assert self.last_seq is not None
            return self.last_seq.result()
        got = self.issued()
        if self.publish_now:
            handed = {e.command_id for e in claims}
            notices.extend(
                OutboxRow(
                    got.outbox_ids[c.command_id],
                    self.execution_id,
                    c.command_id,
                    self.subject,
                    p,
                    1,
                )
                for c, p in zip(self.commands, self.payloads, strict=True)
                if c.command_id not in handed
            )
        return got.last_seq


class Stepper(GroupCommit, Creations):
    """Runs steps, one execution at a time per process (see the module's docstring);
    worker reports queue up behind them (`GroupCommit`)."""

    def __init__(
        self,
        store: PostgresStore,
        cache: StateCache,
        advancer: Advancer,
        ids: Snowflake,
        loopstate: LoopState | None,
        *,
        step_slots: int = 8,
    ) -> None:
        self.store = store
        self.cache = cache
        self.advancer = advancer
        self.ids = ids
        self.loopstate = loopstate
        #: The shard this process serves (its notifications' subjects say so).
        self.shard = 0
        #: Steps hold a pooled connection across awaits. Fewer of them than the pool has
        #: connections leaves some for the one-shot reads and claims that take theirs in a
        #: worker thread: otherwise every thread can end up waiting in getconn() for a
        #: connection held by a step that needs a thread to finish (a stall until the
        #: pool's timeout).
        self._slots = asyncio.Semaphore(step_slots)
        #: The lease (seconds) of a command claimed for a reporting worker.
        self.lease = 30.0
        GroupCommit.__init__(self)
        #: Called after a commit that added outbox rows (the relay's wake-up).
        self.on_outbox: Callable[[], None] | None = None
        #: The server-wide `notify:` targets (FLOWTIDE_NOTIFY_DEFAULT), and the notification
        #: relay's wake-up after a commit that owes deliveries.
        self.notify_defaults: tuple[NotifyTarget, ...] = ()
        self.on_notify: Callable[[], None] | None = None
        #: When set, called after a commit with the outbox rows it added, to publish them
        #: at once. They are written locked for `OUTBOX_HOLD` seconds, so the relay only
        #: publishes the ones this process fails to mark published by then.
        self.publish: Callable[[list[OutboxRow]], None] | None = None

    async def step(
        self,
        execution_id: int,
        incoming: list[Event],
        *,
        prepare: Prepare | None = None,
        fresh: CachedState | None = None,
        check_workers: bool = False,
        reissue: bool = False,
    ) -> SubmitResult:
        """One step over `incoming` under the execution's lock.

        Args:
            prepare: runs first in the transaction (see `Prepare`).
            fresh: the state of an execution this step creates (nothing to catch up).
            check_workers: `incoming` are worker reports: drop duplicates and stale ones.
            reissue: issue again the commands whose lease expired.
        """
        async with self.cache.lock(execution_id):
            results, after = await self._step_locked(
                execution_id,
                [incoming],
                prepare=prepare,
                fresh=fresh,
                check_workers=check_workers,
                reissue=reissue,
            )
        await self.after(after)
        return results[0]

    # -- the transaction -----------------------------------------------------------------

    async def _step_locked(
        self,
        execution_id: int,
        parts: list[list[Event]],
        *,
        prepare: Prepare | None = None,
        fresh: CachedState | None = None,
        check_workers: bool = False,
        reissue: bool = False,
        takers: list[Taker | None] | None = None,
    ) -> tuple[list[SubmitResult], After]:
        """One transaction over `parts` (one per caller, in order); the caller holds the
        execution's lock and calls `after` with the second value once it let go."""
        pool = self.store.pool("shard")
        async with self._slots:
            # The connection is taken in the step's first thread call and given back in
            # its last, after the commit (each thread hop costs a GIL hand-over under load).
            held: list[psycopg.Connection] = []
            ok = False
            try:
                results, out, cached, notices = await self._run(
                    pool, held, execution_id, parts, prepare, fresh, check_workers, reissue, takers
                )
                ok = True
            finally:
                if not ok:
                    self.cache.forget(execution_id)
                    if held:
                        await asyncio.to_thread(self._give_back, pool, held[0])
        self.cache.remember(execution_id, cached)
        ended = cached.state if tracing.enabled and out.finished else None
        return results, After(execution_id, cached.pool, results, out, notices, ended)

    @staticmethod
    def _give_back(pool: Any, conn: psycopg.Connection) -> None:
        """Return a connection whose transaction failed (rolled back first; one that
        PostgreSQL dropped cannot be: the pool discards it, and the step's error stands)."""
        try:
            conn.rollback()
        except Exception as exc:  # noqa: BLE001 - the step's own error is what callers get
            log.debug("rollback of a failed step: %s", exc)
        finally:
            pool.putconn(conn)

    async def _run(
        self,
        pool: Any,
        held: list[psycopg.Connection],
        execution_id: int,
        parts: list[list[Event]],
        prepare: Prepare | None,
        fresh: CachedState | None,
        check_workers: bool,
        reissue: bool,
        takers: list[Taker | None] | None = None,
    ) -> tuple[list[SubmitResult], Advance, CachedState, list[OutboxRow]]:
        results = [SubmitResult() for _ in parts]
        ids = [e.event_id for part in parts for e in part]
        named = reported_commands(parts) if check_workers else []

        def load() -> _Loaded:
            conn = self.store.getconn(pool)
            held.append(conn)
            if prepare is not None:
                prepare(conn)
            return self._lock_and_load(conn, execution_id, fresh, ids, named)

        loaded = await asyncio.to_thread(load)
        conn, cached, seen, current = loaded.conn, loaded.cached, loaded.seen, loaded.current
        state = cached.state
        reissued: list[Event] = []
        if reissue:
            reissued = await asyncio.to_thread(self._reissues, conn, state)
        out = Advance()
        recorded = await self._record_ahead(state, parts, seen, current) if check_workers else None
        for i, (part, result) in enumerate(zip(parts, results, strict=True)):
            # Each part is judged against the log and command rows as the parts before it
            # left them, as if it had come in its own transaction.
            result.duplicates = sum(1 for e in part if e.event_id in seen)
            todo = [e for e in part if e.event_id not in seen]
            if check_workers and todo:
                todo, result.stale = drop_stale(current, todo)
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
                settle(current, done.command_rows, state.terminal)
            result.accepted = len(todo)
            result.status = state.status
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
        claims: list[Event] = []
        if takers and commands and self.publish is not None:
            claims = self._hand_over(state, cached.pool, takers, commands, results)

        notices: list[OutboxRow] = []
        cached.last_seq = await asyncio.to_thread(
            self._write_and_commit,
            pool,
            held,
            conn,
            cached,
            out,
            commands,
            command_rows,
            claims,
            notices,
        )
        out.commands = commands
        results[0].reissued = len(reissued)
        return results, out, cached, notices

    def _lock_and_load(
        self,
        conn: psycopg.Connection,
        execution_id: int,
        fresh: CachedState | None,
        ids: list[int],
        named: list[int],
    ) -> _Loaded:
        """One round trip: the execution's row lock first, then (under it) what was
        committed since this process last stepped it, the event ids of the reports
        already in the log, and the reported commands' rows (those already in the log
        too: a few more rows locked is cheaper than a second round trip)."""
        cached = fresh or self.cache.get(execution_id)
        with conn.pipeline():
            lock = pg.executions.lock(conn, execution_id)
            since = None
            if cached is not None and fresh is None:
                since = pg.events.since(conn, execution_id, cached.last_seq, self.store.sealer)
            dup = pg.events.known_ids(conn, execution_id, ids) if ids else None
            rows = pg.commands.lock_reported(conn, named) if named else None
            if lock.result() is None:
                raise NotFoundError(f"execution {execution_id} not found")
            if cached is None:
                cached = self.cache.catch_up(conn, execution_id)
            elif since is not None:
                apply_logged(cached, since.result())
            seen = dup.result() if dup is not None else set()
            current = rows.result() if rows is not None else {}
        return _Loaded(conn, cached, seen, current)

    def _hand_over(
        self,
        state: ExecutionState,
        pool: str,
        takers: list[Taker | None],
        commands: list[Command],
        results: list[SubmitResult],
    ) -> list[Event]:
        """Give each part whose worker takes a next command of this execution's pool one
        of `commands`, in order (`SubmitResult.handed`); their `command.claimed` events,
        applied to `state` (the step writes them after the events that issue them)."""
        free = list(commands)
        now = time.time()
        claims: list[Event] = []
        for taker, result in zip(takers, results, strict=True):
            if not free:
                break
            if taker is None or taker.pool != pool:
                continue
            command = free.pop(0)
            assert command.issued_event_id is not None
            payload: ev.CommandClaimedPayload = {"attempt": command.attempt}
            event = Event(
                event_id=self.ids.next_id(),
                execution_id=state.execution_id,
                type=ev.COMMAND_CLAIMED,
                step=command.step,
                status="claimed",
                payload=payload,
                parent_event_id=command.issued_event_id,
                command_id=command.command_id,
                worker_id=taker.worker_id,
                time=now,
            )
            state.apply(event)
            claims.append(event)
            item = ClaimItem(state.execution_id, command.command_id, command.issued_event_id)
            taken = Taken(
                command.step,
                command.attempt,
                command.loop_instance,
                command.loop_index,
                pool,
                stopping=False,
                issued_at=now,
            )
            result.handed = Handed(item, taken)
        return claims

    def _reissues(self, conn: psycopg.Connection, state: ExecutionState) -> list[Event]:
        """`command.issued` events re-issuing the claimed commands whose lease expired."""
        now = time.time()
        expired = pg.commands.lock_expired(conn, state.execution_id, now)
        return reissue_events(expired, state, self.ids.next_id, now)

    def _write_and_commit(
        self,
        pool: Any,
        held: list[psycopg.Connection],
        conn: psycopg.Connection,
        cached: CachedState,
        out: Advance,
        commands: list[Command],
        command_rows: list[CommandUpdate],
        claims: list[Event],
        notices: list[OutboxRow],
    ) -> int:
        """Write the step, commit, give the connection back; the log's last seq. The
        outbox rows to publish now go to `notices`; `claims`: the `command.claimed` events
        of the commands handed to reporting workers."""
        # One round trip for all of it (the statements run in order on the server).
        with conn.pipeline():
            written = self._write(conn, cached, out, commands, command_rows, claims)
            # The COMMIT is queued behind the writes and goes with the pipeline's sync:
            # one round trip for the whole step, the commit's wait included.
            conn.commit()
        held.clear()
        pool.putconn(conn)
        if written.deliveries and self.on_notify is not None:
            self.on_notify()
        return written.settle(claims, notices)

    def _write(
        self,
        conn: psycopg.Connection,
        cached: CachedState,
        out: Advance,
        commands: list[Command],
        command_rows: list[CommandUpdate],
        claims: list[Event],
    ) -> Written:
        """Queue one execution's writes of a step on `conn` (in its pipeline)."""
        self._write_rows(conn, [(cached.state, out, command_rows, claims)])
        return self._write_rest(conn, cached, out, commands, claims)

    def _write_rows(
        self,
        conn: psycopg.Connection,
        parts: list[tuple[ExecutionState, Advance, list[CommandUpdate], list[Event]]],
    ) -> None:
        """The events, command rows and execution rows of steps of one or more
        executions: one statement each for all of them."""
        events: list[Event] = []
        sealed: dict[int, frozenset[str]] = {}
        command_rows: list[CommandUpdate] = []
        rows = []
        for state, out, commands_rows, claims in parts:
            # Written with the set as the step left it: a report's `secrets.added` came
            # before the events holding the values, and seals them all.
            secrets = state.secrets
            if secrets:
                sealed[state.execution_id] = secrets
            events += out.recorded
            events += claims
            command_rows += commands_rows
            rows += [
                (u.execution_id, *self.store.execution_update(u, secrets))
                for u in out.execution_rows
            ]
        PostgresStore.write_batch(
            conn,
            event_params(events, self.store.sealer, sealed or None),
            command_params(command_rows),
            rows,
        )

    def _write_rest(
        self,
        conn: psycopg.Connection,
        cached: CachedState,
        out: Advance,
        commands: list[Command],
        claims: list[Event],
        *,
        issue: bool = True,
    ) -> Written:
        """What follows the rows of one execution's step: claims, the commands' outbox
        rows (or its end; with `issue` false the caller issues the commands and sets
        `issued`), the deliveries it owes."""
        now = time.time()
        state = cached.state
        execution_id = state.execution_id
        publish_now = self.publish is not None
        subject = command_subject(cached.pool, execution_id, self.shard)
        payloads = [Notification.of(c).to_json() for c in commands]
        summary = _summary_text(state) if state.terminal and not commands else None
        # The deliveries the step's transitions owe, written with them (sent once).
        deliveries = owed({execution_id: state}, out.recorded, self.notify_defaults)
        written = Written(execution_id, subject, commands, payloads, publish_now, deliveries)
        if claims:
            pg.commands.claim_each(
                conn,
                [(e.command_id or 0, e.worker_id or "") for e in claims],
                now=now,
                lease_until=now + self.lease,
            )
        if commands and not issue:
            pass  # the caller issues them, for several executions at once
        elif commands:
            written.issued = pg.commands.issue(
                conn,
                execution_id,
                pool=cached.pool,
                subject=subject,
                command_ids=[c.command_id for c in commands],
                payloads=payloads,
                created=now,
                locked_until=now + OUTBOX_HOLD if publish_now else None,
                attempts=int(publish_now),
                claimed=[e.command_id or 0 for e in claims],
            ).result
        else:
            if state.terminal:
                # Nothing runs any more: open commands are closed with the execution.
                pg.commands.close_open(conn, execution_id, now)
            if summary is not None:
                # What the UI shows of it at a glance, kept with its end.
                pg.executions.put_summary(conn, execution_id, SUMMARY_FORMAT, summary)
            written.last_seq = pg.events.last_seq(conn, execution_id)
        pg.notifications.enqueue(conn, deliveries)
        return written

    async def _record_ahead(
        self,
        state: ExecutionState,
        parts: list[list[Event]],
        seen: set[int],
        current: dict[int, Holder],
    ) -> dict[int, bool] | None:
        """Record the loop iterations of all parts in the KV at once (one round trip for
        the step, not one per part), when the parts name disjoint commands: then what a
        part does to the command rows cannot make a later part's report stale, except by
        ending the execution, and an iteration recorded for a finished execution is
        harmless. None (each part records its own) otherwise."""
        if len(parts) < 2:
            return None
        candidates = disjoint_events(parts, seen)
        if candidates is None:
            return None
        fresh, _ = drop_stale(current, candidates)
        return await self.advancer.record_iterations({state.execution_id: state}, fresh)

    # -- after the commit ----------------------------------------------------------------

    async def after(self, after: After) -> None:
        """What follows a committed step, outside the lock."""
        if trace.enabled:
            trace.marks([c.command_id for c in after.out.commands], "issued")
        count_step(after.pool, after.results, after.out)
        if self.publish is not None:
            # This process publishes what it commits (the commands claimed for reporting
            # workers have nothing to publish): no relay pass.
            if after.notices:
                self.publish(after.notices)
                # Two turns of the loop: the publish task hands the notifications to the
                # NATS client, its flusher writes them to the socket. Without them the
                # notifications would wait behind the caller's HTTP reply (~1 ms).
                await asyncio.sleep(0)
                await asyncio.sleep(0)
        elif after.out.commands and self.on_outbox is not None:
            self.on_outbox()
        if after.out.finished and self.loopstate is not None:
            await self.loopstate.cleanup(after.execution_id)
        if after.ended is not None:
            execution_ended(after.ended, time.time())


def _summary_text(state: ExecutionState) -> str | None:
    """The JSON of an ended execution's kept summary part; None (logged) if it cannot be
    written (the summary is an optimisation of reads: the step goes on without it)."""
    try:
        return encode_value(kept_part(state), f"execution {state.execution_id}: summary")
    except StoreError as exc:
        log.warning("execution %s: summary not kept: %s", state.execution_id, exc)
        return None
