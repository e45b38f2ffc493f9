"""flowtide.server.statecache: catching a cached state up with log rows, the cache's
eviction and the snapshots claims read. In memory, no database: the cache is an
optimisation, so a state caught up in pieces must equal one folded from the whole log."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import FOLDED_TYPES, ExecutionState
from flowtide.redaction import known
from flowtide.server.statecache import (
    CachedState,
    SizedState,
    StateCache,
    apply_logged,
    state_bytes,
)
from flowtide.store.pg.events import LoggedEvent

from .driver import EXECUTION_ID, NOW, Driver, snapshot

LOOP = """
workflow:
  - step: start
    tool: {kind: noop}
    next: [{step: each}]
  - step: each
    loop: {in: "{{ [1, 2, 3, 4] }}", iterator: n, spec: {mode: parallel, max_in_flight: 2}}
    tool: {kind: noop}
    next: [{step: end}]
  - step: end
    tool: {kind: noop}
"""


def logged(events: list[Event], first_seq: int = 1) -> list[LoggedEvent]:
    # Seqs with gaps, as other executions' rows take numbers in between.
    return [LoggedEvent(e, first_seq + 3 * i) for i, e in enumerate(events)]


def fresh(driver: Driver) -> CachedState:
    return CachedState(ExecutionState(driver.playbook, EXECUTION_ID), "default")


def test_a_state_caught_up_in_pieces_equals_the_fold_of_the_whole_log() -> None:
    driver = Driver(LOOP).run()
    assert driver.state.status == "completed"
    rows = logged(driver.log)
    whole = fresh(driver)
    apply_logged(whole, rows)
    assert snapshot(whole.state) == snapshot(driver.state)
    assert whole.last_seq == rows[-1].seq
    # Another server process appended in between: the cached state applies only what is
    # new, in seq order.
    pieces = fresh(driver)
    for start in range(0, len(rows), 5):
        apply_logged(pieces, rows[start : start + 5])
        assert pieces.last_seq == rows[min(start + 5, len(rows)) - 1].seq
    assert snapshot(pieces.state) == snapshot(whole.state)


def test_a_finished_state_read_from_the_folded_types_alone_equals_the_whole() -> None:
    # What the cache reads of an execution that has ended (never stepped again).
    driver = Driver(LOOP).run()
    rows = logged(driver.log)
    some = [r for r in rows if r.event.type in FOLDED_TYPES]
    assert len(some) < len(rows)  # a loop's command.started, call.done, loop.item left out
    folded = fresh(driver)
    apply_logged(folded, some)
    assert snapshot(folded.state) == snapshot(driver.state)
    # A later catch-up from there (an event logged after the end) still applies in order.
    apply_logged(folded, [r for r in rows if r.seq > folded.last_seq])
    assert snapshot(folded.state) == snapshot(driver.state)


def test_nothing_new_changes_nothing() -> None:
    driver = Driver(LOOP).start()
    cached = fresh(driver)
    apply_logged(cached, logged(driver.log))
    before, seq = snapshot(cached.state), cached.last_seq
    apply_logged(cached, [])
    assert snapshot(cached.state) == before
    assert cached.last_seq == seq


def test_the_pool_comes_from_playbook_initialized() -> None:
    driver = Driver(LOOP)
    first = driver.initialized()
    first = dataclasses.replace(first, payload={**(first.payload or {}), "pool": "gpu"})
    cached = fresh(driver)
    apply_logged(cached, logged([first]))
    assert cached.pool == "gpu"
    # Without one, the default stays.
    other = fresh(driver)
    apply_logged(other, logged([driver.initialized()]))
    assert other.pool == "default"


def test_secrets_logged_by_another_process_are_masked_in_this_ones_logs() -> None:
    driver = Driver(LOOP)
    secret = "s3cr3t-from-another-server-0042"
    added = Event(
        event_id=driver.new_id(),
        execution_id=EXECUTION_ID,
        type=ev.SECRETS_ADDED,
        status="ok",
        payload={"values": [secret]},
        time=NOW,
    )
    cached = fresh(driver)
    apply_logged(cached, logged([driver.initialized(), added]))
    assert secret in cached.state.secrets
    assert secret in known()


def _cache(size: int) -> StateCache:
    # The in-memory half only: no store is reached.
    return StateCache(cast(Any, None), template_env={}, size=size)


def test_the_least_recently_stepped_execution_is_dropped_with_its_snapshot() -> None:
    cache = _cache(2)
    driver = Driver(LOOP).start()
    states = {eid: CachedState(ExecutionState(driver.playbook, eid), "default") for eid in (1, 2)}
    cache.remember(1, states[1])
    cache.remember(2, states[2])
    cache.remember(1, states[1])  # stepped again: now the most recent
    cache.remember(3, CachedState(ExecutionState(driver.playbook, 3), "default"))
    assert cache.get(2) is None and cache.snapshot(2) is None
    assert cache.get(1) is states[1] and cache.snapshot(1) is not None
    cache.forget(1)
    assert cache.get(1) is None and cache.snapshot(1) is None


def test_a_snapshot_does_not_move_with_the_state_a_step_mutates() -> None:
    cache = _cache(10)
    driver = Driver(LOOP).start()
    cached = fresh(driver)
    apply_logged(cached, logged(driver.log))
    cache.remember(EXECUTION_ID, cached)
    snap = cache.snapshot(EXECUTION_ID)
    assert snap is not None
    commands, status = dict(snap.commands), snap.status
    # A step in progress applies events to the state (not committed yet).
    command, seen = driver.outstanding[0], len(driver.log)
    driver.answer(command)
    apply_logged(cached, logged(driver.log[seen:], first_seq=cached.last_seq + 1))
    assert snap.commands == commands and snap.status == status
    assert command.command_id in snap.commands
    assert command.command_id not in cached.state.commands


def test_locks_are_per_execution_and_kept_while_held() -> None:
    cache = _cache(1)
    assert cache.lock(1) is cache.lock(1)
    assert cache.lock(1) is not cache.lock(2)


# -- the bound by bytes and finished executions --------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _sized(driver: Driver, eid: int, events: list[Event] | None = None) -> CachedState:
    cached = StateCache(cast(Any, None), template_env={}).new(driver.playbook, eid)
    apply_logged(cached, logged(events if events is not None else driver.log))
    return cached


def _running(driver: Driver, eid: int) -> CachedState:
    cached = _sized(driver, eid, driver.log[:1])
    assert not cached.state.terminal
    return cached


def test_a_sized_state_folds_as_a_plain_one_and_grows_with_what_it_keeps() -> None:
    small = Driver(LOOP, respond=lambda d, c: {"result": {"n": 1}}).run()
    large = Driver(LOOP, respond=lambda d, c: {"result": {"text": "x" * 10_000}}).run()
    sized = _sized(small, EXECUTION_ID)
    assert isinstance(sized.state, SizedState)
    assert snapshot(sized.state) == snapshot(small.state)
    # Each event adds to the estimate; the six 10 kB results (start, four iterations,
    # end) add about their size.
    before = _sized(small, EXECUTION_ID, small.log[:1]).state.nbytes
    assert state_bytes(sized.state) > before
    grown = state_bytes(_sized(large, EXECUTION_ID).state) - state_bytes(sized.state)
    assert 6 * 10_000 <= grown <= 6 * 10_000 + 6 * 1024
    # A plain state (not made by the cache) is estimated from its event count.
    plain = fresh(small)
    apply_logged(plain, logged(small.log))
    assert state_bytes(plain.state) > state_bytes(fresh(small).state)


def test_the_estimate_is_near_the_memory_a_long_loop_holds() -> None:
    import gc
    import json
    import tracemalloc

    playbook = LOOP.replace('"{{ [1, 2, 3, 4] }}"', '"{{ range(2000) | list }}"')
    driver = Driver(playbook, respond=lambda d, c: {"result": {"i": c.loop_index, "sq": 7}})
    driver.run(max_rounds=100_000)
    # Decoded afresh, as the server reads its log: nothing shared with the driver's events.
    docs = [json.dumps(e.to_dict()) for e in driver.log]
    cache = _cache(10)
    gc.collect()
    tracemalloc.start()
    try:
        cached = cache.new(driver.playbook, EXECUTION_ID)
        for doc in docs:
            cached.state.apply(Event.from_dict(json.loads(doc)))
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    estimate = state_bytes(cached.state)
    assert held / 2 <= estimate <= held * 2, (estimate, held)


def test_the_least_recently_stepped_go_first_when_the_bytes_run_out() -> None:
    driver = Driver(LOOP).start()
    states = {eid: _running(driver, eid) for eid in (1, 2, 3)}
    each = state_bytes(states[1].state)
    cache = StateCache(cast(Any, None), template_env={}, max_bytes=2 * each)
    cache.remember(1, states[1])
    cache.remember(2, states[2])
    assert cache.nbytes == 2 * each and cache.count == 2
    cache.remember(1, states[1])  # stepped again: now the most recent
    cache.remember(3, states[3])
    assert cache.get(2) is None and cache.snapshot(2) is None
    assert cache.get(1) is states[1] and cache.get(3) is states[3]
    assert cache.nbytes == 2 * each
    # A state that grew is counted again when it is remembered, and makes room for itself.
    command = driver.outstanding[0]
    states[3].state.apply(driver.completion(command, {"result": {"text": "x" * 5000}}))
    cache.remember(3, states[3])
    assert cache.get(1) is None and cache.get(3) is states[3]
    assert cache.nbytes == state_bytes(states[3].state)
    cache.forget(3)
    assert cache.nbytes == 0 and cache.count == 0


def test_a_state_over_the_budget_alone_stays_while_it_is_stepped() -> None:
    driver = Driver(LOOP).start()
    cache = StateCache(cast(Any, None), template_env={}, max_bytes=1)
    cache.remember(1, _running(driver, 1))
    assert cache.get(1) is not None
    cache.remember(2, _running(driver, 2))
    assert cache.get(1) is None and cache.get(2) is not None


def test_the_step_that_finishes_an_execution_drops_its_state() -> None:
    clock = Clock()
    done = Driver(LOOP).run()
    cache = StateCache(cast(Any, None), template_env={}, finished_ttl=5.0, clock=clock)
    running = _running(Driver(LOOP).start(), 2)
    cache.remember(2, running)
    # Execution 1 steps while running, then the step that ends it.
    cached = _sized(done, 1, done.log[:1])
    cache.remember(1, cached)
    assert not cache.finished(1)
    apply_logged(cached, logged(done.log[1:], first_seq=cached.last_seq + 1))
    assert cached.state.terminal
    cache.remember(1, cached)
    # Out of the running ones at once; still there for the reads and late reports that
    # follow an end...
    assert cache.finished(1) and cache.get(1) is cached and cache.snapshot(1) is not None
    clock.now += 4.0
    cache.remember(2, running)
    assert cache.get(1) is cached
    # ...and dropped once its time is up (at the cache's next use).
    clock.now += 1.5
    cache.remember(2, running)
    assert cache.get(1) is None and cache.snapshot(1) is None
    assert cache.nbytes == state_bytes(running.state) and cache.count == 1
    # A read of a finished execution keeps it for as long.
    cache.remember(1, _sized(done, 1))
    assert cache.finished(1)
    clock.now += 6.0
    cache.remember(2, running)
    assert cache.get(1) is None


def test_without_a_grace_period_a_finished_state_goes_at_the_next_use() -> None:
    done = Driver(LOOP).run()
    cache = StateCache(cast(Any, None), template_env={}, finished_ttl=0.0)
    cache.remember(1, _sized(done, 1))
    # Kept for the caller that remembered it (a claim reads its snapshot right after).
    assert cache.snapshot(1) is not None
    cache.remember(2, _running(Driver(LOOP).start(), 2))
    assert cache.get(1) is None and cache.get(2) is not None


def test_finished_states_make_room_before_running_ones() -> None:
    done = Driver(LOOP).run()
    start = Driver(LOOP).start()
    finished = _sized(done, 1)
    running = {eid: _running(start, eid) for eid in (2, 3)}
    room = state_bytes(finished.state) + state_bytes(running[2].state)
    cache = StateCache(cast(Any, None), template_env={}, max_bytes=room, finished_ttl=60.0)
    cache.remember(2, running[2])  # the least recently stepped...
    cache.remember(1, finished)
    cache.remember(3, running[3])  # ...but the finished one goes first
    assert cache.get(1) is None
    assert cache.get(2) is not None and cache.get(3) is not None
    # The count bound treats them the same way.
    cache = StateCache(cast(Any, None), template_env={}, size=2, finished_ttl=60.0)
    cache.remember(2, running[2])
    cache.remember(1, finished)
    cache.remember(3, running[3])
    assert cache.get(1) is None and cache.count == 2
