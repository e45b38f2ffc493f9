"""`spec.policy.admit`: a step whose admit rules say no is skipped and its branch ends."""

from __future__ import annotations

from flowtide.engine import events as ev

from .driver import Driver

ADMIT = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: admit}
workload: {enabled: %s}
workflow:
  - step: start
    tool: {kind: python, code: "result = 1"}
    next:
      spec: {mode: inclusive}
      arcs: [{step: gated}, {step: join}]
  - step: gated
    spec:
      policy:
        admit:
          mode: exclusive
          rules:
            - when: "{{ enabled }}"
              then: {allow: true}
            - else:
                then: {allow: false}
    tool: {kind: python, code: "result = 2"}
    next: [join]
  - step: join
    tool: {kind: python, code: "result = 3"}
"""


def test_admitted_step_runs() -> None:
    driver = Driver(ADMIT % "true").run()
    assert driver.state.steps["gated"].status == "completed"
    assert driver.state.status == "completed"


def test_refused_step_is_skipped_and_its_branch_ends() -> None:
    driver = Driver(ADMIT % "false").run()
    exit_event = next(e for e in driver.log if e.type == ev.STEP_EXIT and e.step == "gated")
    assert exit_event.status == "skipped"
    assert exit_event.payload == {"next": [], "reason": "not admitted"}
    assert not [c for c in driver.issued if c.step == "gated"]
    # the fan-in still runs once: a skipped upstream counts as settled
    assert driver.state.steps["join"].runs == 1
    assert driver.state.status == "completed"
