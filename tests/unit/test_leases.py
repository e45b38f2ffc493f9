"""flowtide.server.leases.reissue_events: the `command.issued` events that give a
command whose lease ended its next attempt. Pure logic, no database."""

from __future__ import annotations

import itertools

from flowtide.engine import events as ev
from flowtide.server.leases import reissue_events
from flowtide.store.pg.commands import ExpiredLease

from .driver import EXECUTION_ID, Driver

LOOP = """
workflow:
  - step: start
    loop: {in: "{{ [10, 20] }}", iterator: n, spec: {mode: parallel, max_in_flight: 2}}
    tool: {kind: noop}
"""


def test_an_expired_lease_issues_the_next_attempt_of_the_same_command() -> None:
    driver = Driver(LOOP).start()
    first, second = driver.outstanding
    ids = itertools.count(9000)
    events = reissue_events(
        [ExpiredLease(first.command_id, 123.0), ExpiredLease(second.command_id, 0.0)],
        driver.state,
        lambda: next(ids),
        now=50.0,
    )
    assert [e.event_id for e in events] == [9000, 9001]
    for event, command in zip(events, (first, second), strict=True):
        assert event.type == ev.COMMAND_ISSUED
        assert event.execution_id == EXECUTION_ID
        assert event.command_id == command.command_id
        assert event.step == "start"
        assert event.time == 50.0
        assert event.payload is not None
        assert event.payload["attempt"] == command.attempt + 1
        assert event.payload["reissued"] is True
        assert event.payload["loop_index"] == command.loop_index
        assert event.payload["loop_instance"] == command.loop_instance
    assert events[0].payload is not None and events[1].payload is not None
    assert events[0].payload["reason"] == "lease expired"
    # `release` ends a lease at 0: the worker handed the command back.
    assert events[1].payload["reason"] == "released by its worker"


def test_a_command_the_state_no_longer_tracks_is_left_alone() -> None:
    driver = Driver(LOOP).start()
    events = reissue_events([ExpiredLease(424242, 1.0)], driver.state, lambda: 1, now=0.0)
    assert events == []


def test_the_reissued_event_reissues_the_command_when_applied() -> None:
    driver = Driver(LOOP).start()
    command = driver.outstanding[0]
    [event] = reissue_events(
        [ExpiredLease(command.command_id, 1.0)], driver.state, driver.new_id, now=0.0
    )
    driver.post(event)
    record = driver.state.commands[command.command_id]
    assert record.attempt == command.attempt + 1
    assert record.issued_event_id == event.event_id
