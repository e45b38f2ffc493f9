"""One way to start an execution and one way to run a command, whatever runs them."""

from __future__ import annotations

import itertools

import pytest

from flowtide.engine import events as ev
from flowtide.engine.events import Command
from flowtide.engine.start import start_execution
from flowtide.engine.state import ExecutionState
from flowtide.errors import TemplateError
from flowtide.playbook.loader import parse_playbook
from flowtide.runtime.command import run_command
from flowtide.runtime.pipeline import StepRunner

PLAYBOOK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: starts, path: tests/starts}
workload:
  n: 2
  label: "run {{ execution_id }} of {{ n }}"
  nested: {a: 1, b: 2}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'doubled': n * 2}", input: {n: "{{ n }}"}}
    next: [{step: each}]
  - step: each
    loop: {in: "{{ [10, 20] }}", iterator: item}
    tool: {kind: python, code: "result = item + 1", input: {item: "{{ item }}"}}
    next: [{step: end}]
  - step: end
    tool: {kind: noop}
"""


def _ids(start: int = 100):
    counter = itertools.count(start)
    return lambda: next(counter)


def test_a_start_renders_the_workload_and_makes_the_first_event() -> None:
    playbook = parse_playbook(PLAYBOOK, "starts.yaml")
    start = start_execution(
        playbook, {"n": 3, "nested": {"b": 5}}, next_id=_ids(), now=1.5, catalog_version=4
    )
    assert start.execution_id == 100
    assert start.workload == {"n": 3, "label": "run 100 of 3", "nested": {"a": 1, "b": 5}}
    [first] = start.events
    assert (first.event_id, first.type, first.time) == (101, ev.PLAYBOOK_INITIALIZED, 1.5)
    assert first.payload == {
        "workload": start.workload,
        "playbook": {
            "name": "starts",
            "path": "tests/starts",
            "version": None,
            "file": playbook.file,
        },
        "parent_execution_id": None,
        "parent_command_id": None,
    }
    assert start.columns() == {
        "playbook_path": "tests/starts",
        "playbook_version": 4,
        "playbook_file": playbook.file,
        "playbook_text": PLAYBOOK,
        "workload": start.workload,
        "parent_execution_id": None,
        "parent_command_id": None,
        "created": 1.5,
        "secrets": frozenset(),
        "deadline": None,
        "sla": None,
    }


def test_a_start_carries_its_timeout_and_sla_as_instants() -> None:
    text = PLAYBOOK.replace("workflow:", "timeout: 90s\nsla: 1m\nworkflow:", 1)
    playbook = parse_playbook(text, "starts.yaml")
    assert (playbook.timeout, playbook.sla) == (90.0, 60.0)
    start = start_execution(playbook, {}, next_id=iter(range(10, 99)).__next__, now=100.0)
    assert (start.columns()["deadline"], start.columns()["sla"]) == (190.0, 160.0)


def test_a_sub_playbook_start_inherits_the_parents_secrets_and_names_its_pool() -> None:
    playbook = parse_playbook(PLAYBOOK, "starts.yaml")
    start = start_execution(
        playbook,
        {},
        next_id=_ids(),
        now=2.0,
        parent_execution_id=7,
        parent_command_id=8,
        inherited=frozenset({"s3cret"}),
        pool="gpu",
    )
    given, first = start.events
    assert (given.type, given.event_id, first.event_id) == (ev.SECRETS_ADDED, 102, 101)
    assert given.payload == {"values": ["s3cret"], "parent_execution_id": 7}
    assert first.payload is not None and first.payload["pool"] == "gpu"
    assert (first.payload["parent_execution_id"], first.payload["parent_command_id"]) == (7, 8)
    assert start.columns()["secrets"] == frozenset({"s3cret"})


def test_a_workload_that_does_not_render_starts_nothing() -> None:
    playbook = parse_playbook(PLAYBOOK, "starts.yaml")
    with pytest.raises(TemplateError):
        start_execution(playbook, {"label": "{{ nope }}"}, next_id=_ids(), now=0.0)


def test_run_command_reports_a_step_and_a_loop_iteration() -> None:
    playbook = parse_playbook(PLAYBOOK, "starts.yaml")
    state = ExecutionState(playbook, 100)
    start = start_execution(playbook, {}, next_id=_ids(), now=0.0)
    for event in start.events:
        state.apply(event)
    runner = StepRunner(playbook)
    command = Command(5, 100, "start", issued_event_id=50)
    events = run_command(
        runner, command, state.context(), state.ctx, next_id=_ids(200), worker_id="w"
    )
    assert [e.type for e in events] == [ev.COMMAND_STARTED, ev.CALL_DONE, ev.COMMAND_COMPLETED]
    assert all(e.worker_id == "w" and e.parent_event_id == 50 for e in events)
    assert events[-1].payload is not None and events[-1].payload["result"] == {"doubled": 4}

    iteration = Command(6, 100, "each", loop_instance=0, loop_index=1, issued_event_id=51)
    events = run_command(
        runner,
        iteration,
        state.context(),
        state.ctx,
        next_id=_ids(300),
        worker_id="w",
        iterator="item",
        element=20,
    )
    done = events[-1]
    assert done.payload is not None
    assert (done.payload["result"], done.payload["loop_index"]) == (21, 1)


def test_run_command_turns_a_runtime_bug_into_a_failed_command() -> None:
    playbook = parse_playbook(PLAYBOOK, "starts.yaml")
    runner = StepRunner(playbook)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("bug")

    runner.run = broken  # type: ignore[method-assign]
    events = run_command(runner, Command(5, 100, "start"), {}, {}, next_id=_ids(), worker_id="w")
    assert [e.type for e in events] == [ev.COMMAND_STARTED, ev.COMMAND_FAILED]
    assert events[-1].error == {"kind": "internal_error", "message": "RuntimeError: bug"}


def test_the_server_does_not_load_the_embedded_runtime() -> None:
    import subprocess
    import sys

    code = (
        "import sys, flowtide.server.app; "
        "print(sorted(m for m in sys.modules if m == 'flowtide.runtime.local'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
