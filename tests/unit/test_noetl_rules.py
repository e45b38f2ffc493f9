"""NoETL's template rules, checked against its source (cited where each rule is made):
`execution_id` as a digit string (`flowtide.engine.context.execution_ids`)."""

from __future__ import annotations

import itertools

from flowtide.engine.context import base_context
from flowtide.engine.start import start_execution
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.template import render


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
