"""Policy rules: `select_rule` and `retry_delay` (flowtide.engine.policy)."""

from __future__ import annotations

from typing import Any

import pytest

from flowtide.engine.context import envelope
from flowtide.engine.policy import retry_delay, select_rule
from flowtide.errors import TemplateError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Policy, Rule

OK = envelope("ok", {"rows": [{"n": 1}]}, None, 1, 0.0)
ERROR = envelope(
    "error", None, {"kind": "rate_limit", "retryable": True, "http_status": 429}, 2, 0.0
)


def scope(output: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"output": output, **extra}


def rule(when: Any = None, *, do: str = "continue", is_else: bool = False, **fields: Any) -> Rule:
    return Rule(when=when, is_else=is_else, do=do, **fields)


def policy_of(yaml_rules: str) -> Policy:
    """The policy the loader builds from a `rules:` block (keeps the tests on the DSL)."""
    text = "workflow:\n  - step: s\n    tool:\n      kind: noop\n      spec:\n        policy:\n          rules:\n"
    text += "".join(f"            {line}\n" for line in yaml_rules.strip("\n").splitlines())
    policy = parse_playbook(text).steps["s"].tasks[0].policy
    assert policy is not None
    return policy


# -- select_rule -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [None, Policy(())])
def test_defaults_continue_on_ok_and_fail_on_error(policy: Policy | None) -> None:
    assert select_rule(policy, OK, scope(OK), step="s").do == "continue"
    assert select_rule(policy, ERROR, scope(ERROR), step="s").do == "fail"


def test_default_applies_when_no_rule_matches() -> None:
    policy = Policy((rule("{{ output.status == 'error' }}", do="retry"),))
    assert select_rule(policy, OK, scope(OK), step="s").do == "continue"
    error_policy = Policy((rule("{{ output.status == 'ok' }}", do="break"),))
    assert select_rule(error_policy, ERROR, scope(ERROR), step="s").do == "fail"


def test_first_matching_rule_wins() -> None:
    policy = policy_of(
        """
- when: "{{ output.error.http_status == 500 }}"
  then: {do: fail}
- when: "{{ output.error.retryable }}"
  then: {do: retry, attempts: 5}
- when: "{{ output.status == 'error' }}"
  then: {do: continue}
"""
    )
    chosen = select_rule(policy, ERROR, scope(ERROR), step="s")
    assert (chosen.do, chosen.attempts) == ("retry", 5)


def test_rules_read_output_data_and_the_wider_context() -> None:
    policy = policy_of(
        """
- when: "{{ output.data.rows[0].n >= limit }}"
  then: {do: break}
"""
    )
    assert select_rule(policy, OK, scope(OK, limit=1), step="s").do == "break"
    assert select_rule(policy, OK, scope(OK, limit=2), step="s").do == "continue"


@pytest.mark.parametrize(("when", "expected"), [(True, "jump"), (False, "continue")])
def test_yaml_bool_when(when: bool, expected: str) -> None:
    policy = policy_of(
        f"""
- when: {str(when).lower()}
  then: {{do: jump, to: elsewhere}}
"""
    )
    assert policy.rules[0].when is when
    assert select_rule(policy, OK, scope(OK), step="s").do == expected


@pytest.mark.parametrize("when", ["{{ true }}", "{{ 'true' }}", "{{ 1 }}", "{{ [1] }}"])
def test_truthy_template_when(when: str) -> None:
    assert select_rule(Policy((rule(when, do="break"),)), OK, scope(OK), step="s").do == "break"


@pytest.mark.parametrize(
    "when", ["{{ false }}", "{{ 'false' }}", "{{ 'False' }}", "{{ 0 }}", "{{ none }}", "{{ '' }}"]
)
def test_falsy_template_when(when: str) -> None:
    assert select_rule(Policy((rule(when, do="break"),)), OK, scope(OK), step="s").do == "continue"


def test_else_rule_catches_the_rest() -> None:
    policy = policy_of(
        """
- when: "{{ output.status == 'error' }}"
  then: {do: retry}
- else:
    then: {do: continue, set: {ctx.seen: "{{ output.data }}"}}
"""
    )
    chosen = select_rule(policy, OK, scope(OK), step="s")
    assert chosen.is_else and chosen.do == "continue"
    assert chosen.set == {"ctx.seen": "{{ output.data }}"}
    assert select_rule(policy, ERROR, scope(ERROR), step="s").do == "retry"


def test_then_less_else_is_honoured() -> None:
    policy = policy_of(
        """
- else:
    do: break
    set: {ctx.loop_results: "{{ output.data }}"}
"""
    )
    chosen = select_rule(policy, ERROR, scope(ERROR), step="s")
    assert chosen.is_else and chosen.do == "break"
    assert chosen.set == {"ctx.loop_results": "{{ output.data }}"}


def test_else_wins_over_later_rules() -> None:
    policy = Policy((rule(do="break", is_else=True), rule(True, do="fail")))
    assert select_rule(policy, OK, scope(OK), step="s").do == "break"


def test_a_broken_when_raises_template_error_naming_the_step() -> None:
    policy = Policy((rule("{{ output.nothing.deeper }}", do="retry"),))
    with pytest.raises(TemplateError) as info:
        select_rule(policy, OK, scope(OK), step="fetch")
    assert info.value.step == "fetch"
    assert info.value.missing == "nothing"


def test_rule_fields_parsed_from_the_dsl() -> None:
    policy = policy_of(
        """
- when: "{{ output.status == 'error' }}"
  then: {do: retry, attempts: 4, backoff: exponential, delay: 0.5, max_delay: 3}
- when: "{{ output.data.more }}"
  then: {do: jump, to: fetch, set: {iter.page: "{{ (iter.page | int) + 1 }}"}}
"""
    )
    retry, jump = policy.rules
    assert (retry.do, retry.attempts, retry.backoff, retry.delay, retry.max_delay) == (
        "retry",
        4,
        "exponential",
        0.5,
        3.0,
    )
    assert (jump.do, jump.to, jump.set) == (
        "jump",
        "fetch",
        {"iter.page": "{{ (iter.page | int) + 1 }}"},
    )


def test_legacy_retry_block_becomes_a_retry_rule() -> None:
    text = """
workflow:
  - step: s
    tool:
      kind: http
      url: http://example.invalid
      retry: {max_attempts: 3, retry_on_status: [429, 503], backoff_seconds: 2}
"""
    policy = parse_playbook(text).steps["s"].tasks[0].policy
    assert policy is not None
    (only,) = policy.rules
    assert (only.do, only.attempts, only.delay) == ("retry", 3, 2.0)
    assert select_rule(policy, ERROR, scope(ERROR), step="s").do == "retry"
    other = envelope("error", None, {"kind": "server_error", "http_status": 500}, 1, 0.0)
    assert select_rule(policy, other, scope(other), step="s").do == "fail"


# -- retry_delay -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "delays"),
    [
        ("fixed", [0.5, 0.5, 0.5, 0.5]),
        ("linear", [0.5, 1.0, 1.5, 2.0]),
        ("exponential", [0.5, 1.0, 2.0, 4.0]),
        ("none", [0.0, 0.0, 0.0, 0.0]),
    ],
)
def test_retry_delay_by_backoff(backoff: str, delays: list[float]) -> None:
    r = rule(True, do="retry", backoff=backoff, delay=0.5)
    assert [retry_delay(r, attempt) for attempt in (1, 2, 3, 4)] == delays


def test_retry_delay_is_capped_by_max_delay() -> None:
    r = rule(True, do="retry", backoff="exponential", delay=1.0, max_delay=5.0)
    assert [retry_delay(r, attempt) for attempt in range(1, 7)] == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    linear = rule(True, do="retry", backoff="linear", delay=2.0, max_delay=5.0)
    assert retry_delay(linear, 10) == 5.0


def test_retry_delay_never_negative() -> None:
    assert retry_delay(rule(True, do="retry", delay=-3.0), 1) == 0.0


def test_retry_delay_defaults_from_the_dsl() -> None:
    (r,) = policy_of(
        """
- when: true
  then: {do: retry}
"""
    ).rules
    assert (r.attempts, r.backoff, r.delay, r.max_delay) == (3, "fixed", 0.0, 60.0)
    assert retry_delay(r, 1) == 0.0
