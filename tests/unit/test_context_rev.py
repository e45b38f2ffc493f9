"""`ExecutionState.context_rev`: the revision a worker names to be spared the context
parts it already holds (`wire.ExecutionShare`). It must change whenever the parts do,
or a worker would run a command against an old context; it should not change when they
do not, or a loop would be sent its whole context with every iteration."""

from __future__ import annotations

import json

import pytest

from flowtide.engine.state import ExecutionState

from .driver import CYCLE, EXECUTION_ID, Driver

LOOP = """
workflow:
  - step: start
    tool: {kind: noop}
    next: [{step: each}]
  - step: each
    loop: {in: "{{ range(40) | list }}", iterator: n, spec: {mode: parallel, max_in_flight: 4}}
    tool: {kind: noop}
    next: [{step: end}]
  - step: end
    tool: {kind: noop}
"""


def _parts(state: ExecutionState) -> str:
    return json.dumps(state.context_parts(), sort_keys=True, default=repr)


def _answer(driver: Driver, command: object) -> dict[str, object]:
    step = getattr(command, "step", "")
    index = getattr(command, "loop_index", None)
    if step == "start":
        return {"result": {"rows": list(range(100))}}
    if step == "each" and index == 7:
        return {"result": index, "ctx": {"seen": index}}
    if step == "tick":
        # A finished step without a result is in the context (as None) until it is
        # entered again.
        return {"result": None}
    return {"result": index if index is not None else {"step": step}}


@pytest.mark.parametrize("text", [LOOP, CYCLE], ids=["loop", "cycle"])
def test_the_revision_changes_whenever_the_context_parts_do(text: str) -> None:
    driver = Driver(text, respond=_answer).run()
    assert driver.state.status == "completed"
    # Replayed one event at a time, as any server process folds the log.
    state = ExecutionState(driver.playbook, EXECUTION_ID)
    before, rev = _parts(state), state.context_rev
    changes = 0
    for event in driver.log:
        state.apply(event)
        after = _parts(state)
        if after != before:
            assert state.context_rev != rev, f"{event.type} of {event.step} changed the parts"
            assert state.context_rev == event.event_id
            changes += 1
        before, rev = after, state.context_rev
    assert changes >= 4
    # The same log gives the same revision wherever it is folded.
    assert state.context_rev == driver.state.context_rev


def test_loop_iterations_leave_the_revision_alone() -> None:
    driver = Driver(LOOP, respond=_answer).run()
    state = ExecutionState(driver.playbook, EXECUTION_ID)
    revisions = set()
    reports = 0
    for event in driver.log:
        state.apply(event)
        if event.type == "command.completed" and event.step == "each":
            reports += 1
            revisions.add(state.context_rev)
    assert reports == 40
    # One revision while the loop ran, and one after the iteration that set ctx.
    assert len(revisions) == 2
