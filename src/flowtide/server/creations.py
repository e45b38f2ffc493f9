"""New executions created together: a burst of trigger firings (a minute's thousand
schedules) costs a few transactions, not one per run (`Coordinator.execute_many`).

`Stepper.create_many` takes the executions' empty states and starting events and the
caller's `PrepareMany` (their rows and their triggers' firings, written on the step's
connection; it says which it refused, AlreadyFired). The others each take their first
engine step, and everything goes in one pipeline and one commit: one statement each for
all their events, command rows, execution rows, and commands' outbox rows. The rest is
what a step does for one execution (`flowtide.server.steps`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from flowtide.errors import FlowtideError
from flowtide.runtime.advance import Advance
from flowtide.server.outbox import OUTBOX_HOLD
from flowtide.server.results import After, SubmitResult
from flowtide.store import pg

if TYPE_CHECKING:
    import psycopg

    from flowtide.engine.events import Command, Event
    from flowtide.engine.state import ExecutionState
    from flowtide.runtime.advance import Advancer
    from flowtide.server.statecache import CachedState, StateCache
    from flowtide.server.steps import Written
    from flowtide.store.base import CommandUpdate
    from flowtide.store.postgres import PostgresStore

__all__ = ["Creation", "Creations", "PrepareMany"]


class Creation(NamedTuple):
    """A new execution for `Stepper.create_many`: its empty state and the events that
    start it."""

    fresh: CachedState
    incoming: list[Event]


#: Writes the rows that create a batch of executions, on the step's connection; in the
#: place of each, None or why it is refused (nothing of it written).
PrepareMany = Callable[["psycopg.Connection"], "list[FlowtideError | None]"]


class _Created(NamedTuple):
    execution_id: int
    cached: CachedState
    after: After


class Creations:
    """`create_many`, a part of `flowtide.server.steps.Stepper`."""

    store: PostgresStore
    cache: StateCache
    advancer: Advancer
    shard: int
    _slots: asyncio.Semaphore
    publish: Callable[[list[Any]], None] | None
    on_notify: Callable[[], None] | None

    # -- the Stepper's ------------------------------------------------------------------

    def _write_rows(
        self,
        conn: psycopg.Connection,
        parts: list[tuple[ExecutionState, Advance, list[CommandUpdate], list[Event]]],
    ) -> None:
        raise NotImplementedError

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
        raise NotImplementedError

    @staticmethod
    def _give_back(pool: Any, conn: psycopg.Connection) -> None:
        raise NotImplementedError

    async def after(self, after: After) -> None:
        raise NotImplementedError

    # -- creating ------------------------------------------------------------------------

    async def create_many(
        self, creations: Sequence[Creation], prepare: PrepareMany
    ) -> list[SubmitResult | FlowtideError]:
        """New executions, each with its first step, in one transaction: `prepare`
        writes what creates them and says which it refused: those are not stepped and
        leave no trace. In the place of each, its result or why it was refused."""
        if not creations:
            return []
        pool = self.store.pool("shard")
        created: list[_Created] = []
        async with contextlib.AsyncExitStack() as locks:
            # New ids nobody else knows yet: the locks are free; taken so that a report
            # arriving right after the commit waits for the states to be remembered.
            for creation in creations:
                await locks.enter_async_context(self.cache.lock(creation.fresh.state.execution_id))
            async with self._slots:
                held: list[psycopg.Connection] = []
                ok = False
                try:
                    outcomes, created = await self._create_all(pool, held, creations, prepare)
                    ok = True
                finally:
                    if not ok:
                        for creation in creations:
                            self.cache.forget(creation.fresh.state.execution_id)
                        if held:
                            await asyncio.to_thread(self._give_back, pool, held[0])
            for one in created:
                self.cache.remember(one.execution_id, one.cached)
        for one in created:
            await self.after(one.after)
        return outcomes

    async def _create_all(
        self,
        pool: Any,
        held: list[psycopg.Connection],
        creations: Sequence[Creation],
        prepare: PrepareMany,
    ) -> tuple[list[SubmitResult | FlowtideError], list[_Created]]:
        def prepare_all() -> list[FlowtideError | None]:
            conn = self.store.getconn(pool)
            held.append(conn)
            refused = prepare(conn)
            if len(refused) != len(creations):
                raise AssertionError("prepare must answer for every creation")
            return refused

        refused = await asyncio.to_thread(prepare_all)
        conn = held[0]
        outcomes: list[SubmitResult | FlowtideError] = []
        steps: list[tuple[CachedState, Advance, SubmitResult]] = []
        for creation, error in zip(creations, refused, strict=True):
            if error is not None:
                outcomes.append(error)
                continue
            state = creation.fresh.state
            out = await self.advancer.advance(
                {state.execution_id: state}, creation.incoming, time.time()
            )
            result = SubmitResult(accepted=len(creation.incoming), status=state.status)
            outcomes.append(result)
            steps.append((creation.fresh, out, result))

        def write_all() -> list[_Created]:
            now = time.time()
            publish_now = self.publish is not None
            with conn.pipeline():
                self._write_rows(
                    conn, [(c.state, out, list(out.command_rows), []) for c, out, _ in steps]
                )
                written = [
                    self._write_rest(conn, cached, out, list(out.commands), [], issue=False)
                    for cached, out, _ in steps
                ]
                issuing = [w for w in written if w.commands]
                issued = None
                if issuing:
                    issued = pg.commands.issue_many(
                        conn,
                        [
                            pg.commands.ToIssue(
                                w.execution_id,
                                cached.pool,
                                w.subject,
                                [c.command_id for c in w.commands],
                                w.payloads,
                            )
                            for (cached, _, _), w in zip(steps, written, strict=True)
                            if w.commands
                        ],
                        created=now,
                        locked_until=now + OUTBOX_HOLD if publish_now else None,
                        attempts=int(publish_now),
                    )
                conn.commit()
            held.clear()
            pool.putconn(conn)
            if any(w.deliveries for w in written) and self.on_notify is not None:
                self.on_notify()
            found = issued.result() if issued is not None else {}
            made = []
            for (cached, out, result), w in zip(steps, written, strict=True):
                if w.commands:
                    w.issued = _returning(found[w.execution_id])
                notices: list[Any] = []
                cached.last_seq = w.settle([], notices)
                after = After(cached.state.execution_id, cached.pool, [result], out, notices)
                made.append(_Created(cached.state.execution_id, cached, after))
            return made

        return outcomes, await asyncio.to_thread(write_all)


def _returning(issued: pg.commands.Issued) -> Callable[[], pg.commands.Issued]:
    return lambda: issued
