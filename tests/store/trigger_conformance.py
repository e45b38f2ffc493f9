"""The triggers' part of the store conformance suite (`flowtide.store.triggers`): every
adapter keeps definitions, and records each firing at most once, in the transaction that
creates its execution."""

from __future__ import annotations

from typing import Any

import pytest

from flowtide.errors import AlreadyFired, NotFoundError, StoreError
from flowtide.store import Store
from flowtide.store.triggers import Firing

T0 = 1_700_000_000.0


def _start(store: Store, execution_id: int, firing: Firing) -> None:
    store.create_execution(
        execution_id,
        playbook_path="examples/hello",
        playbook_version=1,
        playbook_file=None,
        playbook_text="kind: Playbook\n",
        workload={},
        created=T0,
        firing=firing,
    )


def _slot(key: str, *, status: str = "started", watermark: float | None = None) -> Firing:
    return Firing(
        trigger_id=7,
        kind="schedule",
        name="nightly",
        key=key,
        slot=float(len(key)),
        status=status,
        watermark=watermark,
    )


class TriggerConformance:
    """Triggers: definitions, firings, planning state."""

    __test__ = False

    def test_a_trigger_is_stored_replaced_paused_and_deleted(self, store: Store) -> None:
        spec: dict[str, Any] = {"playbook": "examples/hello", "when": {"every": 60.0}}
        row = store.put_trigger("schedule", "nightly", spec, trigger_id=7, now=T0)
        assert (row.kind, row.name, row.trigger_id, row.spec) == ("schedule", "nightly", 7, spec)
        assert (row.paused, row.has_secret, row.created, row.resumed) == (False, False, T0, None)
        # Replacing keeps the id and creation time; the new id is ignored.
        spec2 = spec | {"overlap": "allow"}
        row2 = store.put_trigger("schedule", "nightly", spec2, trigger_id=99, now=T0 + 1)
        assert (row2.trigger_id, row2.created, row2.updated, row2.spec) == (7, T0, T0 + 1, spec2)
        paused = store.set_trigger_paused("schedule", "nightly", True, now=T0 + 2)
        assert paused.paused and paused.resumed is None
        resumed = store.set_trigger_paused("schedule", "nightly", False, now=T0 + 3)
        assert not resumed.paused and resumed.resumed == T0 + 3
        # Resuming one that runs changes nothing.
        assert store.set_trigger_paused("schedule", "nightly", False, now=T0 + 4).resumed == T0 + 3
        store.put_trigger("hook", "nightly", {}, trigger_id=8, now=T0, secret=b"sealed")
        assert [(r.kind, r.name) for r in store.list_triggers()] == [
            ("hook", "nightly"),
            ("schedule", "nightly"),
        ]
        assert [r.kind for r in store.list_triggers("hook")] == ["hook"]
        assert store.get_trigger("hook", "nightly").has_secret
        assert store.trigger_secret("hook", "nightly") == b"sealed"
        assert store.trigger_secret("schedule", "nightly") is None
        store.delete_trigger("schedule", "nightly")
        with pytest.raises(NotFoundError, match="no schedule named 'nightly'"):
            store.get_trigger("schedule", "nightly")
        with pytest.raises(NotFoundError):
            store.delete_trigger("schedule", "nightly")
        with pytest.raises(NotFoundError):
            store.set_trigger_paused("schedule", "nightly", True, now=T0)
        with pytest.raises(StoreError, match="unknown trigger kind"):
            store.put_trigger("cron", "x", {}, trigger_id=9, now=T0)

    def test_a_slot_starts_exactly_one_execution(self, store: Store) -> None:
        _start(store, 1, _slot("2026-03-29T01:00:00Z", watermark=100.0))
        with pytest.raises(AlreadyFired) as caught:
            _start(store, 2, _slot("2026-03-29T01:00:00Z"))
        assert caught.value.execution_id == 1
        # Nothing of the refused start was written.
        with pytest.raises(NotFoundError):
            store.get_execution(2)
        row = store.get_execution(1)
        assert row.trigger == {
            "kind": "schedule",
            "name": "nightly",
            "slot": "2026-03-29T01:00:00Z",
        }
        (firing,) = store.firings(7)
        assert (firing.key, firing.status, firing.execution_id) == (
            "2026-03-29T01:00:00Z",
            "started",
            1,
        )
        assert store.trigger_watermark(7) == 100.0
        assert store.trigger_running(7) == [1]
        assert firing.execution_status == "created"
        store.update_execution(1, status="completed", updated=T0 + 1)
        assert store.trigger_running(7) == []
        assert store.firings(7)[0].execution_status == "completed"

    def test_a_message_in_a_batch_never_starts_a_second_run(self, store: Store) -> None:
        def message(key: str, members: tuple[str, ...] = (), status: str = "started") -> Firing:
            return Firing(
                trigger_id=9,
                kind="subscription",
                name="orders",
                key=key,
                status=status,
                reason="bad playbook" if status == "failed" else None,
                members=members,
            )

        # A message refused before: the batch that starts it takes its record over.
        assert store.record_firings([message("S:3", status="failed")], now=T0) == 1
        _start(store, 1, message("S:1-3", ("S:1", "S:2", "S:3")))
        by_key = {f.key: f for f in store.firings(9)}
        assert {k: (f.status, f.execution_id) for k, f in by_key.items()} == {
            "S:1-3": ("started", 1),
            "S:1": ("batched", 1),
            "S:2": ("batched", 1),
            "S:3": ("batched", 1),
        }
        assert store.get_execution(1).trigger == {
            "kind": "subscription",
            "name": "orders",
            "message": "S:1-3",
        }
        # A batch cut otherwise after a redelivery: refused whole, naming the message.
        with pytest.raises(AlreadyFired) as caught:
            _start(store, 2, message("S:2-4", ("S:2", "S:3", "S:4")))
        assert (caught.value.key, caught.value.execution_id) == ("S:2", 1)
        with pytest.raises(NotFoundError):
            store.get_execution(2)
        assert store.firing(9, "S:4") is None
        # Alone, a message of a batch starts nothing either.
        with pytest.raises(AlreadyFired):
            _start(store, 3, message("S:1"))
        _start(store, 4, message("S:4"))
        assert store.trigger_running(9) == [1, 4]

    def test_skipped_and_buffered_slots_and_a_buffered_one_starting(self, store: Store) -> None:
        assert store.trigger_watermark(7) is None
        written = store.record_firings(
            [_slot("a", status="skipped"), _slot("bb", status="buffered", watermark=5.0)],
            now=T0,
        )
        assert written == 2
        # Recording them again writes nothing and keeps the watermark (never back).
        assert store.record_firings([_slot("a", status="skipped", watermark=1.0)], now=T0) == 0
        assert store.trigger_watermark(7) == 5.0
        assert store.trigger_buffered(7) == [("bb", 2.0)]
        _start(store, 3, _slot("bb"))
        assert store.trigger_buffered(7) == []
        started = store.firing(7, "bb")
        assert started is not None and (started.status, started.execution_id) == ("started", 3)
        assert [f.key for f in store.firings(7, status="skipped")] == ["a"]
        # A skipped slot may still run (a backfill), once.
        _start(store, 4, _slot("a"))
        assert store.firings(7, status="skipped") == []
        with pytest.raises(AlreadyFired) as caught:
            _start(store, 5, _slot("a"))
        assert caught.value.execution_id == 4
        store.move_watermark(7, 3.0, now=T0)
        assert store.trigger_watermark(7) == 5.0
        store.move_watermark(7, 9.0, now=T0)
        assert store.trigger_watermark(7) == 9.0

    def test_executions_are_listed_by_trigger(self, store: Store) -> None:
        _start(store, 5, _slot("x"))
        store.create_execution(
            6,
            playbook_path=None,
            playbook_version=None,
            playbook_file="a.yaml",
            playbook_text="kind: Playbook\n",
            workload={},
            created=T0,
        )
        hook = Firing(trigger_id=8, kind="hook", name="gh", key="d-1")
        _start(store, 7, hook)
        assert [r.execution_id for r in store.list_executions(trigger="schedule")] == [5]
        assert [r.execution_id for r in store.list_executions(trigger="schedule:nightly")] == [5]
        assert store.list_executions(trigger="schedule:other") == []
        assert [r.execution_id for r in store.list_executions(trigger="hook")] == [7]
        assert store.get_execution(7).trigger == {"kind": "hook", "name": "gh", "delivery": "d-1"}
        assert store.get_execution(6).trigger is None
