"""`Coordinator.execute_many`: a burst of trigger firings created in one transaction
(issue 30: a minute's thousand schedules). A firing that fired before, or twice in the
batch, starts nothing and writes nothing; the others are created with their first step
exactly as `execute` creates one run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowtide.engine import events as ev
from flowtide.errors import AlreadyFired
from flowtide.kv import connect
from flowtide.loopstate import LoopState
from flowtide.playbook.loader import parse_playbook
from flowtide.server.coordinator import Coordinator
from flowtide.store.postgres import PostgresStore
from flowtide.store.triggers import Firing
from flowtide.triggers.targets import TriggeredRun

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

# No tool: the step finishes on the server, so each run ends in its creating step.
DONE = """\
workload: {n: 0}
workflow:
  - step: start
    set:
      ctx.n: "{{ workload.n }}"
"""

# A tool: the run's first command is issued and waits for a worker.
WAITS = """\
workflow:
  - step: start
    tool: {kind: noop}
"""

TRIGGER = 7_000_001


def _firing(key: str) -> Firing:
    return Firing(trigger_id=TRIGGER, kind="schedule", name="burst", key=key, slot=1.0)


def test_a_burst_is_created_together_and_each_key_starts_one_run(pg_database: str) -> None:
    async def main() -> dict[str, Any]:
        kv = await connect("memory://", "flowtide_state", ttl=60)
        store = await asyncio.to_thread(PostgresStore, pg_database, max_size=4)
        try:
            coordinator = Coordinator(store, loopstate=LoopState(kv), local_kv=True)
            done, waits = parse_playbook(DONE, "done.yaml"), parse_playbook(WAITS, "waits.yaml")
            # "k0" fired before the burst.
            before = await coordinator.execute(done, workload={"n": -1}, firing=_firing("k0"))
            runs = [
                TriggeredRun(done, {"n": 1}, firing=_firing("k1")),
                TriggeredRun(done, {"n": 2}, firing=_firing("k0")),  # fired before
                TriggeredRun(waits, {}, firing=_firing("k2")),
                TriggeredRun(done, {"n": 3}, firing=_firing("k1")),  # twice in the batch
                TriggeredRun(done, {"n": 4}),  # no firing at all
            ]
            outcomes = await coordinator.execute_many(runs)
            again = await coordinator.execute_many([TriggeredRun(done, {}, firing=_firing("k2"))])
            rows = {r.execution_id: r for r in store.list_executions(limit=100)}
            events = {i: [e.type for e in store.events(i)] for i in outcomes if isinstance(i, int)}
            return {
                "before": before,
                "outcomes": outcomes,
                "again": again,
                "rows": rows,
                "events": events,
            }
        finally:
            store.close()
            await kv.close()

    got = asyncio.run(main())
    first, old, waiting, twice, plain = got["outcomes"]
    assert isinstance(first, int) and isinstance(waiting, int) and isinstance(plain, int)
    assert isinstance(old, AlreadyFired) and old.execution_id == got["before"]
    assert isinstance(twice, AlreadyFired) and twice.execution_id == first
    [already] = got["again"]
    assert isinstance(already, AlreadyFired) and already.execution_id == waiting
    rows = got["rows"]
    # Only the three new runs and the one before: nothing of the refused ones.
    assert set(rows) == {got["before"], first, waiting, plain}
    assert rows[first].status == "completed" and rows[plain].status == "completed"
    assert rows[first].trigger == {"kind": "schedule", "name": "burst", "slot": "k1"}
    assert rows[plain].trigger is None
    assert rows[waiting].status == "running"
    assert ev.COMMAND_ISSUED in got["events"][waiting]
    assert got["events"][first][-1] == ev.PLAYBOOK_COMPLETED
