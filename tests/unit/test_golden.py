"""Recorded event logs (tests/golden/*.json) replayed against the current engine.

Each log holds the playbook text, every event of one execution (`Event.to_dict()`) and the
folded state. Two things must keep holding for an old log:

- `fold` rebuilds the recorded state from the recorded events;
- fed the log's inputs (initialization and worker reports), the engine takes exactly the
  recorded decisions: same events, same ids, same order.

A change that alters either fails here. When the change is intended, regenerate with
`FLOWTIDE_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/test_golden.py` and review the diff.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flowtide.engine import events as ev
from flowtide.engine.events import Command, Event
from flowtide.engine.state import fold
from flowtide.playbook.loader import parse_playbook

from .driver import EXECUTION_ID, Driver, Pick, Respond, last_issued, replay, snapshot

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
REGEN = os.environ.get("FLOWTIDE_REGEN_GOLDEN") == "1"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    playbook: str
    respond: Respond
    pick: Pick
    check: Callable[[dict[str, Any], list[Event]], None]


def plain_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


# -- scenario 1: exclusive routing, inclusive fan-out, fan-in ----------------------------

ROUTING_FAN_IN = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: golden_routing_fan_in, path: tests/golden/routing_fan_in}
workload: {threshold: 2}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'n': 5}"}
    set: {ctx.n: "{{ start.n }}"}
    next:
      spec: {mode: exclusive}
      arcs:
        - {step: small, when: "{{ ctx.n < threshold }}"}
        - {step: fan_out, when: "{{ ctx.n > threshold }}", set: {ctx.route: fan_out}}
        - {step: small, when: "{{ ctx.n > 1 }}", set: {ctx.route: small}}
  - step: small
    tool: {kind: noop}
    next: [end]
  - step: fan_out
    tool: {kind: python, code: "result = {'a': True, 'b': True, 'c': False}"}
    next:
      spec: {mode: inclusive}
      arcs:
        - {step: branch_a, when: "{{ fan_out.a }}"}
        - {step: branch_b, when: "{{ fan_out.b }}"}
        - {step: branch_c, when: "{{ fan_out.c }}"}
  - step: branch_a
    tool: {kind: python, code: "result = {'value': 1}"}
    next: [join]
  - step: branch_b
    tool: {kind: python, code: "result = {'value': 2}"}
    next: [join]
  - step: branch_c
    tool: {kind: noop}
    next: [join]
  - step: join
    tool: {kind: python, code: "result = {'joined': True}"}
    set: {ctx.total: "{{ branch_a.value + branch_b.value }}"}
    next: [end]
  - step: end
    tool: {kind: python, code: "result = {'done': True}"}
"""

ROUTING_RESULTS = {
    "start": {"n": 5},
    "fan_out": {"a": True, "b": True, "c": False},
    "branch_a": {"value": 1},
    "branch_b": {"value": 2},
    "join": {"joined": True},
    "end": {"done": True},
}


def routing_respond(driver: Driver, command: Command) -> dict[str, Any]:
    return {"result": ROUTING_RESULTS.get(command.step)}


def routing_check(state: dict[str, Any], events: list[Event]) -> None:
    assert state["status"] == "completed"
    assert state["ctx"] == {"n": 5, "route": "fan_out", "total": 3}
    assert {name: (s["status"], s["runs"]) for name, s in state["steps"].items()} == {
        "start": ("completed", 1),
        "small": ("pending", 0),
        "fan_out": ("completed", 1),
        "branch_a": ("completed", 1),
        "branch_b": ("completed", 1),
        "branch_c": ("pending", 0),
        "join": ("completed", 1),
        "end": ("completed", 1),
    }
    assert {
        name: s["result"] for name, s in state["steps"].items() if s["result"] is not None
    } == ROUTING_RESULTS
    assert state["result"] == {"done": True}
    exits = {e.step: e.payload for e in events if e.type == ev.STEP_EXIT}
    assert exits["start"] == {"next": ["fan_out"], "set": {"n": 5, "route": "fan_out"}}
    assert exits["fan_out"] == {"next": ["branch_a", "branch_b"]}
    assert exits["join"] == {"next": ["end"], "set": {"total": 3}}
    enters = [e.step for e in events if e.type == ev.STEP_ENTER]
    assert enters.count("join") == 1 and enters.count("end") == 1
    done = [e.step for e in events if e.type == ev.COMMAND_COMPLETED]
    assert done.index("branch_b") < done.index("branch_a")  # answered out of order
    terminal = [e for e in events if e.type in ev.TERMINAL_TYPES]
    assert [(e.type, e.payload) for e in terminal] == [
        (ev.PLAYBOOK_COMPLETED, {"last_step": "end", "result": {"done": True}})
    ]


# -- scenario 2: parallel loop answered out of order -------------------------------------

PARALLEL_LOOP = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: golden_parallel_loop, path: tests/golden/parallel_loop}
workload:
  width: 3
  cities:
    - {name: Oslo, lat: 59.9}
    - {name: Lima, lat: -12.0}
    - {name: Pune, lat: 18.5}
    - {name: Cork, lat: 51.9}
    - {name: Kobe, lat: 34.7}
    - {name: Nice, lat: 43.7}
workflow:
  - step: start
    tool: {kind: noop}
    next: [fetch]
  - step: fetch
    loop:
      in: "{{ cities }}"
      iterator: city
      spec: {mode: parallel, max_in_flight: "{{ width }}"}
    tool: {kind: http, url: "http://weather.invalid/{{ iter.city.name }}"}
    set: {ctx.fetched: "{{ fetch.stats.success }}"}
    next: [summarize]
  - step: summarize
    tool:
      kind: python
      code: "result = {'names': [r['city'] for r in fetch.results]}"
"""

CITIES = ["Oslo", "Lima", "Pune", "Cork", "Kobe", "Nice"]


def loop_respond(driver: Driver, command: Command) -> dict[str, Any]:
    if command.step == "fetch":
        city = driver.element(command)
        return {"result": {"city": city["name"], "hot": city["lat"] < 20}}
    if command.step == "summarize":
        return {"result": {"names": CITIES}}
    return {"result": None}


def loop_check(state: dict[str, Any], events: list[Event]) -> None:
    assert state["status"] == "completed"
    assert state["ctx"] == {"fetched": 6}
    assert state["steps"]["fetch"]["result"] == {
        "results": [{"city": name, "hot": name in ("Lima", "Pune")} for name in CITIES],
        "stats": {"total": 6, "success": 6, "failed": 0},
    }
    assert state["steps"]["fetch"]["outcome"] == ev.LOOP_DONE
    assert state["loops"]["fetch#1"]["max_in_flight"] == 3
    assert state["result"] == {"names": CITIES}
    # At no point of the log were more than 3 iterations issued and not yet reported.
    in_flight: set[int] = set()
    widest = 0
    order: list[int] = []
    for e in events:
        if e.step != "fetch" or e.payload is None or "loop_index" not in e.payload:
            continue
        if e.type == ev.COMMAND_ISSUED:
            in_flight.add(e.payload["loop_index"])
        elif e.type == ev.COMMAND_COMPLETED:
            in_flight.discard(e.payload["loop_index"])
            order.append(e.payload["loop_index"])
        widest = max(widest, len(in_flight))
    assert widest == 3
    assert order == [2, 3, 4, 5, 1, 0]
    assert [e.type for e in events if e.step == "fetch"].count(ev.LOOP_DONE) == 1


# -- scenario 3: a failing step -----------------------------------------------------------

FAILURE = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: golden_failure, path: tests/golden/failure}
workload: {table: events}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'rows': 10}"}
    set: {ctx.rows: "{{ start.rows }}"}
    next: [load]
  - step: load
    tool:
      kind: python
      code: "result = 1 / 0"
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' }}"
              then: {do: fail}
    next: [report]
  - step: report
    tool: {kind: noop}
"""

FAILURE_ERROR = {
    "kind": "python_error",
    "retryable": False,
    "code": "ZeroDivisionError",
    "message": "ZeroDivisionError: division by zero",
    "http_status": None,
    "status": None,
}


def failure_respond(driver: Driver, command: Command) -> dict[str, Any]:
    if command.step == "load":
        return {
            "type": ev.COMMAND_FAILED,
            "status": "error",
            "action": "fail",
            "result": None,
            "error": FAILURE_ERROR,
        }
    return {"result": {"rows": 10}}


def failure_check(state: dict[str, Any], events: list[Event]) -> None:
    assert state["status"] == "failed"
    assert state["error"] == {**FAILURE_ERROR, "step": "load", "line": 10}
    assert state["ctx"] == {"rows": 10}
    assert {name: s["status"] for name, s in state["steps"].items()} == {
        "start": "completed",
        "load": "failed",
        "report": "pending",
    }
    assert state["steps"]["load"]["outcome"] == ev.CALL_ERROR
    assert state["result"] == {"rows": 10}  # the last step that finished
    assert state["open_commands"] == []
    assert [e.type for e in events][-4:] == [
        ev.COMMAND_FAILED,
        ev.STEP_EXIT,
        ev.WORKFLOW_FAILED,
        ev.PLAYBOOK_FAILED,
    ]
    assert not any(e.type == ev.PLAYBOOK_COMPLETED for e in events)


def lifo_out_of_order(outstanding: list[Command]) -> Command:
    return last_issued(outstanding)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "routing_fan_in",
            "exclusive routing with several true arcs, inclusive fan-out with one branch "
            "skipped, a fan-in barrier, answered newest-first",
            ROUTING_FAN_IN,
            routing_respond,
            lifo_out_of_order,
            routing_check,
        ),
        Scenario(
            "parallel_loop",
            "parallel loop over 6 items with a templated max_in_flight of 3, iterations "
            "answered newest-first (out of order)",
            PARALLEL_LOOP,
            loop_respond,
            lifo_out_of_order,
            loop_check,
        ),
        Scenario(
            "failure",
            "a step whose policy fails it on error: the execution fails naming the step",
            FAILURE,
            failure_respond,
            lifo_out_of_order,
            failure_check,
        ),
    )
}


def record(scenario: Scenario) -> dict[str, Any]:
    driver = Driver(scenario.playbook, respond=scenario.respond, pick=scenario.pick).run()
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "execution_id": EXECUTION_ID,
        "playbook": scenario.playbook,
        "events": [e.to_dict() for e in driver.log],
        "state": plain_json(snapshot(driver.state)),
    }


def golden(name: str) -> dict[str, Any]:
    path = GOLDEN / f"{name}.json"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(
            json.dumps(record(SCENARIOS[name]), indent=1, ensure_ascii=False) + "\n",
            encoding="utf-8",
        )
    if not path.exists():
        pytest.fail(f"{path} is missing; run with FLOWTIDE_REGEN_GOLDEN=1 to record it")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(params=sorted(SCENARIOS))
def recorded(request: pytest.FixtureRequest) -> tuple[Scenario, dict[str, Any]]:
    return SCENARIOS[request.param], golden(request.param)


def test_fold_rebuilds_the_recorded_state(recorded: tuple[Scenario, dict[str, Any]]) -> None:
    scenario, log = recorded
    playbook = parse_playbook(log["playbook"])
    events = [Event.from_dict(e) for e in log["events"]]
    state = fold(playbook, log["execution_id"], events)
    folded = plain_json(snapshot(state))
    assert folded == log["state"]
    scenario.check(folded, events)


def test_replayed_inputs_lead_to_the_recorded_decisions(
    recorded: tuple[Scenario, dict[str, Any]],
) -> None:
    _, log = recorded
    playbook = parse_playbook(log["playbook"])
    events = [Event.from_dict(e) for e in log["events"]]
    driver = replay(playbook, events)
    assert plain_json([e.to_dict() for e in driver.log]) == log["events"]
    assert plain_json(snapshot(driver.state)) == log["state"]


def test_scenario_still_records_the_same_log(recorded: tuple[Scenario, dict[str, Any]]) -> None:
    scenario, log = recorded
    assert log["playbook"] == scenario.playbook, "the scenario changed: regenerate the golden log"
    assert plain_json(record(scenario)) == log


def test_events_round_trip_through_dicts(recorded: tuple[Scenario, dict[str, Any]]) -> None:
    _, log = recorded
    assert [Event.from_dict(e).to_dict() for e in log["events"]] == log["events"]
    ids = [e["event_id"] for e in log["events"]]
    assert len(set(ids)) == len(ids)
    assert all(e["execution_id"] == log["execution_id"] for e in log["events"])
