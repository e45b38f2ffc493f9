"""The executions' folded states one server process keeps, and their catch-up.

Any server process steps any execution, so the state a process cached may miss what
others appended since. Under the execution's row lock it first applies those events
(`catch_up`: the log's `seq` is the insertion order; workers' event ids are not in
arrival order), and only then advances the engine. The cache is only an optimisation: a
step that fails evicts its entry (`forget`), and a dropped entry is rebuilt from the log.

Claims read a `Snapshot` of the last committed state instead of the state itself, which
steps mutate (in the event loop and in worker threads) and which may hold uncommitted
events.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowtide.engine import events as ev
from flowtide.engine.state import CommandRecord, ExecutionState, LoopRecord
from flowtide.errors import NotFoundError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook
from flowtide.redaction import remember
from flowtide.store import pg
from flowtide.store.pg.events import LoggedEvent

if TYPE_CHECKING:
    import psycopg

    from flowtide.store.postgres import PostgresStore

__all__ = ["CachedState", "Snapshot", "StateCache", "apply_logged"]


@dataclass
class CachedState:
    """An execution's state folded up to `last_seq` of its log, and its worker pool."""

    state: ExecutionState
    pool: str
    last_seq: int = 0


@dataclass(frozen=True)
class Snapshot:
    """What a claim's reply reads from a state, taken while no step was changing it."""

    playbook: Playbook
    parts: dict[str, Any]
    status: str
    commands: dict[int, CommandRecord]
    loops: dict[tuple[str, int], LoopRecord]

    @classmethod
    def of(cls, state: ExecutionState) -> Snapshot:
        return cls(
            state.playbook,
            state.context_parts(),
            state.status,
            dict(state.commands),
            dict(state.loops),
        )


def apply_logged(cached: CachedState, logged: Iterable[LoggedEvent]) -> None:
    """Apply log rows (in seq order) to a cached state: its fold, its `last_seq`, its
    pool (from `playbook.initialized`) and the secrets this process masks in its logs."""
    for event, seq in logged:
        cached.state.apply(event)
        cached.last_seq = seq
        if event.type == ev.PLAYBOOK_INITIALIZED:
            cached.pool = (event.payload or {}).get("pool") or cached.pool
        elif event.type == ev.SECRETS_ADDED:
            # Logged by another server process: this one masks them in its logs too.
            remember(cached.state.secrets)


class StateCache:
    """Cached states by execution (least recently stepped dropped first), the asyncio
    lock that serialises an execution's steps inside this process, and the snapshots."""

    def __init__(
        self, store: PostgresStore, *, template_env: Mapping[str, str], size: int = 2000
    ) -> None:
        self.store = store
        self.template_env = template_env
        self.size = size
        self._states: OrderedDict[int, CachedState] = OrderedDict()
        self._locks: dict[int, asyncio.Lock] = {}
        #: Committed states as claim replies read them (one per cached execution).
        self._snapshots: dict[int, Snapshot] = {}

    def lock(self, execution_id: int) -> asyncio.Lock:
        """The execution's lock in this process (held around every step and catch-up)."""
        lock = self._locks.get(execution_id)
        if lock is None:
            lock = self._locks[execution_id] = asyncio.Lock()
            if len(self._locks) > 4 * self.size:
                for key in [k for k, v in self._locks.items() if not v.locked()][: self.size]:
                    del self._locks[key]
        return lock

    def get(self, execution_id: int) -> CachedState | None:
        return self._states.get(execution_id)

    def snapshot(self, execution_id: int) -> Snapshot | None:
        """The last committed state this process holds of the execution."""
        return self._snapshots.get(execution_id)

    def new(self, playbook: Playbook, execution_id: int, pool: str = "default") -> CachedState:
        """An empty state of a new execution (or one this process has not cached)."""
        return CachedState(ExecutionState(playbook, execution_id, self.template_env), pool)

    def remember(self, execution_id: int, cached: CachedState) -> None:
        """Keep a committed state (the caller holds the execution's lock)."""
        self._states[execution_id] = cached
        self._states.move_to_end(execution_id)
        self._snapshots[execution_id] = Snapshot.of(cached.state)
        while len(self._states) > self.size:
            old, _ = self._states.popitem(last=False)
            self._snapshots.pop(old, None)

    def forget(self, execution_id: int) -> None:
        self._states.pop(execution_id, None)
        self._snapshots.pop(execution_id, None)

    def catch_up(self, conn: psycopg.Connection, execution_id: int) -> CachedState:
        """The execution's state including everything committed so far, read on `conn`
        (the caller serialises: the execution's lock, and its row lock to write after)."""
        cached = self._states.get(execution_id)
        if cached is None:
            source = pg.executions.playbook_source(conn, execution_id)
            if source is None:
                raise NotFoundError(f"execution {execution_id} not found")
            cached = self.new(parse_playbook(source.text, source.file), execution_id)
        logged = pg.events.since(conn, execution_id, cached.last_seq, self.store.sealer)
        apply_logged(cached, logged.result())
        return cached

    async def read_locked(self, execution_id: int) -> CachedState:
        """Catch the execution up in its own transaction (the caller holds its lock)."""
        try:
            cached = await asyncio.to_thread(self._read, execution_id)
        except BaseException:
            # The catch-up may have applied part of the log to the cached state.
            self.forget(execution_id)
            raise
        self.remember(execution_id, cached)
        return cached

    def _read(self, execution_id: int) -> CachedState:
        with self.store.transaction("read state") as conn:
            return self.catch_up(conn, execution_id)

    async def state(self, execution_id: int) -> ExecutionState:
        """A caught-up state of the execution (read-only use)."""
        async with self.lock(execution_id):
            return (await self.read_locked(execution_id)).state
