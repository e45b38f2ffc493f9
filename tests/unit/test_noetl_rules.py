"""NoETL's template rules, checked against its source (cited where each rule is made):
`execution_id` as a digit string (`flowtide.engine.context.execution_ids`), what a task
of a pipeline sees of the calls before it, and what a task's policy sees of its own
result (`flowtide.runtime.rendering.pipeline_locals`, `own_result`)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from flowtide.engine.context import base_context
from flowtide.engine.start import start_execution
from flowtide.errors import PlaybookErrors
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.template import render
from flowtide.runtime.pipeline import StepRunner


def _ids(start: int = 384010860617043968):
    counter = itertools.count(start)
    return lambda: next(counter)


def test_execution_id_and_job_are_digit_strings() -> None:
    ctx = base_context(384010860617043968, {}, [], {}, {})
    assert render("{{ execution_id }}", ctx) == "384010860617043968"
    assert render("{{ execution_id[:8] }}", ctx) == "38401086"
    assert render("{{ job.id }}|{{ job.uuid }}|{{ job.execution_id }}", ctx) == (
        "384010860617043968|384010860617043968|384010860617043968"
    )


def test_execution_id_keeps_its_numeric_uses() -> None:
    ctx = base_context(42, {}, [], {}, {})
    # pasted into SQL it is the same digits, quoted or not (BIGINT or TEXT columns)
    assert render("VALUES ({{ execution_id }}, '{{ execution_id }}')", ctx) == "VALUES (42, '42')"
    assert render("{{ execution_id | int + 1 }}", ctx) == 43
    assert render("{{ execution_id == job.execution_id }}", ctx) is True


def test_the_workload_sees_the_same_execution_id() -> None:
    playbook = parse_playbook(
        """
workload: {batch: "{{ execution_id[:4] }}", parent: "{{ job.execution_id }}"}
workflow: [{step: start, tool: {kind: noop}}]
""",
        "w.yaml",
    )
    start = start_execution(playbook, {}, next_id=_ids(), now=0.0)
    assert start.workload == {"batch": "3840", "parent": "384010860617043968"}


PIPELINE = """
workflow:
  - step: start
    tool:
      - name: first
        kind: python
        input: {seen: "{{ output is defined }}"}
        code: "result = {'n': 2, 'first_saw_output': seen}"
      - name: second
        kind: python
        input:
          previous: "{{ output.data }}"
          status: "{{ output.status }}"
          prev: "{{ _prev }}"
        code: "result = {'previous': previous, 'status': status, 'prev': prev}"
      - name: third
        kind: python
        input: {n: "{{ output.data.previous.n }}", first: "{{ first.n }}"}
        code: "result = {'n': n, 'first': first}"
"""


def _run(text: str, step: str = "start", **kwargs: Any) -> Any:
    playbook = parse_playbook(text, "p.yaml")
    base = base_context(7, {}, list(playbook.steps), {}, {})
    return StepRunner(playbook, sleep=lambda s: None).run(
        playbook.steps[step], base, {}, execution_id=7, **kwargs
    )


def test_a_later_task_sees_the_previous_calls_output_envelope() -> None:
    outcome = _run(PIPELINE)
    assert outcome.status == "ok", outcome.error
    tasks = outcome.tasks or {}
    # nothing before the first call: `output` is not defined there
    assert tasks["first"] == {"n": 2, "first_saw_output": False}
    assert tasks["second"] == {
        "previous": {"n": 2, "first_saw_output": False},
        "status": "ok",
        "prev": {"n": 2, "first_saw_output": False},
    }
    assert tasks["third"] == {"n": 2, "first": 2}


def test_a_retry_sees_its_own_failed_attempt_as_output() -> None:
    text = """
workflow:
  - step: start
    tool:
      - name: flaky
        kind: python
        input: {before: "{{ output.status if output is defined else 'none' }}"}
        code: |
          if before == 'none':
              raise RuntimeError('first attempt fails')
          result = {'before': before}
        spec:
          policy:
            rules:
              - when: "{{ output.status == 'error' }}"
                then: {do: retry, attempts: 2}
"""
    outcome = _run(text)
    assert outcome.status == "ok", outcome.error
    assert outcome.result == {"before": "error"}


def test_a_policy_set_reads_the_steps_own_result_by_the_steps_name() -> None:
    text = """
workflow:
  - step: update_progress
    tool:
      kind: python
      code: "result = {'total_bytes_processed': 2048, 'should_continue': False}"
      spec:
        policy:
          rules:
            - else:
                then:
                  do: continue
                  set:
                    ctx.total_bytes_processed: "{{ update_progress.total_bytes_processed }}"
                    ctx.again: "{{ update_progress.should_continue }}"
"""
    outcome = _run(text, step="update_progress")
    assert outcome.status == "ok", outcome.error
    assert outcome.ctx == {"total_bytes_processed": 2048, "again": False}


def test_a_failed_call_does_not_bind_the_tasks_name() -> None:
    text = """
workflow:
  - step: check
    tool:
      kind: python
      code: "raise ValueError('no')"
      spec:
        policy:
          rules:
            - else:
                then:
                  do: continue
                  set: {ctx.ran: "{{ check | default('not run') }}"}
"""
    outcome = _run(text, step="check")
    assert outcome.ctx == {"ran": "not run"}


def test_an_unused_workbook_action_without_path_is_ignored() -> None:
    playbook = parse_playbook(
        """
workbook:
  - {name: run_child, tool: {kind: playbook}}
  - {name: double, tool: {kind: python, code: "result = 2"}}
workflow:
  - {step: start, tool: {kind: workbook, name: double}}
""",
        "w.yaml",
    )
    assert list(playbook.workbook) == ["double"]


def test_a_used_workbook_action_without_path_is_an_error_at_its_line() -> None:
    text = """workbook:
  - name: run_child
    tool:
      kind: playbook
workflow:
  - {step: start, tool: {kind: workbook, name: run_child}}
"""
    with pytest.raises(PlaybookErrors) as caught:
        parse_playbook(text, "w.yaml")
    [error] = caught.value.errors
    assert (error.file, error.line, error.field) == ("w.yaml", 3, "tool.path")
    assert "playbook tool requires 'path'" in str(error)


def test_policy_rules_see_the_result_as_output_response() -> None:
    text = """
workflow:
  - step: start
    tool:
      kind: python
      code: "result = {'users': [{'id': 5}]}"
      spec:
        policy:
          rules:
            - else: {then: {do: continue, set: {ctx.first: "{{ output.response.users[0].id }}"}}}
"""
    assert _run(text).ctx == {"first": 5}


def test_a_tasks_rules_and_set_see_event_name_as_the_guide_says() -> None:
    """`event.name` (call.done | call.error) and `event.step` in a task's policy rules,
    their `then.set` and the task's `set`, as in a step's `set` and arcs."""
    text = """
workflow:
  - step: check
    tool:
      - name: good
        kind: python
        code: "result = 1"
        set: {ctx.good_set: "{{ event.name }}"}
        spec:
          policy:
            rules:
              - when: "{{ event.name == 'call.done' }}"
                then: {do: continue, set: {ctx.good: "{{ event.name }}/{{ event.step }}"}}
      - name: bad
        kind: python
        code: "raise ValueError('no')"
        spec:
          policy:
            rules:
              - when: "{{ event.name == 'call.error' }}"
                then: {do: continue, set: {ctx.bad: "{{ event.name }}"}}
"""
    outcome = _run(text, step="check")
    assert outcome.action == "continue", outcome.error
    assert outcome.ctx == {"good_set": "call.done", "good": "call.done/check", "bad": "call.error"}


def test_a_task_named_event_still_reads_its_own_result_by_its_name() -> None:
    text = """
workflow:
  - step: start
    tool:
      name: event
      kind: python
      code: "result = {'x': 1}"
      spec:
        policy:
          rules:
            - when: "{{ event.x == 1 }}"
              then: {do: continue, set: {ctx.x: "{{ event.x }}"}}
"""
    outcome = _run(text)
    assert outcome.status == "ok", outcome.error
    assert outcome.ctx == {"x": 1}
