"""`command.progress` in the fold: a spark loop's items, while its command is open, and
anew when it is issued again; the summary shows them as the step's loop."""

from __future__ import annotations

from typing import Any

from flowtide.documents.execution import step_view
from flowtide.documents.summary import execution_summary
from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import ExecutionState
from flowtide.playbook.loader import parse_playbook

PLAYBOOK = parse_playbook(
    """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: p, path: p}
workflow:
  - step: work
    loop: {in: "{{ [1, 2] }}", iterator: x, spec: {mode: spark}}
    tool: {kind: python, input: {x: "{{ iter.x }}"}, code: "result = x"}
""",
    "p.yaml",
)
_ids = iter(range(1, 1000))


def _event(type_: str, payload: dict[str, Any] | None = None, command: int | None = 7) -> Event:
    return Event(next(_ids), 1, type_, step="work", payload=payload, command_id=command, time=100.0)


def _state(*events: Event) -> ExecutionState:
    state = ExecutionState(PLAYBOOK, 1)
    state.apply(_event(ev.PLAYBOOK_INITIALIZED, {"workload": {}}, None))
    state.apply(_event(ev.STEP_ENTER, None, None))
    for e in events:
        state.apply(e)
    return state


def _progress(done: int, **extra: Any) -> Event:
    return _event(ev.COMMAND_PROGRESS, {"attempt": 1, "done": done, "total": 10, **extra})


def test_progress_of_an_open_command_is_the_steps_items() -> None:
    issued = _event(ev.COMMAND_ISSUED, {"attempt": 1, "command_id": 7})
    state = _state(issued, _progress(4, per_second=2.5))
    assert state.steps["work"].items == {"done": 4, "total": 10, "per_second": 2.5}
    assert step_view(state)["work"]["items"]["done"] == 4
    loop = execution_summary(state)["steps"]["work"]["loop"]
    assert loop is not None and (loop["done"], loop["total"], loop["finished"]) == (4, 10, False)
    assert execution_summary(state)["progress"]["iterations_done"] == 4


def test_progress_of_a_command_not_open_is_ignored() -> None:
    # Never issued (another execution's, a forged id), or reported after its end.
    assert _state(_progress(4)).steps["work"].items is None
    issued = _event(ev.COMMAND_ISSUED, {"attempt": 1, "command_id": 7})
    done = _event(ev.COMMAND_COMPLETED, {"attempt": 1, "status": "ok", "result": 1})
    state = _state(issued, _progress(10, failed=1), done, _progress(3))
    assert state.steps["work"].items == {"done": 10, "total": 10, "per_second": 0.0, "failed": 1}


def test_a_command_issued_again_starts_its_items_again() -> None:
    issued = _event(ev.COMMAND_ISSUED, {"attempt": 1, "command_id": 7})
    again = _event(ev.COMMAND_ISSUED, {"attempt": 2, "command_id": 7, "reissued": True})
    state = _state(issued, _progress(6), again)
    assert state.steps["work"].items is None
    assert "items" not in step_view(state)["work"]
