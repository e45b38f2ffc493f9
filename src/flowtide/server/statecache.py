"""The executions' folded states one server process keeps, and their catch-up.

Any server process steps any execution, so the state a process cached may miss what
others appended since. Under the execution's row lock it first applies those events
(`catch_up`: the log's `seq` is the insertion order; workers' event ids are not in
arrival order), and only then advances the engine. The cache is only an optimisation: a
step that fails evicts its entry (`forget`), and a dropped entry is rebuilt from the log.

Claims read a `Snapshot` of the last committed state instead of the state itself, which
steps mutate (in the event loop and in worker threads) and which may hold uncommitted
events.

The cache is bounded by count and by bytes. Each cached state keeps an estimate of the
memory it holds (`SizedState.nbytes`, grown by every event applied to it from the sizes
of the values the fold keeps: results, collections, workloads, ctx), so the bound costs
no walk of the state. Running executions come first: the step that finishes an execution
moves its state out of them, into a short grace period (`finished_ttl`, for the reads and
late worker reports that follow an end) after which it is dropped; finished states are
also the first to go when room is needed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from flowtide.engine import events as ev
from flowtide.engine.context import NO_ENV
from flowtide.engine.state import FOLDED_TYPES, CommandRecord, ExecutionState, LoopRecord
from flowtide.errors import NotFoundError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook
from flowtide.redaction import remember
from flowtide.store import pg
from flowtide.store.base import ENDED_STATUSES
from flowtide.store.pg.events import LoggedEvent

if TYPE_CHECKING:
    import psycopg

    from flowtide.store.postgres import PostgresStore

__all__ = [
    "DEFAULT_MAX_BYTES",
    "CachedState",
    "SizedState",
    "Snapshot",
    "StateCache",
    "apply_logged",
    "state_bytes",
]

#: The cache's default budget: the estimated bytes of the states one process keeps.
DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024
#: Seconds a finished execution's state stays after its last use.
DEFAULT_FINISHED_TTL: Final = 10.0

# The estimate, calibrated with tracemalloc against folds of 5,000-iteration loops whose
# results are a small dict, a 200-character string or 20 rows: within 15% of the memory
# the fold holds (1.75x over when every result is null, a state that small anyway). A
# state is its playbook's model, a little per event (list slots, loop bookkeeping) and
# the values it keeps, which hold about their JSON text plus an object per dict or list.
_PLAYBOOK_BYTES: Final = 16 * 1024
_PLAYBOOK_BYTES_PER_CHAR: Final = 16
_EVENT_BYTES: Final = 32
_CONTAINER_BYTES: Final = 256
#: The payload keys of the values the fold keeps, by event type: a command's result, ctx
#: and per-task results, a loop's collection, a cursor's rows, the workload, `set:`
#: values, secrets. (A command's error is kept too.)
_KEPT: Final[dict[str, tuple[str, ...]]] = {
    ev.PLAYBOOK_INITIALIZED: ("workload",),
    ev.LOOP_STARTED: ("collection",),
    ev.LOOP_CLAIMED: ("rows",),
    ev.COMMAND_COMPLETED: ("result", "ctx", "tasks"),
    ev.COMMAND_FAILED: ("result", "ctx", "tasks"),
    ev.CTX_UPDATED: ("set",),
    ev.STEP_EXIT: ("set",),
    ev.SECRETS_ADDED: ("values",),
}


def _value_bytes(value: Any) -> int:
    """Estimated memory of a JSON value once decoded: its text, plus an object per dict
    and list."""
    if value is None:
        return 0
    try:
        text = json.dumps(value, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return 1024
    return len(text) + _CONTAINER_BYTES * (text.count("{") + text.count("["))


def event_bytes(event: ev.Event) -> int:
    """What applying `event` adds to a state's estimated size."""
    keys = _KEPT.get(event.type)
    if keys is None:
        return _EVENT_BYTES
    payload = ev.payload_fields(event)
    kept = sum(_value_bytes(payload.get(key)) for key in keys)
    return _EVENT_BYTES + kept + _value_bytes(event.error)


def _playbook_bytes(playbook: Playbook) -> int:
    return _PLAYBOOK_BYTES + _PLAYBOOK_BYTES_PER_CHAR * len(playbook.text or "")


class SizedState(ExecutionState):
    """An ExecutionState that keeps `nbytes`, an estimate of the memory it holds, grown
    by each event applied (however it is applied: a step's advance or a catch-up). The
    server's workers run chunks of loop iterations (`flowtide.engine.chunks`)."""

    batching = True

    def __init__(
        self, playbook: Playbook, execution_id: int, env: Mapping[str, str] = NO_ENV
    ) -> None:
        super().__init__(playbook, execution_id, env)
        self.nbytes = _playbook_bytes(playbook)

    def apply(self, event: ev.Event) -> None:
        super().apply(event)
        self.nbytes += event_bytes(event)


def state_bytes(state: ExecutionState) -> int:
    """A state's estimated size: kept by a `SizedState`, from its event count otherwise."""
    if isinstance(state, SizedState):
        return state.nbytes
    return _playbook_bytes(state.playbook) + _EVENT_BYTES * state.event_count


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
    #: `ExecutionState.context_rev` of `parts`.
    revision: int = 0
    #: What the execution started under (`flowtide.tracing`).
    traceparent: str | None = None
    #: The items progress of its steps that run many items in one command (spark loops).
    items: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(cls, state: ExecutionState) -> Snapshot:
        return cls(
            state.playbook,
            state.context_parts(),
            state.status,
            dict(state.commands),
            dict(state.loops),
            state.context_rev,
            state.traceparent,
            tuple(dict(r.items) for r in state.steps.values() if r.items is not None),
        )


def apply_logged(cached: CachedState, logged: Iterable[LoggedEvent]) -> None:
    """Apply log rows (in seq order) to a cached state: its fold, its `last_seq`, its
    pool (from `playbook.initialized`) and the secrets this process masks in its logs."""
    for event, seq in logged:
        cached.state.apply(event)
        cached.last_seq = seq
        if event.type == ev.PLAYBOOK_INITIALIZED:
            cached.pool = ev.payload_of(event, ev.PLAYBOOK_INITIALIZED).get("pool") or cached.pool
        elif event.type == ev.SECRETS_ADDED:
            # Logged by another server process: this one masks them in its logs too.
            remember(cached.state.secrets)


class StateCache:
    """Cached states by execution, the asyncio lock that serialises an execution's steps
    inside this process, and the snapshots.

    At most `size` states of at most `max_bytes` (estimated, `state_bytes`) in all. A
    running execution's state stays until room is needed, the least recently stepped
    first; the step that finishes an execution moves its state to the finished ones
    (as does a read of a finished execution), which are dropped `finished_ttl` seconds
    after their last use, and before any running one when room is needed. The state just
    remembered always stays, even alone over the budget: a running execution needs its
    state for its next step, and folding it again each step would cost far more.
    """

    def __init__(
        self,
        store: PostgresStore,
        *,
        template_env: Mapping[str, str],
        size: int = 2000,
        max_bytes: int = DEFAULT_MAX_BYTES,
        finished_ttl: float = DEFAULT_FINISHED_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.template_env = template_env
        self.size = size
        self.max_bytes = max_bytes
        self.finished_ttl = finished_ttl
        self._clock = clock
        self._states: dict[int, CachedState] = {}
        #: The running executions' ids, least recently stepped first.
        self._running: OrderedDict[int, None] = OrderedDict()
        #: The finished executions' ids with the time each is dropped at, oldest first.
        self._finished: OrderedDict[int, float] = OrderedDict()
        #: The estimated size of each cached state when it was last remembered.
        self._sizes: dict[int, int] = {}
        #: Their sum.
        self.nbytes = 0
        self._locks: dict[int, asyncio.Lock] = {}
        #: Committed states as claim replies read them (one per cached execution).
        self._snapshots: dict[int, Snapshot] = {}

    @property
    def count(self) -> int:
        """How many states are cached."""
        return len(self._states)

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

    def finished(self, execution_id: int) -> bool:
        """Whether the execution's state is cached as a finished one."""
        return execution_id in self._finished

    def snapshot(self, execution_id: int) -> Snapshot | None:
        """The last committed state this process holds of the execution."""
        return self._snapshots.get(execution_id)

    def new(self, playbook: Playbook, execution_id: int, pool: str = "default") -> CachedState:
        """An empty state of a new execution (or one this process has not cached)."""
        return CachedState(SizedState(playbook, execution_id, self.template_env), pool)

    def remember(self, execution_id: int, cached: CachedState) -> None:
        """Keep a committed state (the caller holds the execution's lock): among the
        running ones, or, once it is terminal, among the finished ones for
        `finished_ttl` seconds. Then drop what the bounds leave no room for."""
        now = self._clock()
        self._states[execution_id] = cached
        self._snapshots[execution_id] = Snapshot.of(cached.state)
        size = state_bytes(cached.state)
        self.nbytes += size - self._sizes.get(execution_id, 0)
        self._sizes[execution_id] = size
        if cached.state.terminal:
            self._running.pop(execution_id, None)
            self._finished.pop(execution_id, None)
            self._finished[execution_id] = now + self.finished_ttl
        else:
            self._finished.pop(execution_id, None)
            self._running[execution_id] = None
            self._running.move_to_end(execution_id)
        self._trim(now, execution_id)

    def _trim(self, now: float, keep: int) -> None:
        """Drop finished states past their time, then, while over a bound, the oldest
        finished one, else the least recently stepped running one; never `keep`."""
        while self._finished:
            oldest, until = next(iter(self._finished.items()))
            if until > now or oldest == keep:
                break
            self.forget(oldest)
        while len(self._states) > self.size or self.nbytes > self.max_bytes:
            victim = next((k for k in self._finished if k != keep), None)
            if victim is None:
                victim = next((k for k in self._running if k != keep), None)
            if victim is None:
                return
            self.forget(victim)

    def forget(self, execution_id: int) -> None:
        self._states.pop(execution_id, None)
        self._snapshots.pop(execution_id, None)
        self._running.pop(execution_id, None)
        self._finished.pop(execution_id, None)
        self.nbytes -= self._sizes.pop(execution_id, 0)

    def catch_up(self, conn: psycopg.Connection, execution_id: int) -> CachedState:
        """The execution's state including everything committed so far, read on `conn`
        (the caller serialises: the execution's lock, and its row lock to write after)."""
        cached = self._states.get(execution_id)
        types = None
        if cached is None:
            source = pg.executions.playbook_source(conn, execution_id)
            if source is None:
                raise NotFoundError(f"execution {execution_id} not found")
            cached = self.new(parse_playbook(source.text, source.file), execution_id)
            if source.status in ENDED_STATUSES:
                # Read, never stepped again: only the events that change the fold (a
                # loop's command.started, call.done and loop.item are 3 of its 5 events
                # per iteration; a 100,000-iteration run's state reads in 2.1-2.7 s
                # instead of 5-7.6).
                types = FOLDED_TYPES
        logged = pg.events.since(
            conn, execution_id, cached.last_seq, self.store.sealer, types=types
        )
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
