"""Policy rules: which action follows a task's outcome. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowtide.playbook.model import Policy, Rule
from flowtide.playbook.template import render, truthy

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
    """Seconds to wait before attempt `attempt + 1` under `rule`'s backoff."""
    base = max(0.0, rule.delay)
    if rule.backoff == "exponential":
        delay = base * (2 ** (attempt - 1))
    elif rule.backoff == "linear":
        delay = base * attempt
    elif rule.backoff == "none":
        delay = 0.0
    else:
        delay = base
    return float(min(delay, rule.max_delay))
