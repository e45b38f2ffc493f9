"""The engine and a playbook's deadlines (pure): a `timeout` event fails the run with
`deadline_exceeded` and a late report then changes nothing; an `sla` event is recorded
and the run goes on; a deadline after the end is ignored."""

from __future__ import annotations

from flowtide.engine import events as ev
from flowtide.runtime.deadlines import deadline_event

from .driver import EXECUTION_ID, NOW, Driver

TWO_STEPS = """
timeout: 10s
sla: 5s
workflow:
  - step: start
    tool: {kind: noop}
    next: [end]
  - step: end
    tool: {kind: noop}
"""


def _missed(driver: Driver, kind: str, limit: float) -> list[ev.Event]:
    event = deadline_event(
        EXECUTION_ID, kind, NOW + limit, limit, event_id=driver.new_id(), now=NOW + limit
    )
    return driver.post(event)


def test_a_timeout_fails_the_run_and_a_late_report_changes_nothing() -> None:
    driver = Driver(TWO_STEPS).start()
    (command,) = driver.outstanding
    recorded = _missed(driver, "timeout", 10.0)
    assert [e.type for e in recorded] == [
        ev.EXECUTION_DEADLINE_MISSED,
        ev.WORKFLOW_FAILED,
        ev.PLAYBOOK_FAILED,
    ]
    assert driver.state.status == "failed"
    assert driver.state.error == {
        "kind": "deadline_exceeded",
        "message": "the run went past its timeout of 10s",
        "step": None,
    }
    assert driver.state.deadlines_missed == {"timeout"}
    late = driver.post(driver.completion(command))
    assert [e.type for e in late] == [ev.COMMAND_COMPLETED]
    assert driver.state.status == "failed"


def test_an_sla_is_recorded_and_the_run_goes_on() -> None:
    driver = Driver(TWO_STEPS).start()
    recorded = _missed(driver, "sla", 5.0)
    assert [e.type for e in recorded] == [ev.EXECUTION_DEADLINE_MISSED]
    assert driver.state.deadlines_missed == {"sla"}
    driver.run()
    assert driver.state.status == "completed"


def test_a_deadline_after_the_end_is_ignored() -> None:
    driver = Driver(TWO_STEPS).run()
    assert driver.state.status == "completed"
    recorded = _missed(driver, "timeout", 10.0)
    assert [e.type for e in recorded] == [ev.EXECUTION_DEADLINE_MISSED]
    assert driver.state.status == "completed"
