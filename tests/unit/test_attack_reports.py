"""A worker's report ends the iteration of the command it holds, whatever it says of the
step or the loop index: the engine takes them from the issued command."""

from __future__ import annotations

from dataclasses import replace

from flowtide.engine import events as ev

from .driver import Driver

LOOP = """
workload: {items: [10, 20, 30]}
workflow:
  - step: start
    tool: {kind: noop}
    next: [each]
  - step: each
    loop: {in: "{{ items }}", iterator: item, spec: {mode: parallel, max_in_flight: 3}}
    tool: {kind: noop}
    next: [after]
  - step: after
    tool: {kind: noop}
"""


def _started() -> Driver:
    driver = Driver(LOOP).start()
    driver.answer(driver.outstanding[0])  # start
    assert [c.loop_index for c in driver.outstanding] == [0, 1, 2]
    return driver


def test_a_report_without_its_loop_index_ends_one_iteration_not_the_loop() -> None:
    driver = _started()
    command = driver.outstanding.pop(0)
    event = driver.completion(command)
    payload = dict(event.payload or {})
    del payload["loop_index"], payload["loop_instance"]
    driver.post(replace(event, payload=payload))
    assert driver.count(ev.STEP_EXIT, "each") == 0
    assert driver.state.steps["each"].status == "running"
    assert driver.count(ev.LOOP_ITEM, "each") == 1
    driver.run()
    assert driver.entered() == ["start", "each", "after"]
    assert driver.state.steps["each"].result["stats"]["total"] == 3  # type: ignore[index]


def test_a_report_naming_another_step_ends_its_own_commands_iteration() -> None:
    driver = _started()
    command = driver.outstanding.pop(0)
    driver.post(replace(driver.completion(command), step="start"))
    assert driver.count(ev.LOOP_ITEM, "each") == 1
    assert driver.count(ev.LOOP_ITEM, "start") == 0
    driver.run()
    assert driver.entered() == ["start", "each", "after"]
    assert driver.state.status == "completed"
