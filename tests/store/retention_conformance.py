"""Retention (`RetentionStore`), on every adapter: which ended executions may go, and
that they go with their rows and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from flowtide.engine.events import Event
from flowtide.errors import StoreError
from flowtide.store import Store

T0 = 1_700_000_000.0


def _run(store: Store, execution_id: int, status: str, updated: float, **fields: Any) -> None:
    store.create_execution(
        execution_id,
        playbook_path="tests/gc",
        playbook_version=None,
        playbook_file=None,
        playbook_text="workflow: []\n",
        workload={},
        created=T0,
        **fields,
    )
    store.append(
        [
            Event(
                event_id=execution_id * 10 + i,
                execution_id=execution_id,
                type="step.enter",
                step="s",
                time=T0,
            )
            for i in range(3)
        ]
    )
    store.update_execution(execution_id, status=status, updated=updated)


class RetentionConformance:
    def test_collectable_is_ended_old_and_without_open_children(self, store: Store) -> None:
        _run(store, 11, "completed", T0)
        _run(store, 12, "failed", T0 + 1)
        _run(store, 13, "running", T0)
        _run(store, 14, "completed", T0)
        _run(store, 15, "running", T0, parent_execution_id=14)
        _run(store, 16, "completed", T0 + 500)
        ended = ("cancelled", "completed", "failed")
        assert store.collectable(before=T0 + 100, statuses=ended) == [11, 12]
        assert store.collectable(before=T0 + 100, statuses=["failed"]) == [12]
        assert store.collectable(before=T0 + 100, statuses=ended, limit=1) == [11]
        with pytest.raises(StoreError):
            store.collectable(before=T0 + 100, statuses=["running"])

    def test_collect_removes_the_runs_and_their_rows_and_dry_runs_remove_nothing(
        self, store: Store
    ) -> None:
        _run(store, 21, "completed", T0)
        _run(store, 22, "completed", T0)
        dry = store.collect([21], dry_run=True)
        assert dry.executions == 1 and dry.rows["event"] == 3
        assert len(store.events(21)) == 3
        done = store.collect([21])
        assert done.executions == 1 and done.rows["event"] == 3
        assert store.events(21) == [] and len(store.events(22)) == 3
        assert [r.execution_id for r in store.list_executions(limit=10)] == [22]
        store.reclaim()
