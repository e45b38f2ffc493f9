"""The pure engine: `ExecutionState.apply`, `fold` and `decide`, driven without threads.

The test plays the worker (see driver.py): every command is answered with a
`command.completed` event, in an order the test chooses.
"""

from __future__ import annotations

from typing import Any

import pytest

from flowtide.engine import events as ev
from flowtide.engine.decide import DEFAULT_PARALLEL, decide
from flowtide.engine.events import Command
from flowtide.engine.state import fold

from .driver import NOW, Driver, last_issued, snapshot


def by_step(results: dict[str, Any]):
    """A worker that answers every command of step S with results[S] (default {'step': S})."""

    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        return {"result": results.get(command.step, {"step": command.step})}

    return respond


def echo_item(driver: Driver, command: Command) -> dict[str, Any]:
    """Loop iterations return their element; other steps their name."""
    if command.loop_index is not None:
        return {"result": {"item": driver.element(command), "index": command.loop_index}}
    return {"result": {"step": command.step}}


def statuses(driver: Driver) -> dict[str, str]:
    return {name: rec.status for name, rec in driver.state.steps.items()}


def assert_replays(driver: Driver) -> None:
    """Re-folding the log gives the state that was built event by event."""
    assert snapshot(fold(driver.playbook, driver.state.execution_id, driver.log)) == snapshot(
        driver.state
    )


# -- starting and finishing ------------------------------------------------------------


def test_initialized_event_starts_the_entry_step() -> None:
    driver = Driver(
        """
workload: {greeting: hi}
workflow:
  - step: first
    tool: {kind: noop}
  - step: start
    tool: {kind: noop}
"""
    ).start()
    assert driver.types() == [
        ev.PLAYBOOK_INITIALIZED,
        ev.WORKFLOW_INITIALIZED,
        ev.STEP_ENTER,
        ev.COMMAND_ISSUED,
    ]
    assert driver.entered() == ["start"]
    assert [c.step for c in driver.outstanding] == ["start"]
    assert driver.state.status == "running"
    assert driver.state.workload == {"greeting": "hi"}
    issued = driver.log[-1]
    assert issued.command_id == driver.outstanding[0].command_id
    assert driver.outstanding[0].issued_event_id == issued.event_id
    # Every derived event points at the event it follows from, with the time passed in.
    assert all(e.parent_event_id is not None and e.time == NOW for e in driver.log[1:])


def test_playbook_completed_carries_the_last_finished_steps_result() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next: [middle]
  - step: middle
    tool: {kind: noop}
    next: [finish]
  - step: finish
    tool: {kind: noop}
""",
        respond=by_step({"finish": {"total": 42}}),
    ).run()
    terminal = driver.terminal_event()
    assert terminal.type == ev.PLAYBOOK_COMPLETED
    assert terminal.payload == {"last_step": "finish", "result": {"total": 42}}
    assert driver.types()[-2:] == [ev.WORKFLOW_COMPLETED, ev.PLAYBOOK_COMPLETED]
    assert driver.state.status == "completed"
    assert driver.state.result() == {"total": 42}
    assert driver.count(ev.PLAYBOOK_COMPLETED) == 1
    assert_replays(driver)


def test_missing_next_ends_the_branch() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
"""
    ).run()
    assert driver.state.status == "completed"
    assert driver.terminal_event().payload == {"last_step": "start", "result": {"step": "start"}}


def test_step_without_tool_exits_without_a_command() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next: end
  - step: end
"""
    ).run()
    assert [c.step for c in driver.issued] == ["start"]
    assert statuses(driver) == {"start": "completed", "end": "completed"}
    assert driver.state.status == "completed"


def test_nothing_is_decided_after_a_terminal_event() -> None:
    driver = Driver("workflow: [{step: start, tool: {kind: noop}}]").run()
    assert driver.state.terminal
    stray = driver.completion(
        Command(command_id=1, execution_id=driver.state.execution_id, step="start")
    )
    driver.state.apply(stray)
    assert decide(driver.state, stray, NOW, driver.new_id) == ([], [])


# -- routing -----------------------------------------------------------------------------

ROUTING = """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: %s}
      arcs:
        - {step: low, when: "{{ start.n > 100 }}"}
        - {step: mid, when: "{{ start.n > 1 }}", set: {ctx.picked: mid}}
        - {step: high, when: "{{ start.n > 2 }}", set: {ctx.also: high}}
        - {step: never, when: false}
        - {step: always, when: true}
  - step: low
    tool: {kind: noop}
  - step: mid
    tool: {kind: noop}
  - step: high
    tool: {kind: noop}
  - step: never
    tool: {kind: noop}
  - step: always
    tool: {kind: noop}
"""


def test_exclusive_routing_takes_the_first_matching_arc_only() -> None:
    driver = Driver(ROUTING % "exclusive", respond=by_step({"start": {"n": 5}})).run()
    exit_event = next(e for e in driver.log if e.type == ev.STEP_EXIT and e.step == "start")
    assert exit_event.payload == {"next": ["mid"], "set": {"picked": "mid"}}
    assert driver.entered() == ["start", "mid"]
    assert driver.state.ctx == {"picked": "mid"}  # the arcs not taken set nothing
    assert statuses(driver)["high"] == "pending"
    assert driver.state.status == "completed"
    assert_replays(driver)


def test_exclusive_routing_falls_through_to_an_unconditional_arc() -> None:
    driver = Driver(ROUTING % "exclusive", respond=by_step({"start": {"n": 0}})).run()
    assert driver.entered() == ["start", "always"]


def test_inclusive_routing_fans_out_to_every_matching_arc() -> None:
    driver = Driver(ROUTING % "inclusive", respond=by_step({"start": {"n": 5}})).run()
    exit_event = next(e for e in driver.log if e.type == ev.STEP_EXIT and e.step == "start")
    assert exit_event.payload == {
        "next": ["mid", "high", "always"],
        "set": {"picked": "mid", "also": "high"},
    }
    assert sorted(driver.entered()) == ["always", "high", "mid", "start"]
    # All three branches are issued before any of them is answered.
    assert sorted(c.step for c in driver.issued) == ["always", "high", "mid", "start"]
    assert driver.max_outstanding == {"start": 1, "mid": 1, "high": 1, "always": 1}
    assert statuses(driver) == {
        "start": "completed",
        "low": "pending",
        "mid": "completed",
        "high": "completed",
        "never": "pending",
        "always": "completed",
    }
    assert driver.state.ctx == {"picked": "mid", "also": "high"}
    assert driver.count(ev.PLAYBOOK_COMPLETED) == 1
    assert_replays(driver)


def test_arc_when_can_read_the_steps_own_output_and_event() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - {step: bad, when: "{{ output.status == 'error' }}"}
        - {step: good, when: "{{ event.name == 'call.done' and output.data.rows[0].n == 2 and result.rows | length == 1 }}"}
  - step: bad
    tool: {kind: noop}
  - step: good
    tool: {kind: noop}
""",
        respond=by_step({"start": {"rows": [{"n": 2}]}}),
    ).run()
    assert driver.entered() == ["start", "good"]


def test_step_set_is_applied_before_arc_when() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    set:
      ctx.count: "{{ start.n * 2 }}"
    next:
      arcs:
        - {step: ten, when: "{{ ctx.count == 10 }}"}
        - {step: other}
  - step: ten
    tool: {kind: noop}
  - step: other
    tool: {kind: noop}
""",
        respond=by_step({"start": {"n": 5}}),
    ).run()
    assert driver.entered() == ["start", "ten"]
    assert driver.state.ctx == {"count": 10}


def test_step_set_before_when_drives_a_counting_cycle() -> None:
    # test_pagination_max_iterations: increment in `set`, stop when the limit is reached.
    driver = Driver(
        """
workload: {limit: 3}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.i: 0}
    next: [tick]
  - step: tick
    tool: {kind: noop}
    set: {ctx.i: "{{ ctx.i + 1 }}"}
    next:
      arcs:
        - {step: done, when: "{{ ctx.i >= limit }}"}
        - {step: tick}
  - step: done
    tool: {kind: noop}
"""
    ).run()
    assert driver.entered() == ["start", "tick", "tick", "tick", "done"]
    assert driver.state.steps["tick"].runs == 3
    assert driver.state.ctx == {"i": 3}
    assert driver.state.status == "completed"
    assert_replays(driver)


def test_arc_set_renders_native_values() -> None:
    driver = Driver(
        """
workload: {initial_value: 7}
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: use
          set:
            ctx.test_var: "{{ initial_value }}"
            ctx.computed: 200
            ctx.sum: "{{ start.n + 1 }}"
            ctx.rows: "{{ start.rows }}"
            ctx.label: "n={{ start.n }}"
            ctx.nested.deep: "{{ start.n }}"
  - step: use
    tool: {kind: noop}
""",
        respond=by_step({"start": {"n": 5, "rows": [1, 2]}}),
    ).run()
    assert driver.state.ctx == {
        "test_var": 7,
        "computed": 200,
        "sum": 6,
        "rows": [1, 2],
        "label": "n=5",
        "nested": {"deep": 5},
    }
    assert isinstance(driver.state.ctx["sum"], int)


def test_design_example_loop_over_start_items() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next: [load]
  - step: load
    loop: {in: "{{ start.items }}", iterator: item, spec: {mode: parallel, max_in_flight: 8}}
    tool: {kind: noop}
""",
        respond=lambda d, c: (
            echo_item(d, c)
            if c.loop_index is not None
            else {"result": {"count": 2, "items": [1, 2]}}
        ),
    ).run()
    assert driver.state.status == "completed", driver.state.error
    assert driver.state.steps["load"].result["stats"]["total"] == 2


def test_jump_to_overrides_the_arcs() -> None:
    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        if command.step == "start":
            return {"result": {"x": 1}, "action": "jump", "jump_to": "elsewhere"}
        return {"result": None}

    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next: [usual]
  - step: usual
    tool: {kind: noop}
  - step: elsewhere
    tool: {kind: noop}
""",
        respond=respond,
    ).run()
    assert driver.entered() == ["start", "elsewhere"]
    assert statuses(driver)["usual"] == "pending"


def test_template_error_in_arc_when_fails_the_step() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - {step: end, when: "{{ start.missing_field > 1 }}"}
  - step: end
    tool: {kind: noop}
""",
        respond=by_step({"start": {"present": 1}}),
    ).run()
    exit_event = next(e for e in driver.log if e.type == ev.STEP_EXIT)
    assert exit_event.status == "failed"
    assert exit_event.error is not None
    assert exit_event.error["kind"] == "template_error"
    assert exit_event.error["missing"] == "missing_field"
    assert exit_event.error["expression"] == "{{ start.missing_field > 1 }}"
    assert driver.state.steps["start"].status == "failed"
    assert driver.state.status == "failed"
    terminal = driver.terminal_event()
    assert terminal.type == ev.PLAYBOOK_FAILED
    assert terminal.error is not None and terminal.error["step"] == "start"
    assert "end" not in driver.entered()
    assert_replays(driver)


def test_template_error_in_step_set_fails_the_step() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.x: "{{ nothing_here }}"}
""",
    ).run()
    assert driver.state.status == "failed"
    assert driver.state.error is not None
    assert driver.state.error["kind"] == "template_error"
    assert driver.state.error["missing"] == "nothing_here"
    assert driver.state.error["step"] == "start"


def test_a_steps_set_and_arcs_share_one_template_budget() -> None:
    # Each template writes 9 MB: within what one render may, but the step's `set` and
    # arcs together may not write more than one render may (50 MB).
    big = "{% for i in range(9) %}{{ 'x' * 1000000 }}{% endfor %}"
    sets = ", ".join(f'ctx.{name}: "{big}"' for name in "abcde")
    driver = Driver(
        f"""
workflow:
  - step: start
    tool: {{kind: noop}}
    set: {{{sets}}}
    next: [{{step: end, when: "{big}"}}]
  - step: end
""",
    ).run()
    assert driver.state.status == "failed"
    assert driver.state.error is not None
    assert driver.state.error["kind"] == "template_error"
    assert "writes more than 50,000,000 characters" in driver.state.error["message"]
    assert "field 'next.arcs.when'" in driver.state.error["message"]


def test_action_fail_fails_the_execution_naming_the_step() -> None:
    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        if command.step == "work":
            return {
                "type": ev.COMMAND_FAILED,
                "status": "error",
                "action": "fail",
                "result": None,
                "error": {"kind": "python_error", "message": "ZeroDivisionError: division by zero"},
            }
        return {"result": {"ok": True}}

    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next: [work]
  - step: work
    tool: {kind: noop}
    next: [after]
  - step: after
    tool: {kind: noop}
""",
        respond=respond,
    ).run()
    assert driver.state.status == "failed"
    assert driver.state.error == {
        "kind": "python_error",
        "message": "ZeroDivisionError: division by zero",
        "step": "work",
        "line": 6,  # where step `work` is written
    }
    assert driver.types()[-2:] == [ev.WORKFLOW_FAILED, ev.PLAYBOOK_FAILED]
    assert statuses(driver) == {"start": "completed", "work": "failed", "after": "pending"}
    assert driver.state.steps["work"].outcome == ev.CALL_ERROR
    assert_replays(driver)


def test_a_handled_error_continues_along_the_arcs() -> None:
    # The policy said continue after an error: the step completes and arcs see the error.
    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        if command.step == "start":
            return {"status": "error", "result": None, "error": {"kind": "http", "message": "503"}}
        return {"result": 1}

    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - {step: recover, when: "{{ event.name == 'call.error' and output.error.kind == 'http' }}"}
        - {step: normal}
  - step: recover
    tool: {kind: noop}
  - step: normal
    tool: {kind: noop}
""",
        respond=respond,
    ).run()
    assert driver.entered() == ["start", "recover"]
    assert driver.state.status == "completed"


# -- fan-in ------------------------------------------------------------------------------

FAN_IN = """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs:
        - {step: a, when: "{{ start.go_a }}"}
        - {step: b, when: "{{ start.go_b }}"}
        - {step: c, when: "{{ start.go_c }}"}
  - step: a
    tool: {kind: noop}
    next: [join]
  - step: b
    tool: {kind: noop}
    next: [b2]
  - step: b2
    tool: {kind: noop}
    next: [join]
  - step: c
    tool: {kind: noop}
    next: [join]
  - step: join
    tool: {kind: noop}
    next: [end]
  - step: end
    tool: {kind: noop}
"""


def _join_runs_after(driver: Driver, upstreams: list[str], join: str = "join") -> None:
    enter = next(i for i, e in enumerate(driver.log) if e.type == ev.STEP_ENTER and e.step == join)
    for up in upstreams:
        exit_at = next(
            i for i, e in enumerate(driver.log) if e.type == ev.STEP_EXIT and e.step == up
        )
        assert exit_at < enter, f"{join} entered before {up} finished"


@pytest.mark.parametrize("pick", ["first", "last"])
def test_fan_in_runs_once_after_every_upstream(pick: str) -> None:
    flags = {"go_a": True, "go_b": True, "go_c": True}
    driver = Driver(
        FAN_IN,
        respond=by_step({"start": flags}),
        pick=last_issued if pick == "last" else (lambda outstanding: outstanding[0]),
    ).run()
    assert driver.count(ev.STEP_ENTER, "join") == 1
    assert driver.count(ev.COMMAND_ISSUED, "join") == 1
    _join_runs_after(driver, ["a", "b", "b2", "c"])
    assert driver.state.steps["join"].runs == 1
    assert driver.state.status == "completed"
    assert driver.terminal_event().payload == {"last_step": "end", "result": {"step": "end"}}
    assert_replays(driver)


def test_fan_in_waits_for_a_longer_branch_still_running() -> None:
    driver = Driver(
        FAN_IN, respond=by_step({"start": {"go_a": True, "go_b": True, "go_c": False}})
    ).start()
    driver.answer(driver.outstanding[0])  # start
    assert sorted(c.step for c in driver.outstanding) == ["a", "b"]
    driver.answer(next(c for c in driver.outstanding if c.step == "a"))
    assert driver.state.waiting == {"join"}
    assert "join" not in driver.entered()
    driver.answer(next(c for c in driver.outstanding if c.step == "b"))
    assert "join" not in driver.entered()  # b2 can still reach join
    driver.answer(next(c for c in driver.outstanding if c.step == "b2"))
    assert driver.entered().count("join") == 1
    driver.run()
    assert driver.count(ev.STEP_ENTER, "join") == 1
    assert driver.state.status == "completed"


def test_fan_in_runs_once_when_an_upstream_was_skipped_by_routing() -> None:
    driver = Driver(
        FAN_IN, respond=by_step({"start": {"go_a": True, "go_b": False, "go_c": True}})
    ).run()
    assert driver.count(ev.STEP_ENTER, "join") == 1
    _join_runs_after(driver, ["a", "c"])
    assert statuses(driver) == {
        "start": "completed",
        "a": "completed",
        "b": "pending",
        "b2": "pending",
        "c": "completed",
        "join": "completed",
        "end": "completed",
    }
    assert driver.state.status == "completed"
    assert_replays(driver)


def test_fan_in_with_a_single_arriving_upstream() -> None:
    driver = Driver(
        FAN_IN, respond=by_step({"start": {"go_a": False, "go_b": False, "go_c": True}})
    ).run()
    assert driver.entered() == ["start", "c", "join", "end"]


def test_fan_in_sees_every_upstream_result() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next: {spec: {mode: inclusive}, arcs: [{step: a}, {step: b}]}
  - step: a
    tool: {kind: noop}
    next: [join]
  - step: b
    tool: {kind: noop}
    next: [join]
  - step: join
    tool: {kind: noop}
    set: {ctx.total: "{{ a.v + b.v }}"}
""",
        respond=by_step({"a": {"v": 1}, "b": {"v": 2}}),
        pick=last_issued,
    ).run()
    assert driver.state.ctx == {"total": 3}


def test_nested_fan_in_barriers_each_run_once() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next: {spec: {mode: inclusive}, arcs: [{step: a}, {step: b}, {step: c}]}
  - step: a
    tool: {kind: noop}
    next: [j1]
  - step: b
    tool: {kind: noop}
    next: [j1]
  - step: c
    tool: {kind: noop}
    next: [j2]
  - step: j1
    tool: {kind: noop}
    next: [j2]
  - step: j2
    tool: {kind: noop}
""",
        pick=last_issued,
    ).run()
    assert driver.count(ev.STEP_ENTER, "j1") == 1
    assert driver.count(ev.STEP_ENTER, "j2") == 1
    order = driver.entered()
    assert order.index("j1") < order.index("j2")
    assert driver.state.status == "completed"


def test_fan_in_waits_for_a_loop_upstream() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next: {spec: {mode: inclusive}, arcs: [{step: each}, {step: quick}]}
  - step: each
    loop: {in: [1, 2, 3], iterator: n, spec: {mode: sequential}}
    tool: {kind: noop}
    next: [reduce]
  - step: quick
    tool: {kind: noop}
    next: [reduce]
  - step: reduce
    tool: {kind: noop}
    set: {ctx.count: "{{ each.results | length }}"}
""",
        respond=echo_item,
        pick=last_issued,
    ).run()
    assert driver.count(ev.STEP_ENTER, "reduce") == 1
    _join_runs_after(driver, ["each", "quick"], join="reduce")
    assert driver.state.ctx == {"count": 3}
    assert driver.state.status == "completed"


def test_two_matching_inclusive_arcs_to_one_step_enter_it_once() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs:
        - {step: x, when: "{{ start.ok }}", set: {ctx.a: 1}}
        - {step: x, when: true, set: {ctx.b: 2}}
  - step: x
    tool: {kind: noop}
""",
        respond=by_step({"start": {"ok": True}}),
    ).run()
    assert driver.state.ctx == {"a": 1, "b": 2}
    assert driver.count(ev.STEP_ENTER, "x") == 1
    assert driver.state.status == "completed"


# -- loops -------------------------------------------------------------------------------

LOOP = """
workload:
  items: [10, 20, 30, 40, 50, 60, 70]
  width: 2
workflow:
  - step: start
    tool: {kind: noop}
    next: [each]
  - step: each
    loop:
      in: "{{ items }}"
      iterator: item
      spec: {mode: %s, max_in_flight: %s}
    tool: {kind: noop}
    next: [after]
  - step: after
    tool: {kind: noop}
"""


def test_sequential_loop_issues_one_iteration_at_a_time() -> None:
    driver = Driver(LOOP % ("sequential", 5), respond=echo_item).run()
    loop_commands = [c for c in driver.issued if c.step == "each"]
    assert [c.loop_index for c in loop_commands] == list(range(7))
    assert driver.max_outstanding["each"] == 1
    started = next(e for e in driver.log if e.type == ev.LOOP_STARTED)
    assert started.payload is not None and started.payload["max_in_flight"] == 1
    assert driver.state.steps["each"].result == {
        "results": [{"item": x, "index": i} for i, x in enumerate([10, 20, 30, 40, 50, 60, 70])],
        "stats": {"total": 7, "success": 7, "failed": 0},
    }
    assert driver.state.steps["each"].outcome == ev.LOOP_DONE
    assert driver.count(ev.LOOP_DONE, "each") == 1
    assert driver.entered() == ["start", "each", "after"]
    assert_replays(driver)


@pytest.mark.parametrize("pick", ["first", "last"])
def test_parallel_loop_never_exceeds_max_in_flight(pick: str) -> None:
    driver = Driver(
        LOOP % ("parallel", 3),
        respond=echo_item,
        pick=last_issued if pick == "last" else (lambda outstanding: outstanding[0]),
    ).run()
    assert driver.max_outstanding["each"] == 3
    assert len([c for c in driver.issued if c.step == "each"]) == 7
    loop = driver.state.loops[("each", 1)]
    assert loop.max_in_flight == 3
    assert loop.in_flight == set()
    assert driver.state.status == "completed"


def test_parallel_loop_fills_the_window_at_start() -> None:
    driver = Driver(LOOP % ("parallel", 3), respond=echo_item).start()
    driver.answer(driver.outstanding[0])  # start
    assert [c.loop_index for c in driver.outstanding] == [0, 1, 2]
    driver.answer(driver.outstanding[1])  # index 1 finishes first
    assert [c.loop_index for c in driver.outstanding] == [0, 2, 3]


def test_templated_max_in_flight() -> None:
    text = LOOP % ("parallel", "'{{ (width | default(1) | int) or 1 }}'")
    driver = Driver(text, respond=echo_item, pick=last_issued).run()
    assert driver.max_outstanding["each"] == 2
    started = next(e for e in driver.log if e.type == ev.LOOP_STARTED)
    assert started.payload is not None and started.payload["max_in_flight"] == 2


def test_parallel_loop_without_max_in_flight_uses_the_default() -> None:
    text = LOOP.replace(", max_in_flight: %s", "") % "parallel"
    driver = Driver(text, respond=echo_item).run()
    assert driver.state.loops[("each", 1)].max_in_flight == DEFAULT_PARALLEL
    assert driver.max_outstanding["each"] == 7


def test_loop_results_are_in_index_order_when_completions_arrive_out_of_order() -> None:
    driver = Driver(LOOP % ("parallel", 4), respond=echo_item, pick=last_issued).run()
    completions = [
        e.payload["loop_index"]
        for e in driver.log
        if e.type == ev.COMMAND_COMPLETED and e.step == "each"
    ]
    assert completions != sorted(completions)  # the worker really answered out of order
    assert driver.state.steps["each"].result["results"] == [
        {"item": x, "index": i} for i, x in enumerate([10, 20, 30, 40, 50, 60, 70])
    ]
    assert driver.state.steps["each"].result["stats"] == {"total": 7, "success": 7, "failed": 0}
    assert_replays(driver)


def test_loop_over_an_empty_collection_finishes_at_once() -> None:
    driver = Driver(
        LOOP % ("parallel", 3), respond=echo_item, workload={"items": [], "width": 1}
    ).run()
    assert [c.step for c in driver.issued] == ["start", "after"]
    assert driver.state.steps["each"].result == {
        "results": [],
        "stats": {"total": 0, "success": 0, "failed": 0},
    }
    assert driver.count(ev.LOOP_DONE, "each") == 1
    assert driver.entered() == ["start", "each", "after"]
    assert driver.state.status == "completed"


def test_loop_iteration_errors_are_counted() -> None:
    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        if command.loop_index == 1:
            return {"status": "error", "result": {"error": "bad"}, "error": {"kind": "x"}}
        return echo_item(driver, command)

    driver = Driver(LOOP % ("sequential", 1), respond=respond, workload={"items": [1, 2, 3]}).run()
    assert driver.state.steps["each"].result["stats"] == {"total": 3, "success": 2, "failed": 1}
    assert driver.state.steps["each"].result["results"][1] == {"error": "bad"}
    assert driver.state.status == "completed"


def test_loop_reentered_through_a_cycle_gets_a_fresh_instance() -> None:
    driver = Driver(
        """
workload:
  batches: [[1, 2], [3]]
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.round: 0}
    next: [load]
  - step: load
    loop: {in: "{{ batches[ctx.round] }}", iterator: n}
    tool: {kind: noop}
    set: {ctx.round: "{{ ctx.round + 1 }}", ctx.seen: "{{ load.stats.total }}"}
    next:
      arcs:
        - {step: load, when: "{{ ctx.round < 2 }}"}
        - {step: end}
  - step: end
    tool: {kind: noop}
""",
        respond=echo_item,
    ).run()
    started = [e.payload for e in driver.log if e.type == ev.LOOP_STARTED]
    assert [(p["instance"], p["collection"]) for p in started] == [(1, [1, 2]), (2, [3])]
    assert sorted(driver.state.loops) == [("load", 1), ("load", 2)]
    assert driver.state.current_loop["load"] == 2
    assert driver.state.steps["load"].runs == 2
    assert driver.state.steps["load"].result == {
        "results": [{"item": 3, "index": 0}],
        "stats": {"total": 1, "success": 1, "failed": 0},
    }
    assert [(c.loop_instance, c.loop_index) for c in driver.issued if c.step == "load"] == [
        (1, 0),
        (1, 1),
        (2, 0),
    ]
    assert driver.state.ctx == {"round": 2, "seen": 1}
    assert driver.count(ev.LOOP_DONE, "load") == 2
    assert driver.state.status == "completed"
    assert_replays(driver)


def test_break_in_a_sequential_loop_stops_issuing() -> None:
    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        answer = echo_item(driver, command)
        if command.loop_index == 2:
            answer["action"] = "break"
        return answer

    driver = Driver(LOOP % ("sequential", 1), respond=respond).run()
    assert [c.loop_index for c in driver.issued if c.step == "each"] == [0, 1, 2]
    assert driver.state.steps["each"].result == {
        "results": [{"item": 10, "index": 0}, {"item": 20, "index": 1}, {"item": 30, "index": 2}],
        "stats": {"total": 7, "success": 3, "failed": 0},
    }
    assert driver.state.loops[("each", 1)].broken
    assert driver.entered()[-1] == "after"
    assert driver.state.status == "completed"


def test_break_in_a_parallel_loop_waits_for_in_flight_iterations_and_issues_no_more() -> None:
    driver = Driver(LOOP % ("parallel", 3), respond=echo_item).start()
    driver.answer(driver.outstanding[0])  # start
    assert [c.loop_index for c in driver.outstanding] == [0, 1, 2]
    first = driver.outstanding[0]
    driver.answer(first, {"result": {"stop": True}, "action": "break"})
    assert [c.loop_index for c in driver.outstanding] == [1, 2]
    assert driver.count(ev.LOOP_DONE) == 0
    driver.answer(driver.outstanding[1])
    driver.answer(driver.outstanding[0])
    assert driver.count(ev.LOOP_DONE) == 1
    assert len([c for c in driver.issued if c.step == "each"]) == 3
    assert driver.state.steps["each"].result["results"] == [
        {"stop": True},
        {"item": 20, "index": 1},
        {"item": 30, "index": 2},
    ]
    driver.run()
    assert driver.state.status == "completed"


def test_fail_in_a_loop_iteration_fails_the_execution() -> None:
    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        if command.loop_index == 1:
            return {
                "type": ev.COMMAND_FAILED,
                "status": "error",
                "action": "fail",
                "error": {"kind": "sql_error", "message": "relation does not exist"},
            }
        return echo_item(driver, command)

    driver = Driver(LOOP % ("sequential", 1), respond=respond).run()
    assert [c.loop_index for c in driver.issued if c.step == "each"] == [0, 1]
    assert driver.state.status == "failed"
    assert driver.state.error == {
        "kind": "sql_error",
        "message": "relation does not exist",
        "step": "each",
        "line": 9,  # where step `each` is written
    }
    assert driver.state.steps["each"].status == "failed"
    assert "after" not in driver.entered()
    terminal = driver.terminal_event()
    assert terminal.type == ev.PLAYBOOK_FAILED and terminal.step == "each"
    assert_replays(driver)


def test_loop_collection_of_the_wrong_type_fails_the_step() -> None:
    driver = Driver(LOOP % ("sequential", 1), respond=echo_item, workload={"items": {"a": 1}}).run()
    assert driver.state.status == "failed"
    assert driver.state.error is not None
    assert driver.state.error["kind"] == "loop_error"
    assert driver.state.error["step"] == "each"


def test_iteration_ctx_updates_accumulate() -> None:
    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        if command.loop_index is None:
            return {"result": None}
        total = driver.state.ctx.get("total", 0) + driver.element(command)
        return {"result": total, "ctx": {"total": total}}

    driver = Driver(LOOP % ("sequential", 1), respond=respond, workload={"items": [1, 2, 3]}).run()
    assert driver.state.ctx == {"total": 6}


# -- duplicates and replay ---------------------------------------------------------------


def test_duplicate_completion_of_a_step_is_ignored_by_apply() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    next: [slow]
  - step: slow
    tool: {kind: noop}
""",
        respond=by_step({"start": {"first": True}}),
    ).start()
    command = driver.outstanding[0]
    driver.answer(command)
    before = snapshot(driver.state)
    duplicate = driver.completion(command, {"result": {"second": True}})
    driver.state.apply(duplicate)
    assert snapshot(driver.state) == before
    assert driver.state.steps["start"].result == {"first": True}
    assert decide(driver.state, duplicate, NOW, driver.new_id) == ([], [])


def test_duplicate_completion_of_a_loop_iteration_is_ignored_by_apply() -> None:
    driver = Driver(LOOP % ("parallel", 2), respond=echo_item).start()
    driver.answer(driver.outstanding[0])  # start
    command = driver.outstanding[0]
    driver.answer(command)
    before = snapshot(driver.state)
    duplicate = driver.completion(command, {"status": "error", "result": "again"})
    driver.state.apply(duplicate)
    assert snapshot(driver.state) == before
    loop = driver.state.loops[("each", 1)]
    assert (loop.success, loop.failed, loop.results[0]) == (1, 0, {"item": 10, "index": 0})


def test_duplicate_completion_of_a_loop_iteration_decides_nothing() -> None:
    driver = Driver(LOOP % ("parallel", 2), respond=echo_item).start()
    driver.answer(driver.outstanding[0])  # start
    command = driver.outstanding[0]
    driver.answer(command)
    duplicate = driver.completion(command, {"status": "error", "result": "again"})
    driver.state.apply(duplicate)
    assert decide(driver.state, duplicate, NOW, driver.new_id) == ([], [])


def test_late_duplicate_does_not_finish_a_reentered_step() -> None:
    driver = Driver(
        """
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.i: 0}
    next: [tick]
  - step: tick
    tool: {kind: noop}
    set: {ctx.i: "{{ ctx.i + 1 }}"}
    next:
      arcs:
        - {step: done, when: "{{ ctx.i >= 3 }}"}
        - {step: tick}
  - step: done
    tool: {kind: noop}
"""
    ).start()
    driver.answer(driver.outstanding[0])  # start
    first_tick = driver.outstanding[0]
    driver.answer(first_tick)
    assert driver.state.steps["tick"].runs == 2  # re-entered, second command in flight
    duplicate = driver.completion(first_tick)
    driver.state.apply(duplicate)
    assert decide(driver.state, duplicate, NOW, driver.new_id) == ([], [])


def test_fold_of_a_log_equals_the_state_built_event_by_event() -> None:
    driver = Driver(
        FAN_IN,
        respond=by_step({"start": {"go_a": True, "go_b": True, "go_c": True}}),
        pick=last_issued,
    )
    driver.run()
    folded = fold(driver.playbook, driver.state.execution_id, driver.log)
    assert snapshot(folded) == snapshot(driver.state)
    # Folding a prefix and applying the rest gives the same state too (the cache is optional).
    half = len(driver.log) // 2
    partial = fold(driver.playbook, driver.state.execution_id, driver.log[:half])
    for event in driver.log[half:]:
        partial.apply(event)
    assert snapshot(partial) == snapshot(driver.state)
    assert folded.event_count == len(driver.log)
    assert folded.last_event_id == max(e.event_id for e in driver.log)
