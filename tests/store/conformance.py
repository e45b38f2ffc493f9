"""Conformance suite of the store port: every adapter passes it unchanged.

An adapter's test module subclasses `StoreConformance`, sets `__test__ = True` and overrides
the `store_factory` fixture: a callable that opens a store on the test's own fresh backing
storage, the same storage on every call (that is how reopening is tested). The fixture
closes whatever it opened when the test ends. It also overrides `raw`: a callable running
one SQL query on that storage behind the port's back (what is really at rest).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet

from flowtide.credentials import MASTER_KEY_ENV
from flowtide.engine.events import Command, Event
from flowtide.errors import NotFoundError, StoreError
from flowtide.sealing import SEALED_PREFIX
from flowtide.store import (
    EXECUTION_CREATED,
    CommandUpdate,
    ExecutionRow,
    ExecutionUpdate,
    Store,
)

from .retention_conformance import RetentionConformance
from .trigger_conformance import TriggerConformance

StoreFactory = Callable[[], Store]
RawQuery = Callable[[str], list[tuple[Any, ...]]]

T0 = 1_700_000_000.0


def make_execution(store: Store, execution_id: int, **overrides: Any) -> None:
    fields: dict[str, Any] = {
        "playbook_path": "examples/hello",
        "playbook_version": 1,
        "playbook_file": None,
        "playbook_text": "apiVersion: noetl.io/v2\nkind: Playbook\n",
        "workload": {"n": 1},
        "created": T0,
    }
    fields.update(overrides)
    store.create_execution(execution_id, **fields)


def event(execution_id: int, event_id: int, type_: str = "step.enter", **fields: Any) -> Event:
    return Event(event_id=event_id, execution_id=execution_id, type=type_, **fields)


def command(
    command_id: int, execution_id: int = 1, status: str = "issued", **fields: Any
) -> CommandUpdate:
    fields.setdefault("step", "load")
    fields.setdefault("time", T0)
    return CommandUpdate(command_id=command_id, execution_id=execution_id, status=status, **fields)


class StoreConformance(TriggerConformance, RetentionConformance):
    """Behaviour every `Store` adapter must show."""

    __test__ = False

    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        """Override: return a callable opening a store on this test's fresh storage."""
        raise NotImplementedError("adapter test modules override the store_factory fixture")

    @pytest.fixture
    def raw(self) -> RawQuery:
        """Override: return a callable running one SQL query on this test's storage."""
        raise NotImplementedError("adapter test modules override the raw fixture")

    @pytest.fixture(autouse=True)
    def master_key(self, monkeypatch: pytest.MonkeyPatch) -> str:
        """A fresh master key per test, for what the store seals."""
        key = Fernet.generate_key().decode()
        monkeypatch.setenv(MASTER_KEY_ENV, key)
        return key

    @pytest.fixture
    def store(self, store_factory: StoreFactory) -> Iterator[Store]:
        store = store_factory()
        yield store
        store.close()

    # -- the port --------------------------------------------------------------------

    def test_implements_the_protocol(self, store: Store) -> None:
        assert isinstance(store, Store)

    # -- executions ------------------------------------------------------------------

    def test_create_and_get_execution(self, store: Store) -> None:
        store.create_execution(
            101,
            playbook_path="a/b",
            playbook_version=3,
            playbook_file="/tmp/b.yaml",
            playbook_text="text: é ✓",
            workload={"items": [1, 2, {"k": "v"}], "name": "ünï"},
            parent_execution_id=7,
            parent_command_id=8,
            created=T0,
        )
        row = store.get_execution(101)
        assert row == ExecutionRow(
            execution_id=101,
            parent_execution_id=7,
            parent_command_id=8,
            playbook_path="a/b",
            playbook_version=3,
            playbook_file="/tmp/b.yaml",
            playbook_text="text: é ✓",
            workload={"items": [1, 2, {"k": "v"}], "name": "ünï"},
            status=EXECUTION_CREATED,
            result=None,
            error=None,
            created=T0,
            updated=T0,
        )

    def test_create_execution_defaults_and_nulls(self, store: Store) -> None:
        make_execution(store, 5, playbook_path=None, playbook_version=None, playbook_file="x.yaml")
        row = store.get_execution(5)
        assert row.parent_execution_id is None and row.parent_command_id is None
        assert row.playbook_path is None and row.playbook_version is None
        assert row.playbook_file == "x.yaml"

    def test_snowflake_sized_ids_round_trip(self, store: Store) -> None:
        big = (1 << 62) + 12345
        make_execution(store, big, parent_execution_id=big - 1)
        store.append([event(big, big + 1, command_id=big + 2, parent_event_id=big + 3)])
        assert store.get_execution(big).parent_execution_id == big - 1
        (ev,) = store.events(big)
        assert (ev.event_id, ev.command_id, ev.parent_event_id) == (big + 1, big + 2, big + 3)

    def test_duplicate_execution_is_an_error(self, store: Store) -> None:
        make_execution(store, 1)
        with pytest.raises(StoreError, match="1"):
            make_execution(store, 1, workload={"other": True})
        assert store.get_execution(1).workload == {"n": 1}

    def test_get_missing_execution(self, store: Store) -> None:
        with pytest.raises(NotFoundError, match="424242"):
            store.get_execution(424242)

    def test_update_execution(self, store: Store) -> None:
        make_execution(store, 1)
        store.update_execution(1, status="running", updated=T0 + 1)
        row = store.get_execution(1)
        assert (row.status, row.result, row.error, row.updated) == ("running", None, None, T0 + 1)
        assert row.created == T0

        store.update_execution(1, status="completed", result={"rows": [1, 2]}, updated=T0 + 2)
        row = store.get_execution(1)
        assert (row.status, row.result, row.updated) == ("completed", {"rows": [1, 2]}, T0 + 2)

        # UNSET keeps what is stored.
        store.update_execution(1, status="failed", error={"kind": "x"}, updated=T0 + 3)
        row = store.get_execution(1)
        assert (row.result, row.error) == ({"rows": [1, 2]}, {"kind": "x"})

        # None clears the error; result=None stores None.
        store.update_execution(1, status="completed", result=None, error=None, updated=T0 + 4)
        row = store.get_execution(1)
        assert (row.status, row.result, row.error) == ("completed", None, None)

    @pytest.mark.parametrize("result", [0, "done", [1, "two", None], 1.5, True, {"a": {"b": []}}])
    def test_execution_result_any_json(self, store: Store, result: Any) -> None:
        make_execution(store, 1)
        store.update_execution(1, status="completed", result=result, updated=T0)
        assert store.get_execution(1).result == result

    def test_update_missing_execution(self, store: Store) -> None:
        with pytest.raises(NotFoundError, match="99"):
            store.update_execution(99, status="running", updated=T0)

    def test_unserialisable_values_are_store_errors(self, store: Store) -> None:
        with pytest.raises(StoreError):
            make_execution(store, 1, workload={"x": object()})
        with pytest.raises(NotFoundError):
            store.get_execution(1)
        make_execution(store, 2)
        with pytest.raises(StoreError):
            store.update_execution(2, status="completed", result={1, 2}, updated=T0)
        assert store.get_execution(2).status == EXECUTION_CREATED

    def test_list_executions(self, store: Store) -> None:
        assert store.list_executions() == []
        for eid in (30, 10, 50, 20, 40):
            make_execution(store, eid, created=T0 + eid)
        store.update_execution(20, status="running", updated=T0)
        store.update_execution(40, status="running", updated=T0)

        assert [r.execution_id for r in store.list_executions()] == [50, 40, 30, 20, 10]
        assert [r.execution_id for r in store.list_executions(limit=2)] == [50, 40]
        assert [r.execution_id for r in store.list_executions(before_id=40)] == [30, 20, 10]
        assert [r.execution_id for r in store.list_executions(before_id=40, limit=1)] == [30]
        assert [r.execution_id for r in store.list_executions(status="running")] == [40, 20]
        running_page = store.list_executions(status="running", before_id=40)
        assert [r.execution_id for r in running_page] == [20]
        assert store.list_executions(status="nope") == []
        assert store.list_executions(limit=0) == []
        assert store.list_executions()[0] == store.get_execution(50)

    def test_list_executions_filtered(self, store: Store) -> None:
        make_execution(store, 1, playbook_path="etl/daily_load", created=T0)
        make_execution(
            store, 2, playbook_path=None, playbook_file="/x/Daily_Report.yaml", created=T0 + 10
        )
        make_execution(
            store, 3, playbook_path="etl/50%_off", parent_execution_id=1, created=T0 + 20
        )
        make_execution(store, 4, playbook_path="other", parent_execution_id=1, created=T0 + 30)
        store.update_execution(1, status="completed", updated=T0 + 100)  # lasted 100 s
        store.update_execution(2, status="failed", updated=T0 + 11)  # 1 s
        store.update_execution(3, status="running", updated=T0 + 21)  # running: to `now`

        def ids(**kw: Any) -> list[int]:
            return [r.execution_id for r in store.list_executions(**kw)]

        assert ids(playbook="DAILY") == [2, 1]  # path or file, any case
        assert ids(playbook="50%") == [3]  # the text's own % is not a wildcard
        assert ids(playbook="_off") == [3]
        assert ids(playbook="daily", status="failed") == [2]
        assert ids(playbook="nothing") == []
        assert ids(parent_id=1) == [4, 3]
        assert ids(parent_id=1, before_id=4) == [3]
        assert ids(created_since=T0 + 10) == [4, 3, 2]
        assert ids(created_until=T0 + 20) == [2, 1]
        assert ids(created_since=T0 + 10, created_until=T0 + 30) == [3, 2]
        now = T0 + 1000
        assert ids(min_seconds=50, now=now) == [4, 3, 1]  # 4 and 3 run still: ~970-980 s
        assert ids(min_seconds=50, max_seconds=500, now=now) == [1]
        assert ids(max_seconds=5, now=now) == [2]

    def test_a_summary_is_kept_replaced_and_read_back(self, store: Store) -> None:
        make_execution(store, 1)
        assert store.get_summary(1) is None
        store.put_summary(1, {"status": "running", "steps": {"a": {"runs": 1}}}, format=1)
        store.put_summary(1, {"status": "completed", "note": "ü ✓"}, format=2)
        assert store.get_summary(1) == (2, {"status": "completed", "note": "ü ✓"})
        assert store.get_summary(2) is None
        with pytest.raises(StoreError):
            store.put_summary(1, {"bad": {1, 2}}, format=1)  # not JSON
        assert store.get_summary(1) == (2, {"status": "completed", "note": "ü ✓"})

    def test_list_executions_default_limit_is_50(self, store: Store) -> None:
        for eid in range(1, 61):
            make_execution(store, eid)
        rows = store.list_executions()
        assert [r.execution_id for r in rows] == list(range(60, 10, -1))

    def test_negative_limits_are_refused(self, store: Store) -> None:
        with pytest.raises(StoreError):
            store.list_executions(limit=-1)
        with pytest.raises(StoreError):
            store.events(1, limit=-1)

    # -- events ----------------------------------------------------------------------

    def test_append_and_read_events(self, store: Store) -> None:
        full = Event(
            event_id=11,
            execution_id=1,
            type="call.error",
            step="load",
            status="error",
            payload={"input": {"id": 3}, "text": "ünï ✓", "n": 1.25},
            error={"kind": "timeout", "retryable": True},
            parent_event_id=10,
            command_id=77,
            worker_id="w-1",
            time=T0 + 0.5,
        )
        bare = Event(event_id=12, execution_id=1, type="step.exit")
        store.append([full, bare])
        assert store.events(1) == [full, bare]

    def test_events_are_in_event_id_order(self, store: Store) -> None:
        store.append([event(1, 30), event(1, 10)])
        store.append([event(1, 20), event(1, 5)])
        assert [e.event_id for e in store.events(1)] == [5, 10, 20, 30]

    def test_events_are_per_execution(self, store: Store) -> None:
        store.append([event(1, 1), event(2, 2), event(1, 3), event(2, 4)])
        assert [e.event_id for e in store.events(1)] == [1, 3]
        assert [e.event_id for e in store.events(2)] == [2, 4]
        assert store.count_events(1) == 2
        assert store.events(3) == []
        assert store.count_events(3) == 0

    def test_events_after_and_limit(self, store: Store) -> None:
        store.append([event(1, i) for i in range(1, 11)])
        assert [e.event_id for e in store.events(1, after_event_id=7)] == [8, 9, 10]
        assert [e.event_id for e in store.events(1, limit=3)] == [1, 2, 3]
        assert [e.event_id for e in store.events(1, after_event_id=4, limit=2)] == [5, 6]
        assert store.events(1, after_event_id=10) == []
        assert store.events(1, limit=0) == []
        assert len(store.events(1, after_event_id=0)) == 10

    def test_newest_events(self, store: Store) -> None:
        kinds = ["call.done", "loop.item"]
        store.append([event(1, i, kinds[i % 2], step="s") for i in range(1, 11)])
        got = store.events(1, types={"call.done"}, limit=2, newest=True)
        assert [e.event_id for e in got] == [8, 10]  # the newest two, oldest first
        assert [e.event_id for e in store.events(1, limit=3, newest=True)] == [8, 9, 10]
        assert len(store.events(1, newest=True)) == 10  # no limit: the whole log
        assert [e.event_id for e in store.events(1, after_event_id=8, limit=5, newest=True)] == [
            9,
            10,
        ]
        # Paging back from the newest: the page before the oldest one seen.
        back = store.events(1, before_event_id=8, limit=3, newest=True)
        assert [e.event_id for e in back] == [5, 6, 7]
        assert [e.event_id for e in store.events(1, before_event_id=3)] == [1, 2]
        got = store.events(1, types={"call.done"}, before_event_id=8, limit=2, newest=True)
        assert [e.event_id for e in got] == [4, 6]

    def test_events_of_some_types(self, store: Store) -> None:
        kinds = ["step.enter", "command.started", "command.completed", "loop.item"]
        store.append([event(1, i, kinds[i % 4]) for i in range(1, 13)])
        wanted = {"command.completed", "step.enter"}
        got = store.events(1, types=wanted)
        assert [e.event_id for e in got] == [2, 4, 6, 8, 10, 12]
        assert {e.type for e in got} == wanted
        assert [e.event_id for e in store.events(1, types=wanted, after_event_id=8)] == [10, 12]
        assert store.events(1, types=()) == []

    def test_events_of_some_steps_and_their_times(self, store: Store) -> None:
        store.append(
            [
                event(1, 1, "command.issued", step="a", time=T0),
                event(1, 2, "command.issued", step="b", time=T0 + 1),
                event(1, 3, "command.completed", step="b", status="ok", time=T0 + 2),
                event(1, 4, "command.completed", step="a", status="error", time=T0 + 3),
                event(2, 5, "command.completed", step="a", time=T0 + 9),
            ]
        )
        got = store.events(1, types={"command.completed"}, steps={"a"})
        assert [e.event_id for e in got] == [4]
        assert [e.event_id for e in store.events(1, steps={"a", "b"})] == [1, 2, 3, 4]
        times = store.event_times(1, types={"command.completed"})
        assert times == [
            ("b", "command.completed", "ok", T0 + 2),
            ("a", "command.completed", "error", T0 + 3),
        ]
        assert store.event_times(1, types={"command.issued"}, steps={"b"}) == [
            ("b", "command.issued", None, T0 + 1)
        ]
        assert store.event_span(1) == (T0, T0 + 3)
        assert store.event_span(3) is None

    def test_empty_append_is_a_no_op(self, store: Store) -> None:
        store.append([])
        store.append((), commands=(), execution_updates=())
        assert store.count_events(1) == 0

    def test_append_writes_commands_and_execution_updates(self, store: Store) -> None:
        make_execution(store, 1)
        store.append(
            [event(1, 1, "command.issued", command_id=500)],
            commands=[command(500, time=T0 + 1)],
            execution_updates=[ExecutionUpdate(execution_id=1, status="running", updated=T0 + 1)],
        )
        assert store.count_events(1) == 1
        assert store.get_command(500).status == "issued"
        row = store.get_execution(1)
        assert (row.status, row.updated) == ("running", T0 + 1)

    def test_execution_update_in_batch_result_and_error(self, store: Store) -> None:
        make_execution(store, 1)
        store.append(
            [event(1, 1, "playbook.failed")],
            execution_updates=[
                ExecutionUpdate(1, "failed", T0 + 1, result={"partial": 1}, error={"kind": "x"})
            ],
        )
        row = store.get_execution(1)
        assert (row.status, row.result, row.error) == ("failed", {"partial": 1}, {"kind": "x"})
        store.append([], execution_updates=[ExecutionUpdate(1, "completed", T0 + 2, error=None)])
        row = store.get_execution(1)
        assert (row.status, row.result, row.error) == ("completed", {"partial": 1}, None)

    def test_duplicate_event_in_batch_fails_whole_batch(self, store: Store) -> None:
        make_execution(store, 1)
        store.append([event(1, 1)])
        with pytest.raises(StoreError):
            store.append(
                [event(1, 2), event(1, 3), event(1, 2)],
                commands=[command(900)],
                execution_updates=[ExecutionUpdate(1, "running", T0 + 1)],
            )
        assert [e.event_id for e in store.events(1)] == [1]
        with pytest.raises(NotFoundError):
            store.get_command(900)
        assert store.get_execution(1).status == EXECUTION_CREATED
        # The store stays usable after the failed batch.
        store.append([event(1, 2), event(1, 3)])
        assert store.count_events(1) == 3

    def test_event_already_stored_fails_whole_batch(self, store: Store) -> None:
        store.append([event(1, 1)])
        with pytest.raises(StoreError):
            store.append([event(1, 2), event(1, 1, "step.exit")])
        assert [(e.event_id, e.type) for e in store.events(1)] == [(1, "step.enter")]

    def test_missing_execution_in_batch_fails_whole_batch(self, store: Store) -> None:
        with pytest.raises(NotFoundError, match="31"):
            store.append([event(31, 1)], execution_updates=[ExecutionUpdate(31, "running", T0)])
        assert store.count_events(31) == 0

    def test_unserialisable_payload_fails_whole_batch(self, store: Store) -> None:
        with pytest.raises(StoreError, match="event 2"):
            store.append([event(1, 1), event(1, 2, payload={"x": object()})])
        with pytest.raises(StoreError):
            store.append([event(1, 3)], commands=[command(1, payload={"x": {1, 2}})])
        assert store.count_events(1) == 0

    def test_unknown_command_status_fails_whole_batch(self, store: Store) -> None:
        with pytest.raises(StoreError, match="bogus"):
            store.append([event(1, 1)], commands=[command(1), command(2, status="bogus")])
        assert store.count_events(1) == 0
        with pytest.raises(NotFoundError):
            store.get_command(1)

    def test_large_batch(self, store: Store) -> None:
        store.append([event(1, i, payload={"i": i}) for i in range(5000)])
        assert store.count_events(1) == 5000
        assert store.events(1, after_event_id=4997)[0].payload == {"i": 4998}

    # -- commands --------------------------------------------------------------------

    def test_command_insert(self, store: Store) -> None:
        store.append(
            [],
            commands=[
                command(
                    7,
                    execution_id=3,
                    step="fetch",
                    attempt=2,
                    loop_instance=4,
                    loop_index=5,
                    worker_id="w",
                    payload={"extra": {"a": 1}},
                    time=T0 + 9,
                )
            ],
        )
        row = store.get_command(7)
        assert (row.command_id, row.execution_id, row.step, row.status) == (7, 3, "fetch", "issued")
        assert (row.attempt, row.loop_instance, row.loop_index) == (2, 4, 5)
        assert (row.worker_id, row.payload) == ("w", {"extra": {"a": 1}})
        assert (row.created, row.updated) == (T0 + 9, T0 + 9)

    def test_command_insert_defaults(self, store: Store) -> None:
        store.append([], commands=[command(8)])
        row = store.get_command(8)
        assert (row.attempt, row.loop_instance, row.loop_index) == (1, None, None)
        assert (row.worker_id, row.payload) == (None, None)

    def test_command_upsert_updates_status_and_keeps_identity(self, store: Store) -> None:
        store.append(
            [],
            commands=[command(1, attempt=1, loop_instance=2, loop_index=3, payload={"p": 1})],
        )
        store.append(
            [],
            commands=[command(1, status="claimed", worker_id="w-1", time=T0 + 1, step="ignored")],
        )
        row = store.get_command(1)
        assert (row.status, row.worker_id, row.attempt) == ("claimed", "w-1", 1)
        assert (row.step, row.loop_instance, row.loop_index) == ("load", 2, 3)
        assert (row.payload, row.created, row.updated) == ({"p": 1}, T0, T0 + 1)

        # A status-only update keeps the worker, attempt and payload.
        store.append([], commands=[command(1, status="completed", time=T0 + 2)])
        row = store.get_command(1)
        assert (row.status, row.worker_id, row.attempt, row.payload) == (
            "completed",
            "w-1",
            1,
            {"p": 1},
        )

    def test_command_reissue_clears_worker_and_bumps_attempt(self, store: Store) -> None:
        store.append([], commands=[command(1), command(1, status="claimed", worker_id="w-1")])
        store.append([], commands=[command(1, attempt=2, time=T0 + 5, payload={"p": 2})])
        row = store.get_command(1)
        assert (row.status, row.worker_id, row.attempt, row.payload) == (
            "issued",
            None,
            2,
            {"p": 2},
        )

    def test_command_updates_in_one_batch_apply_in_order(self, store: Store) -> None:
        store.append(
            [],
            commands=[
                command(1),
                command(1, status="claimed", worker_id="w", time=T0 + 1),
                command(1, status="completed", time=T0 + 2),
            ],
        )
        row = store.get_command(1)
        assert (row.status, row.worker_id, row.created, row.updated) == (
            "completed",
            "w",
            T0,
            T0 + 2,
        )

    def test_many_commands_in_one_batch(self, store: Store) -> None:
        # A batch of distinct commands (the server's steps): new ones, status-only
        # updates that keep attempt/worker/payload, and a re-issue with a new attempt,
        # each as if written alone.
        store.append(
            [],
            commands=[
                command(1, attempt=1, payload={"p": 1}),
                command(2, attempt=3, loop_instance=1, loop_index=0),
                command(3),
            ],
        )
        store.append([], commands=[command(2, status="claimed", worker_id="w-2", time=T0 + 1)])
        store.append(
            [],
            commands=[
                command(1, status="completed", worker_id="w-1", time=T0 + 2),
                command(2, status="completed", time=T0 + 2),
                command(3, attempt=2, time=T0 + 2, payload={"p": 3}),
                command(4, loop_index=7, time=T0 + 2),
            ],
        )
        rows = {c: store.get_command(c) for c in (1, 2, 3, 4)}
        got = {
            c: (r.status, r.attempt, r.worker_id, r.payload, r.loop_index, r.created, r.updated)
            for c, r in rows.items()
        }
        assert got == {
            1: ("completed", 1, "w-1", {"p": 1}, None, T0, T0 + 2),
            2: ("completed", 3, "w-2", None, 0, T0, T0 + 2),
            3: ("issued", 2, None, {"p": 3}, None, T0, T0 + 2),
            4: ("issued", 1, None, None, 7, T0 + 2, T0 + 2),
        }

    def test_pending_commands(self, store: Store) -> None:
        store.append(
            [],
            commands=[
                command(40, status="claimed", worker_id="w"),
                command(10),
                command(30, status="completed"),
                command(20),
                command(50, status="failed"),
                command(60, status="cancelled"),
                command(15, execution_id=2),
            ],
        )
        assert [c.command_id for c in store.pending_commands(1)] == [10, 20, 40]
        assert [c.command_id for c in store.pending_commands(2)] == [15]
        assert store.pending_commands(3) == []
        store.append([], commands=[command(10, status="completed")])
        assert [c.command_id for c in store.pending_commands(1)] == [20, 40]
        assert store.pending_commands(1)[1] == store.get_command(40)

    def test_get_missing_command(self, store: Store) -> None:
        with pytest.raises(NotFoundError, match="12345"):
            store.get_command(12345)

    def test_command_round_trips_through_engine_command(self, store: Store) -> None:
        cmd = Command(
            command_id=9,
            execution_id=1,
            step="load",
            attempt=3,
            loop_instance=1,
            loop_index=17,
            issued_event_id=44,
            extra={"reason": "retry"},
        )
        store.append([], commands=[CommandUpdate.from_command(cmd, time=T0)])
        assert store.get_command(9).to_command() == cmd

    # -- catalog ---------------------------------------------------------------------

    def test_register_playbook_versions(self, store: Store) -> None:
        assert store.register_playbook("a/b", "v1", source_file="b.yaml", created=T0) == 1
        assert store.register_playbook("a/b", "v2", source_file=None, created=T0 + 1) == 2
        # Identical to the latest: no new version.
        assert store.register_playbook("a/b", "v2", source_file="x", created=T0 + 2) == 2
        # Identical to an older one: it becomes the latest again.
        assert store.register_playbook("a/b", "v1", source_file=None, created=T0 + 3) == 3
        assert store.register_playbook("other", "v1", source_file=None, created=T0) == 1

        row = store.get_playbook("a/b")
        assert (row.path, row.version, row.text, row.versions) == ("a/b", 3, "v1", 3)
        row = store.get_playbook("a/b", 1)
        assert (row.version, row.text, row.source_file, row.created) == (1, "v1", "b.yaml", T0)
        row = store.get_playbook("a/b", 2)
        assert (row.text, row.source_file, row.created) == ("v2", None, T0 + 1)

    def test_register_playbook_explicit_version(self, store: Store) -> None:
        assert store.register_playbook("p", "five", source_file=None, created=T0, version=5) == 5
        assert store.register_playbook("p", "six", source_file=None, created=T0) == 6
        assert store.register_playbook("p", "two", source_file=None, created=T0, version=2) == 2
        assert store.get_playbook("p").version == 6
        # The same text at the same version again is a no-op; other text is refused.
        assert store.register_playbook("p", "five", source_file=None, created=T0, version=5) == 5
        with pytest.raises(StoreError, match="p"):
            store.register_playbook("p", "changed", source_file=None, created=T0, version=5)
        with pytest.raises(StoreError):
            store.register_playbook("p", "zero", source_file=None, created=T0, version=0)
        assert store.get_playbook("p", 5).text == "five"
        assert store.get_playbook("p").versions == 3

    def test_get_missing_playbook(self, store: Store) -> None:
        with pytest.raises(NotFoundError, match="no/such/path"):
            store.get_playbook("no/such/path")
        store.register_playbook("there", "t", source_file=None, created=T0)
        with pytest.raises(NotFoundError, match="there"):
            store.get_playbook("there", 2)

    def test_list_playbooks(self, store: Store) -> None:
        assert store.list_playbooks() == []
        store.register_playbook("zeta", "z1", source_file=None, created=T0)
        store.register_playbook("alpha", "a1", source_file=None, created=T0)
        store.register_playbook("alpha", "a2", source_file="a.yaml", created=T0 + 1)
        store.register_playbook("alpha", "a3", source_file=None, created=T0 + 2)
        rows = store.list_playbooks()
        assert [(r.path, r.version, r.text, r.versions) for r in rows] == [
            ("alpha", 3, "a3", 3),
            ("zeta", 1, "z1", 1),
        ]
        assert rows[0] == store.get_playbook("alpha")

    # -- credentials -----------------------------------------------------------------

    def test_credentials(self, store: Store) -> None:
        secret = bytes(range(256)) + b"\x00tail"
        store.put_credential("pg", "postgres", secret, updated=T0)
        assert store.get_credential("pg") == ("postgres", secret)

        store.put_credential("pg", "postgres_dsn", b"new", updated=T0 + 5)
        store.put_credential("api", "http_bearer", b"tok", updated=T0 + 1)
        assert store.get_credential("pg") == ("postgres_dsn", b"new")
        listed = store.list_credentials()
        assert listed == [
            {"name": "api", "kind": "http_bearer", "created": T0 + 1, "updated": T0 + 1},
            {"name": "pg", "kind": "postgres_dsn", "created": T0, "updated": T0 + 5},
        ]
        assert all("ciphertext" not in c for c in listed)

        store.delete_credential("pg")
        with pytest.raises(NotFoundError, match="pg"):
            store.get_credential("pg")
        assert [c["name"] for c in store.list_credentials()] == ["api"]

    def test_missing_credential(self, store: Store) -> None:
        with pytest.raises(NotFoundError, match="nope"):
            store.get_credential("nope")
        with pytest.raises(NotFoundError, match="nope"):
            store.delete_credential("nope")
        assert store.list_credentials() == []

    # -- sealing ---------------------------------------------------------------------

    def test_what_holds_a_secret_is_sealed_at_rest_and_read_back_intact(
        self, store: Store, raw: RawQuery
    ) -> None:
        secret = "Xq7-pa55-w0rd-9f2c"
        make_execution(store, 1)
        added = event(1, 1, "secrets.added", payload={"values": [secret]})
        holds = event(
            1, 2, "call.done", payload={"rows": [{"dsn": f"postgresql://a:{secret}@h/d"}]}
        )
        clean = event(1, 3, "step.enter", payload={"step": "load"})
        failed = event(1, 4, "call.error", error={"kind": "auth", "message": f"bad: {secret}"})
        # Plain columns around the sealed ones (read back in one parse of many).
        plain = event(1, 5, "call.error", payload={"attempt": 2}, error={"kind": "x"})
        bare = event(1, 6, "step.exit")
        store.append(
            [added, holds, clean, failed, plain, bare],
            execution_updates=[
                ExecutionUpdate(1, "failed", T0 + 1, result={"echo": secret}, error={"m": secret})
            ],
            secrets={1: {secret}},
        )
        # The port gives back exactly what was written ...
        assert store.events(1) == [added, holds, clean, failed, plain, bare]
        row = store.get_execution(1)
        assert (row.result, row.error) == ({"echo": secret}, {"m": secret})
        # ... while the rows hold it only sealed.
        rows = raw("SELECT event_id, payload, error FROM event WHERE execution_id = 1")
        assert secret not in repr(rows)
        sealed = {r[0] for r in rows if str(r[1] or r[2]).startswith(SEALED_PREFIX)}
        assert sealed == {1, 2, 4}
        result, error = raw("SELECT result, error FROM execution WHERE execution_id = 1")[0]
        assert result.startswith(SEALED_PREFIX) and error.startswith(SEALED_PREFIX)
        assert secret not in result + error

    def test_secrets_added_is_always_sealed(self, store: Store, raw: RawQuery) -> None:
        store.append([event(1, 1, "secrets.added", payload={"values": ["tok-123456789"]})])
        assert store.events(1)[0].payload == {"values": ["tok-123456789"]}
        assert "tok-123456789" not in repr(raw("SELECT payload FROM event"))

    def test_a_secret_inside_a_longer_word_changes_nothing_read_back(
        self, store: Store, raw: RawQuery
    ) -> None:
        make_execution(store, 1)
        data = {"rows": [{"data_type": "demographics"}, {"data_type": "conditions"}]}
        store.append(
            [event(1, 1, "command.completed", payload={"result": data})],
            execution_updates=[ExecutionUpdate(1, "completed", T0, result=data)],
            secrets={1: {"demo"}},
        )
        assert store.events(1)[0].payload == {"result": data}
        assert store.get_execution(1).result == data
        assert "demo" not in repr(raw("SELECT payload FROM event"))

    def test_a_workload_holding_an_inherited_secret_is_sealed(
        self, store: Store, raw: RawQuery
    ) -> None:
        make_execution(store, 9, workload={"dsn": "x:tok-abcdefgh@h"}, secrets={"tok-abcdefgh"})
        make_execution(store, 10, workload={"n": 1}, secrets={"tok-abcdefgh"})
        assert store.get_execution(9).workload == {"dsn": "x:tok-abcdefgh@h"}
        workloads = dict(raw("SELECT execution_id, workload FROM execution"))
        assert workloads[9].startswith(SEALED_PREFIX) and workloads[10] == '{"n":1}'

    def test_values_that_look_sealed_round_trip(self, store: Store) -> None:
        lookalike = {"$sealed": "not a token"}
        make_execution(store, 1, workload=lookalike)
        store.append(
            [event(1, 1, payload=lookalike, error=lookalike)],
            execution_updates=[ExecutionUpdate(1, "completed", T0, result=lookalike)],
        )
        assert store.get_execution(1).result == lookalike
        assert store.get_execution(1).workload == lookalike
        assert store.events(1)[0].payload == lookalike and store.events(1)[0].error == lookalike

    def test_another_master_key_cannot_read_sealed_values(
        self, store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        first = store_factory()
        first.append([event(1, 1, "secrets.added", payload={"values": ["tok-123456789"]})])
        first.append([event(2, 2, payload={"plain": True})])
        first.close()
        monkeypatch.setenv(MASTER_KEY_ENV, Fernet.generate_key().decode())
        second = store_factory()
        with pytest.raises(StoreError, match="another master key"):
            second.events(1)
        assert second.events(2)[0].payload == {"plain": True}  # nothing sealed: no key needed
        second.close()

    # -- lifecycle -------------------------------------------------------------------

    def test_reopen_keeps_everything(self, store_factory: StoreFactory) -> None:
        first = store_factory()
        make_execution(first, 1)
        first.append(
            [event(1, 1, payload={"a": 1}), event(1, 2, error={"kind": "k"})],
            commands=[command(5, status="claimed", worker_id="w")],
            execution_updates=[ExecutionUpdate(1, "running", T0 + 1, result=[1])],
        )
        first.register_playbook("p", "text", source_file="p.yaml", created=T0)
        first.put_credential("c", "kind", b"\x01\x02", updated=T0)
        before = (
            first.get_execution(1),
            first.events(1),
            first.get_command(5),
            first.list_playbooks(),
            first.list_credentials(),
        )
        first.close()

        second = store_factory()
        after = (
            second.get_execution(1),
            second.events(1),
            second.get_command(5),
            second.list_playbooks(),
            second.list_credentials(),
        )
        assert after == before
        assert second.get_credential("c") == ("kind", b"\x01\x02")
        second.close()

    def test_close_is_idempotent_and_final(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.close()
        store.close()
        with pytest.raises(StoreError):
            store.count_events(1)
        with pytest.raises(StoreError):
            store.append([event(1, 1)])

    def test_concurrent_appends_lose_nothing(self, store: Store) -> None:
        threads_n, batches, per_batch = 8, 40, 16
        shared = 1
        make_execution(store, shared)
        barrier = threading.Barrier(threads_n + 1)
        errors: list[BaseException] = []
        stop = threading.Event()

        def writer(t: int) -> None:
            try:
                barrier.wait()
                own = 100 + t
                for b in range(batches):
                    base = (t * batches + b) * per_batch * 2
                    store.append(
                        [event(own, base + i) for i in range(per_batch)]
                        + [event(shared, base + per_batch + i) for i in range(per_batch)],
                        commands=[command(base, execution_id=own, time=T0 + b)],
                        execution_updates=[ExecutionUpdate(shared, f"w{t}", T0 + b)],
                    )
            except BaseException as exc:  # surfaced by the main thread
                errors.append(exc)

        def reader() -> None:
            try:
                barrier.wait()
                while not stop.is_set():
                    store.count_events(shared)
                    store.events(shared, limit=50)
                    store.list_executions()
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads_n)]
        reading = threading.Thread(target=reader)
        for th in [*workers, reading]:
            th.start()
        for th in workers:
            th.join(timeout=60)
        stop.set()
        reading.join(timeout=60)

        assert errors == []
        total = threads_n * batches * per_batch
        assert store.count_events(shared) == total
        ids = [e.event_id for e in store.events(shared)]
        assert ids == sorted(ids) and len(set(ids)) == total
        for t in range(threads_n):
            assert store.count_events(100 + t) == batches * per_batch
            assert len(store.pending_commands(100 + t)) == batches
