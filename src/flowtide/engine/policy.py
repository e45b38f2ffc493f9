"""Policy rules: which action follows a task's outcome. Pure.

`next_action` is the whole decision a runner makes after one call of a task (retry,
continue, jump, break or fail, and which `then.set` applies): an `Action` the runner
carries out (`flowtide.runtime.pipeline`), never a rule it reads itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from flowtide.errors import TemplateError
from flowtide.playbook.model import Policy, Rule
from flowtide.playbook.template import render, truthy

#: What follows a call: call the task again, go on to the next task, go to a task of
#: the pipeline or leave the step for another (`jump`), leave the loop, fail the step.
Do = Literal["continue", "retry", "jump", "break", "fail"]

_DEFAULT_OK = Rule(when=None, is_else=True, do="continue")
_DEFAULT_ERROR = Rule(when=None, is_else=True, do="fail")


def select_rule(
    policy: Policy | None, output: Mapping[str, Any], context: Mapping[str, Any], *, step: str
) -> Rule:
    """The first rule whose `when` holds (or the `else` rule); NoETL defaults otherwise:
    ok -> continue, error -> fail.

    Raises:
        TemplateError: a `when` failed to render.
    """
    if policy is not None:
        for rule in policy.rules:
            if rule.is_else:
                return rule
            when = rule.when
            if isinstance(when, bool):
                if when:
                    return rule
                continue
            if truthy(render(when, context, step=step, field="spec.policy.rules.when")):
                return rule
    return _DEFAULT_OK if output.get("status") == "ok" else _DEFAULT_ERROR


def retry_delay(rule: Rule, attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1` under `rule`'s backoff, from 0 to
    `rule.max_delay` (itself at most 366 days): a rule's extreme numbers (a delay of
    1e300, a negative or NaN one, attempt 2000 of an exponential backoff) wait the
    longest they may instead of failing the run with an OverflowError."""
    base = _seconds(rule.delay, 0.0)
    cap = _seconds(rule.max_delay, _MAX_DELAY)
    if rule.backoff == "exponential":
        delay = base * (2.0 ** min(max(attempt - 1, 0), 64))
    elif rule.backoff == "linear":
        delay = base * max(attempt, 0)
    elif rule.backoff == "none":
        delay = 0.0
    else:
        delay = base
    return float(min(delay, cap))


#: The longest wait between two attempts (as for a duration in a playbook).
_MAX_DELAY: Final = 366 * 86400.0


def _seconds(value: float, default: float) -> float:
    """`value` as a wait from 0 to `_MAX_DELAY` (`default` for NaN)."""
    if not isinstance(value, int | float) or math.isnan(value):
        return default
    return min(max(float(value), 0.0), _MAX_DELAY)


@dataclass(frozen=True)
class Action:
    """What follows one call of a task, as the policy decided it."""

    do: Do
    #: `retry`: seconds to wait before the next attempt.
    delay: float = 0.0
    #: `jump`: the task of the pipeline, or the step, to go to (None when the rule names
    #: none).
    to: str | None = None
    #: The chosen rule's `then.set`, templates as written: the runner renders it against
    #: the scope the rule was judged in, before the task's own `set`. Empty on a retry.
    set: Mapping[str, Any] = field(default_factory=dict)
    #: A rule's `when` that failed to render: the call's outcome becomes this error when it
    #: was a success, and the step fails.
    broken: TemplateError | None = None


def next_action(
    policy: Policy | None,
    output: Mapping[str, Any],
    context: Mapping[str, Any],
    attempt: int,
    *,
    step: str,
    cancelled: Callable[[], bool] | None = None,
) -> Action:
    """What follows attempt `attempt` (1 for the first call) of a task whose `output`
    envelope is judged by `policy`'s rules (`select_rule`, against `context`).

    A `retry` rule retries an error while attempts remain and the execution is not being
    cancelled (`cancelled` is asked only then: it may be a call to the server), then
    fails the step with the error; a `retry` rule matching a success continues. A `when`
    that fails to render fails the step (`Action.broken`), with no rule's `set`.
    """
    try:
        rule = select_rule(policy, output, context, step=step)
    except TemplateError as exc:
        return Action("fail", broken=exc)
    if rule is _DEFAULT_OK:  # the common case (a loop's items), made once
        return _CONTINUE
    if rule is _DEFAULT_ERROR:
        return _FAIL
    if rule.do == "retry":
        if output.get("status") == "ok":
            return Action("continue", set=rule.set)  # a success: nothing to retry
        if attempt < rule.attempts and not (cancelled is not None and cancelled()):
            return Action("retry", delay=retry_delay(rule, attempt))
        return Action("fail", set=rule.set)  # retries exhausted: the error stands
    return Action(_do(rule.do), to=rule.to, set=rule.set)


_CONTINUE = Action("continue")
_FAIL = Action("fail")
_FOLLOWS: dict[str, Do] = {"continue": "continue", "jump": "jump", "break": "break", "fail": "fail"}


def _do(name: str) -> Do:
    # The loader refuses any other name (`model.ACTIONS`); a rule made in code with one
    # goes on to the next task, as the runner always did.
    return _FOLLOWS.get(name, "continue")
