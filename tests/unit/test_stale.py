"""flowtide.server.stale: which worker reports are stale, judged against command rows.
Pure rules, no database."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flowtide.engine import events as ev
from flowtide.engine.events import Command, Event
from flowtide.server.stale import (
    Holder,
    disjoint_events,
    drop_stale,
    reported_commands,
    settle,
    stale_commands,
)
from flowtide.store.base import CommandUpdate

EXECUTION = 7
_ids = iter(range(1000, 10_000))


def report(
    command_id: int | None,
    type_: str = ev.COMMAND_COMPLETED,
    *,
    worker: str = "w1",
    attempt: int | None = 1,
    event_id: int | None = None,
) -> Event:
    payload: dict[str, Any] = {} if attempt is None else {"attempt": attempt}
    return Event(
        event_id=next(_ids) if event_id is None else event_id,
        execution_id=EXECUTION,
        type=type_,
        status="ok",
        payload=payload,
        command_id=command_id,
        worker_id=worker,
    )


def claimed(worker: str = "w1", attempt: int = 1) -> Holder:
    return Holder("claimed", worker, attempt)


def test_a_report_of_the_holder_on_its_attempt_is_kept() -> None:
    events = [report(1, ev.COMMAND_STARTED), report(1, ev.CALL_DONE), report(1)]
    kept, count = drop_stale({1: claimed()}, events)
    assert kept == events
    assert count == 0


def test_a_command_that_is_no_longer_claimed_makes_its_report_stale() -> None:
    for status in ("issued", "completed", "failed", "cancelled"):
        current = {1: Holder(status, "w1", 1)}
        assert stale_commands(current, [report(1)]) == {1}


def test_a_command_without_a_row_is_stale() -> None:
    assert stale_commands({}, [report(5)]) == {5}


def test_another_workers_claim_makes_the_report_stale() -> None:
    assert stale_commands({1: claimed("w2")}, [report(1, worker="w1")]) == {1}
    # A row without a holder (no authentication) does not check who reports.
    assert stale_commands({1: Holder("claimed", None, 1)}, [report(1, worker="w9")]) == set()


def test_a_report_of_an_earlier_attempt_is_stale() -> None:
    # The lease expired, the command was issued again (attempt 2) and claimed by the
    # same worker: its late report of attempt 1 must not count for attempt 2.
    assert stale_commands({1: claimed(attempt=2)}, [report(1, attempt=1)]) == {1}
    assert stale_commands({1: claimed(attempt=2)}, [report(1, ev.COMMAND_STARTED, attempt=1)]) == {
        1
    }


def test_a_tool_calls_retry_attempt_is_not_the_commands() -> None:
    # call.done / call.error carry the tool call's own retry attempt.
    events = [report(1, ev.CALL_ERROR, attempt=3), report(1, ev.CALL_DONE, attempt=4)]
    assert stale_commands({1: claimed(attempt=1)}, events) == set()


def test_a_report_without_an_attempt_is_judged_by_its_holder_alone() -> None:
    assert stale_commands({1: claimed(attempt=5)}, [report(1, attempt=None)]) == set()


def test_every_event_of_a_stale_command_is_dropped_and_only_its_reports_counted() -> None:
    stale = [
        report(1, ev.COMMAND_STARTED),
        report(1, ev.SECRETS_ADDED),
        report(1, ev.CALL_DONE),
        report(1),
    ]
    fresh = [report(2, ev.COMMAND_STARTED), report(2, ev.COMMAND_FAILED)]
    current = {1: Holder("cancelled", "w1", 1), 2: claimed()}
    kept, count = drop_stale(current, stale + fresh)
    assert kept == fresh
    assert count == 1  # the command.completed of command 1; started/call.done are not reports


def test_events_a_worker_does_not_report_are_left_alone() -> None:
    other = report(1, ev.STEP_EXIT)
    kept, count = drop_stale({}, [other])
    assert kept == [other]
    assert count == 0
    # ... even next to a stale report of the same command.
    kept, _ = drop_stale({}, [other, report(1)])
    assert kept == [other]


def test_reported_commands_are_the_worker_events_commands_sorted() -> None:
    parts = [
        [report(9), report(None, ev.COMMAND_STARTED), report(3, ev.STEP_EXIT)],
        [report(2, ev.CALL_DONE), report(9, ev.COMMAND_STARTED)],
    ]
    assert reported_commands(parts) == [2, 9]


def _update(command_id: int, status: str) -> CommandUpdate:
    command = Command(command_id, EXECUTION, "s", 1, None, None, 1)
    return CommandUpdate.from_command(command, status=status, time=0.0)


def test_settle_applies_what_a_part_wrote_to_the_rows_the_next_part_is_judged_by() -> None:
    current = {1: claimed(), 2: claimed("w2")}
    settle(current, [_update(1, "completed"), _update(3, "issued")], terminal=False)
    assert current == {1: Holder("completed", "w1", 1), 2: claimed("w2")}
    # A later report of command 1 in the same step is now stale.
    assert stale_commands(current, [report(1)]) == {1}


def test_settle_closes_open_commands_when_the_execution_ended() -> None:
    current = {1: claimed(), 2: Holder("issued", None, 1), 3: Holder("completed", "w1", 1)}
    settle(current, [], terminal=True)
    assert {k: v.status for k, v in current.items()} == {
        1: "cancelled",
        2: "cancelled",
        3: "completed",
    }


def test_disjoint_events_gathers_the_new_events_of_parts_naming_distinct_commands() -> None:
    a, b, old = report(1, event_id=1), report(2, event_id=2), report(3, event_id=3)
    assert disjoint_events([[a, old], [b]], seen={3}) == [a, b]
    # Two parts naming one command: each part must be judged after the one before it.
    assert disjoint_events([[a], [report(1, ev.COMMAND_STARTED)]], seen=set()) is None
    # One part may name a command many times.
    assert disjoint_events([[a, report(1, ev.COMMAND_STARTED)]], seen=set()) is not None


def test_a_report_into_another_execution_is_stale() -> None:
    # A worker holds command 1 of execution 3 and reports its events as execution
    # EXECUTION's: they must not be written into that execution's log.
    held = Holder("claimed", "w1", 1, execution_id=3, step="fetch")
    forged = replace(report(1), step="fetch")
    assert forged.execution_id != 3
    assert stale_commands({1: held}, [forged]) == {1}
    own = Holder("claimed", "w1", 1, execution_id=EXECUTION, step="fetch")
    assert stale_commands({1: own}, [forged]) == set()


def test_a_report_naming_another_step_than_its_commands_is_stale() -> None:
    # The worker holds a command of step `fetch`: it cannot end step `pay` with it.
    held = Holder("claimed", "w1", 1, execution_id=EXECUTION, step="fetch")
    for type_ in (ev.COMMAND_STARTED, ev.CALL_DONE, ev.COMMAND_COMPLETED):
        assert stale_commands({1: held}, [replace(report(1, type_), step="pay")]) == {1}
