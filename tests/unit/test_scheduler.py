"""The scheduler over a real (SQLite) store with a fake clock: which slots start runs,
once each, however many schedulers race; pause, resume, overlap, catchup, backfill."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from flowtide.errors import TriggerError
from flowtide.store.sqlite import SQLiteStore
from flowtide.store.triggers import Firing
from flowtide.triggers.scheduler import Scheduler, fire_now, run_backfill, slot_key
from flowtide.triggers.schedules import define_schedule, schedule_from_fields

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: tick, path: tests/tick}
workload: {slot: none}
workflow:
  - step: start
    tool: {kind: noop}
"""

# 2026-01-01T00:00:00Z: every slot below is a round number of seconds after it.
T0 = 1_767_225_600.0
_ids = itertools.count(1_000)


class FakeFirer:
    """Starts a run by writing its execution row with the firing (as the runtimes do);
    runs stay 'running' until the test ends them."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self.started: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[int] = []

    @property
    def store(self) -> SQLiteStore:
        return self._store

    def owns(self, trigger_id: int) -> bool:
        return True

    async def start(
        self, playbook: Any, *, workload: dict[str, Any], version: int | None, firing: Firing
    ) -> int:
        execution_id = next(_ids)
        self.store.create_execution(
            execution_id,
            playbook_path=playbook.path,
            playbook_version=version,
            playbook_file=None,
            playbook_text=playbook.text,
            workload=workload,
            created=T0,
            firing=firing,
        )
        self.store.update_execution(execution_id, status="running", updated=T0)
        self.started.append((firing.key, workload))
        return execution_id

    async def cancel(self, execution_id: int, reason: str) -> None:
        self.cancelled.append(execution_id)
        self.store.update_execution(execution_id, status="cancelled", updated=T0)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SQLiteStore(tmp_path / "flowtide.db")
    s.register_playbook("tests/tick", PLAYBOOK, source_file=None, created=T0)
    yield s
    s.close()


def add(store: SQLiteStore, name: str = "tick", *, now: float = T0, **fields: Any) -> Any:
    fields.setdefault("every", "10s")
    spec = schedule_from_fields(name, {"playbook": "tests/tick", **fields})
    return define_schedule(store, spec, new_id=lambda: next(_ids), now=now, local=True)


def end_all(store: SQLiteStore) -> None:
    for row in store.list_executions(status="running", limit=1000):
        store.update_execution(row.execution_id, status="completed", updated=T0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_each_slot_fires_once_with_the_slot_in_its_workload(store: SQLiteStore) -> None:
    add(
        store,
        overlap="allow",
        workload={"slot": "{{ schedule.slot }}", "who": "{{ schedule.name }}"},
    )
    firer, clock = FakeFirer(store), Clock(T0 + 35)
    scheduler = Scheduler(firer, clock=clock)
    run(scheduler.tick())
    keys = [key for key, _ in firer.started]
    assert keys == [slot_key(T0 + s) for s in (10, 20, 30)]
    assert firer.started[0][1] == {"slot": "2026-01-01T00:00:10Z", "who": "tick"}
    # The same instant again, and a later one: only the new slot.
    run(scheduler.tick())
    clock.now = T0 + 41
    run(scheduler.tick())
    assert [key for key, _ in firer.started][3:] == [slot_key(T0 + 40)]
    rows = store.list_executions(trigger="schedule:tick", limit=100)
    assert sorted(r.trigger["slot"] for r in rows if r.trigger) == sorted(
        slot_key(T0 + s) for s in (10, 20, 30, 40)
    )


def test_racing_schedulers_start_each_slot_once(store: SQLiteStore) -> None:
    add(store, overlap="allow")
    firers = [FakeFirer(store) for _ in range(3)]
    clock = Clock(T0)
    schedulers = [Scheduler(f, clock=clock) for f in firers]

    async def race() -> None:
        for step in range(1, 31):
            clock.now = T0 + step * 10
            await asyncio.gather(*(s.tick() for s in schedulers))

    run(race())
    keys = [key for f in firers for key, _ in f.started]
    assert sorted(keys) == sorted(slot_key(T0 + s * 10) for s in range(1, 31))
    assert len(store.list_executions(limit=1000)) == 30


def test_skip_leaves_slots_while_a_run_goes_and_records_why(store: SQLiteStore) -> None:
    row = add(store)  # overlap skip
    firer, clock = FakeFirer(store), Clock(T0 + 10)
    scheduler = Scheduler(firer, clock=clock)
    run(scheduler.tick())
    clock.now = T0 + 30
    run(scheduler.tick())
    assert [k for k, _ in firer.started] == [slot_key(T0 + 10)]
    skipped = store.firings(row.trigger_id, status="skipped")
    assert sorted(f.key for f in skipped) == [slot_key(T0 + 20), slot_key(T0 + 30)]
    assert {f.reason for f in skipped} == {"overlap"}
    end_all(store)
    clock.now = T0 + 40
    run(scheduler.tick())
    assert [k for k, _ in firer.started][-1] == slot_key(T0 + 40)


def test_buffer_one_runs_one_slot_after_the_running_one(store: SQLiteStore) -> None:
    row = add(store, overlap="buffer_one")
    firer, clock = FakeFirer(store), Clock(T0 + 10)
    scheduler = Scheduler(firer, clock=clock)
    run(scheduler.tick())
    clock.now = T0 + 40
    run(scheduler.tick())
    assert store.trigger_buffered(row.trigger_id) == [(slot_key(T0 + 20), T0 + 20)]
    assert len(firer.started) == 1
    end_all(store)
    clock.now = T0 + 41
    run(scheduler.tick())
    assert [k for k, _ in firer.started] == [slot_key(T0 + 10), slot_key(T0 + 20)]
    assert store.trigger_buffered(row.trigger_id) == []


def test_cancel_other_cancels_the_running_run_first(store: SQLiteStore) -> None:
    add(store, overlap="cancel_other")
    firer, clock = FakeFirer(store), Clock(T0 + 10)
    scheduler = Scheduler(firer, clock=clock)
    run(scheduler.tick())
    first = store.list_executions(limit=1)[0].execution_id
    clock.now = T0 + 20
    run(scheduler.tick())
    assert firer.cancelled == [first]
    assert [k for k, _ in firer.started] == [slot_key(T0 + 10), slot_key(T0 + 20)]


def test_catchup_runs_only_the_missed_slots_inside_the_window(store: SQLiteStore) -> None:
    row = add(store, overlap="allow", catchup="30s")
    firer = FakeFirer(store)
    # Down for 100 s: slots 10..100 are due; only those inside the last 30 s run.
    run(Scheduler(firer, clock=Clock(T0 + 100)).tick())
    started = {k for k, _ in firer.started}
    assert started == {slot_key(T0 + s) for s in (70, 80, 90, 100)}
    # The missed slots are one firing: the latest of them, with the count in its reason.
    (missed,) = store.firings(row.trigger_id, status="skipped", limit=100)
    assert missed.key == slot_key(T0 + 60) and missed.reason == "missed (6 slots)"


def test_a_paused_schedule_fires_nothing_and_resumes_from_then(store: SQLiteStore) -> None:
    add(store, overlap="allow")
    store.set_trigger_paused("schedule", "tick", True, now=T0 + 5)
    firer, clock = FakeFirer(store), Clock(T0 + 50)
    scheduler = Scheduler(firer, clock=clock)
    run(scheduler.tick())
    assert firer.started == []
    store.set_trigger_paused("schedule", "tick", False, now=T0 + 55)
    scheduler.changed()
    clock.now = T0 + 70
    run(scheduler.tick())
    assert [k for k, _ in firer.started] == [slot_key(T0 + 60), slot_key(T0 + 70)]


def test_trigger_fires_one_run_now_whatever_the_state(store: SQLiteStore) -> None:
    row = add(store, paused=True)
    firer = FakeFirer(store)
    execution_id = run(fire_now(firer, row, now=T0 + 3, key="manual-1"))
    assert store.get_execution(execution_id).trigger == {
        "kind": "schedule",
        "name": "tick",
        "slot": "manual-1",
    }


def test_backfill_runs_each_slot_once_and_a_repeat_starts_nothing(store: SQLiteStore) -> None:
    row = add(store, overlap="allow")
    firer = FakeFirer(store)
    result = run(run_backfill(firer, row, start=T0 + 10, end=T0 + 1000, now=T0 + 2000))
    assert len(result.started) == 100
    again = run(run_backfill(firer, row, start=T0 + 10, end=T0 + 1000, now=T0 + 2000))
    assert again.started == {} and len(again.already) == 100
    assert len(store.list_executions(limit=1000)) == 100
    with pytest.raises(TriggerError):
        run(run_backfill(firer, row, start=T0, end=T0 + 100_000, now=T0, limit=100))


def test_a_schedule_whose_playbook_is_gone_does_not_stop_the_others(
    store: SQLiteStore,
) -> None:
    add(store, "good", overlap="allow")
    spec = schedule_from_fields("bad", {"playbook": "tests/tick", "every": "10s"})
    define_schedule(store, spec, new_id=lambda: next(_ids), now=T0, local=True)
    # The catalog loses nothing, but the stored spec names a playbook that is not there.
    bad = store.get_trigger("schedule", "bad")
    store.put_trigger(
        "schedule", "bad", bad.spec | {"playbook": "tests/gone"}, trigger_id=0, now=T0
    )
    errors: list[str] = []
    firer = FakeFirer(store)
    scheduler = Scheduler(firer, clock=Clock(T0 + 10), on_error=lambda n, e: errors.append(n))
    run(scheduler.tick())
    assert [k for k, _ in firer.started] == [slot_key(T0 + 10)]
    assert errors == ["bad"]
