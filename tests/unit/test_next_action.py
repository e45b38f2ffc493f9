"""What follows a call: `next_action` (flowtide.engine.policy), the whole decision a step's
runner carries out after each attempt of a task, tabulated as rules × outcomes × attempts
→ actions. Pure: no runner, no tool, no clock."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flowtide.engine.context import envelope
from flowtide.engine.policy import Action, next_action
from flowtide.errors import TemplateError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Policy, Rule

OK = envelope("ok", {"more": True, "n": 3}, None, 1, 0.0)
ERROR = envelope("error", None, {"kind": "rate_limit", "retryable": True}, 1, 0.0)


def policy_of(yaml_rules: str) -> Policy | None:
    """The policy the loader builds from a `rules:` block (None for no block)."""
    if not yaml_rules.strip():
        return None
    text = "workflow:\n  - step: s\n    tool:\n      kind: noop\n      spec:\n        policy:\n          rules:\n"
    text += "".join(f"            {line}\n" for line in yaml_rules.strip("\n").splitlines())
    return parse_playbook(text).steps["s"].tasks[0].policy


def decide(rules: str, output: dict[str, Any], attempt: int = 1, **kwargs: Any) -> Action:
    return next_action(policy_of(rules), output, {"output": output}, attempt, step="s", **kwargs)


NONE = ""
RETRY_ERRORS = """
- when: "{{ output.status == 'error' }}"
  then: {do: retry, attempts: 3, delay: 0.5, set: {ctx.gave_up: true}}
"""
RETRY_ALWAYS = """
- when: true
  then: {do: retry, attempts: 2, backoff: exponential, delay: 1, set: {ctx.seen: 1}}
"""
JUMP = """
- when: "{{ output.status == 'ok' and output.data.more }}"
  then: {do: jump, to: fetch, set: {iter.page: 2}}
"""
BREAK = """
- else:
    then: {do: break, set: {ctx.done: true}}
"""
FAIL_ON_OK = """
- when: "{{ output.status == 'ok' }}"
  then: {do: fail}
"""
CONTINUE_ON_ERROR = """
- when: "{{ output.status == 'error' }}"
  then: {do: continue}
"""


@pytest.mark.parametrize(
    ("rules", "output", "attempt", "expected"),
    [
        # no policy: NoETL's defaults
        (NONE, OK, 1, Action("continue")),
        (NONE, ERROR, 1, Action("fail")),
        (NONE, ERROR, 5, Action("fail")),
        # a retry rule: errors again while attempts remain, then the error fails the step
        # with the rule's `set`
        (RETRY_ERRORS, ERROR, 1, Action("retry", delay=0.5)),
        (RETRY_ERRORS, ERROR, 2, Action("retry", delay=0.5)),
        (RETRY_ERRORS, ERROR, 3, Action("fail", set={"ctx.gave_up": True})),
        (RETRY_ERRORS, ERROR, 4, Action("fail", set={"ctx.gave_up": True})),
        # ...which does not match a success: the default
        (RETRY_ERRORS, OK, 1, Action("continue")),
        # a retry rule matching a success: nothing to retry, its `set` applies
        (RETRY_ALWAYS, OK, 1, Action("continue", set={"ctx.seen": 1})),
        (RETRY_ALWAYS, OK, 2, Action("continue", set={"ctx.seen": 1})),
        # the backoff's delay grows with the attempt
        (RETRY_ALWAYS, ERROR, 1, Action("retry", delay=1.0)),
        (RETRY_ALWAYS, ERROR, 2, Action("fail", set={"ctx.seen": 1})),
        # jump: to a task of the pipeline or a step, with the rule's `set`
        (JUMP, OK, 1, Action("jump", to="fetch", set={"iter.page": 2})),
        (JUMP, ERROR, 1, Action("fail")),  # no match: the default
        # break and fail whatever the status, continue past an error
        (BREAK, OK, 1, Action("break", set={"ctx.done": True})),
        (BREAK, ERROR, 3, Action("break", set={"ctx.done": True})),
        (FAIL_ON_OK, OK, 1, Action("fail")),
        (FAIL_ON_OK, ERROR, 1, Action("fail")),
        (CONTINUE_ON_ERROR, ERROR, 1, Action("continue")),
        (CONTINUE_ON_ERROR, ERROR, 7, Action("continue")),
    ],
)
def test_what_follows_a_call(
    rules: str, output: dict[str, Any], attempt: int, expected: Action
) -> None:
    assert decide(rules, output, attempt) == expected


def test_a_cancelled_execution_is_not_retried() -> None:
    asked: list[int] = []

    def cancelled() -> bool:
        asked.append(1)
        return True

    action = decide(RETRY_ERRORS, ERROR, 1, cancelled=cancelled)
    assert action == Action("fail", set={"ctx.gave_up": True})
    assert asked == [1]
    assert decide(RETRY_ERRORS, ERROR, 1, cancelled=lambda: False) == Action("retry", delay=0.5)


@pytest.mark.parametrize(
    ("rules", "output", "attempt"),
    [
        (NONE, OK, 1),
        (NONE, ERROR, 1),
        (RETRY_ERRORS, OK, 1),
        (RETRY_ERRORS, ERROR, 3),
        (BREAK, ERROR, 1),
    ],
)
def test_cancellation_is_asked_only_before_a_retry(
    rules: str, output: dict[str, Any], attempt: int
) -> None:
    # On a worker, asking is a call to the server: never for a call that is not retried.
    def cancelled() -> bool:
        raise AssertionError("asked")

    decide(rules, output, attempt, cancelled=cancelled)


@pytest.mark.parametrize("output", [OK, ERROR])
def test_a_when_that_fails_to_render_fails_the_step_without_a_set(output: dict[str, Any]) -> None:
    rules = """
- when: "{{ output.nothing.deeper }}"
  then: {do: continue, set: {ctx.x: 1}}
"""
    action = decide(rules, output)
    assert (action.do, action.set, action.to, action.delay) == ("fail", {}, None, 0.0)
    assert isinstance(action.broken, TemplateError)
    assert action.broken.step == "s" and action.broken.missing == "nothing"


def test_rules_are_judged_against_the_context_given() -> None:
    rules = """
- when: "{{ output.data.n >= limit }}"
  then: {do: break}
"""
    policy = policy_of(rules)
    assert next_action(policy, OK, {"output": OK, "limit": 3}, 1, step="s").do == "break"
    assert next_action(policy, OK, {"output": OK, "limit": 4}, 1, step="s").do == "continue"


def test_a_jump_without_a_target_names_none() -> None:
    # The loader refuses it (`'do: jump' needs 'to'`); the runner leaves the step for "".
    policy = Policy((Rule(when=True, is_else=False, do="jump"),))
    assert next_action(policy, OK, {"output": OK}, 1, step="s") == Action("jump")


def test_a_rule_made_in_code_with_an_unknown_action_goes_on() -> None:
    policy = Policy((Rule(when=True, is_else=False, do="skip"),))
    assert next_action(policy, OK, {"output": OK}, 1, step="s") == Action("continue")


def test_an_action_is_a_value() -> None:
    action = Action("retry", delay=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.do = "fail"  # type: ignore[misc]
    assert action == Action("retry", delay=1.0) and action != Action("retry", delay=2.0)
