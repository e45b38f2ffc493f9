"""flowtide.server.statecache: catching a cached state up with log rows, the cache's
eviction and the snapshots claims read. In memory, no database: the cache is an
optimisation, so a state caught up in pieces must equal one folded from the whole log."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import ExecutionState
from flowtide.redaction import known
from flowtide.server.statecache import CachedState, StateCache, apply_logged
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
