"""The playbook graph the UI draws (`flowtide.documents.graph`) and the execution summary
(`flowtide.documents.summary`): pure functions of the playbook and the folded state."""

from __future__ import annotations

import json

from flowtide.documents.graph import playbook_graph
from flowtide.documents.summary import execution_summary
from flowtide.playbook.loader import parse_playbook

from .driver import CYCLE, Driver

DIAMOND = """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      mode: inclusive
      arcs:
        - {step: left, when: "{{ workload.go_left }}"}
        - {step: right}
  - step: left
    tool: {kind: noop}
    next: [{step: join}]
  - step: right
    loop: {in: "{{ range(30) | list }}", iterator: n, spec: {mode: parallel, max_in_flight: 4}}
    tool: {kind: python, code: "result = n"}
    next: [{step: join}]
  - step: join
    tool: {kind: noop}
    next: [{step: end}]
  - step: end
    tool: {kind: noop}
workload: {go_left: false}
"""


def _nodes(graph: dict) -> dict[str, dict]:
    return {n["name"]: n for n in graph["nodes"]}


def test_steps_are_layered_by_their_longest_path_from_the_entry() -> None:
    graph = playbook_graph(parse_playbook(DIAMOND))
    nodes = _nodes(graph)
    assert {n: nodes[n]["layer"] for n in nodes} == {
        "start": 0,
        "left": 1,
        "right": 1,
        "join": 2,
        "end": 3,
    }
    assert graph["layers"] == [1, 2, 1, 1]
    assert {nodes["left"]["position"], nodes["right"]["position"]} == {0, 1}
    assert nodes["start"]["entry"] and not nodes["end"]["entry"]
    assert nodes["right"]["kind"] == "python" and nodes["right"]["loop"]["mode"] == "parallel"
    assert nodes["join"]["line"] is not None
    arcs = {(e["from"], e["to"]): e for e in graph["edges"]}
    assert arcs[("start", "left")]["when"] == "{{ workload.go_left }}"
    assert arcs[("start", "right")]["when"] is None
    assert arcs[("start", "left")]["mode"] == "inclusive"
    assert not any(e["back"] for e in graph["edges"])
    json.dumps(graph)  # plain JSON


def test_an_arc_back_to_a_step_on_the_path_is_drawn_as_a_back_arc() -> None:
    graph = playbook_graph(parse_playbook(CYCLE))
    nodes = _nodes(graph)
    assert [nodes[n]["layer"] for n in ("start", "tick", "done")] == [0, 1, 2]
    back = [(e["from"], e["to"]) for e in graph["edges"] if e["back"]]
    assert back == [("tick", "tick")]


def test_the_ordering_uncrosses_arcs() -> None:
    # Written so that file order crosses the arcs: a -> d, b -> c.
    text = """
workflow:
  - step: start
    tool: {kind: noop}
    next: {mode: inclusive, arcs: [{step: a}, {step: b}]}
  - step: c
    tool: {kind: noop}
  - step: d
    tool: {kind: noop}
  - step: a
    tool: {kind: noop}
    next: [{step: d}]
  - step: b
    tool: {kind: noop}
    next: [{step: c}]
"""
    nodes = _nodes(playbook_graph(parse_playbook(text)))
    a, b = nodes["a"]["position"], nodes["b"]["position"]
    c, d = nodes["c"]["position"], nodes["d"]["position"]
    assert (a < b) == (d < c)


def test_the_summary_counts_steps_iterations_and_arcs_taken() -> None:
    driver = Driver(DIAMOND, respond=lambda d, c: {"result": c.loop_index}).run()
    summary = execution_summary(driver.state)
    assert summary["status"] == "completed"
    assert summary["progress"] == {
        "steps": 5,
        "steps_finished": 4,  # `left` was never entered
        "iterations": 30,
        "iterations_done": 30,
        "iterations_failed": 0,
    }
    right = summary["steps"]["right"]
    assert right["loop"]["total"] == 30 and right["loop"]["finished"]
    assert right["status"] == "completed" and right["runs"] == 1
    assert right["duration"] is not None and right["duration"] >= 0
    assert summary["steps"]["left"]["status"] == "pending"
    taken = {(t["from"], t["to"]): t["count"] for t in summary["taken"]}
    assert taken == {("start", "right"): 1, ("right", "join"): 1, ("join", "end"): 1}
    # No results: its size does not grow with the loop.
    assert "result" not in json.dumps(summary)


def test_nothing_is_in_flight_once_the_execution_has_ended() -> None:
    def fail_third(driver: Driver, command: object) -> dict[str, object]:
        if getattr(command, "loop_index", None) == 2:
            return {"type": "command.failed", "status": "error", "action": "fail"}
        return {"result": 1}

    driver = Driver(DIAMOND, respond=fail_third, pick=lambda cs: cs[-1]).run()
    assert driver.state.status == "failed"
    loop = driver.state.loop_of("right")
    assert loop is not None and loop.in_flight  # the fold keeps what was open
    right = execution_summary(driver.state)["steps"]["right"]["loop"]
    assert right["in_flight"] == 0 and right["failed"] == 1


def test_a_step_run_in_a_cycle_counts_its_runs_and_arcs() -> None:
    driver = Driver(CYCLE).run()
    summary = execution_summary(driver.state)
    assert summary["steps"]["tick"]["runs"] == 3
    taken = {(t["from"], t["to"]): t["count"] for t in summary["taken"]}
    assert taken == {("start", "tick"): 1, ("tick", "tick"): 2, ("tick", "done"): 1}
