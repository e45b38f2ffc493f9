"""A tool's `retry:` shorthand is the policy rule it stands for, checked like every key,
and retries a failing step for real."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

import flowtide
from flowtide.errors import PlaybookError
from flowtide.playbook import parse_playbook
from flowtide.playbook.model import Policy, Rule


def _playbook(tool_extra: str) -> str:
    return dedent(
        """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: retry, path: tests/retry}
        workflow:
          - step: start
            tool:
              kind: python
              code: "result = 1"
        """
    ) + "".join(f"      {line}\n" for line in tool_extra.splitlines())


def _policy(tool_extra: str) -> Policy | None:
    return parse_playbook(_playbook(tool_extra), "pb.yaml").steps["start"].tasks[0].policy


def test_the_shorthand_is_its_rule() -> None:
    policy = _policy("retry: {attempts: 4, backoff: 2s, max_backoff: 1m, on: [timeout, crashed]}")
    assert policy == Policy(
        (
            Rule(
                when="{{ output.status == 'error' and (output.error.kind in ['timeout', 'crashed']) }}",
                is_else=False,
                do="retry",
                attempts=4,
                backoff="exponential",
                delay=2.0,
                max_delay=60.0,
            ),
        )
    )
    assert _policy("retry: 5") == Policy(
        (
            Rule(
                when="{{ output.status == 'error' and output.error.retryable }}",
                is_else=False,
                do="retry",
                attempts=5,
                backoff="exponential",
                delay=1.0,
                max_delay=60.0,
            ),
        )
    )


def test_the_older_form_reads_as_before() -> None:
    (rule,) = _policy("retry: {max_attempts: 2, retry_on_status: [503], backoff_seconds: 3}").rules
    assert (rule.attempts, rule.backoff, rule.delay) == (2, "fixed", 3.0)
    assert "http_status in [503]" in rule.when


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("retry: {atempts: 3}", "did you mean 'attempts'"),
        ("retry: {attempts: 3, backoff: soon}", "tool.retry.backoff"),
        ("retry: {attempts: 0}", "from 1 to 100"),
        ("retry: {on: timeout}", "list of error kinds"),
        ("retry: [3]", "mapping or a number"),
        (
            "retry: 3\nspec: {policy: {rules: [{when: true, then: {do: continue}}]}}",
            "both decide",
        ),
    ],
)
def test_a_bad_retry_is_refused_naming_its_field(extra: str, says: str) -> None:
    with pytest.raises(PlaybookError) as caught:
        _policy(extra)
    assert says in str(caught.value)
    assert "pb.yaml:" in str(caught.value)


def test_it_retries_a_failing_step(tmp_path: Path) -> None:
    counter = tmp_path / "tries"
    playbook = tmp_path / "flaky.yaml"
    playbook.write_text(
        dedent(
            f"""\
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {{name: flaky, path: tests/flaky}}
            workflow:
              - step: start
                tool:
                  kind: python
                  retry: {{attempts: 3, backoff: 10ms, on: [python_error]}}
                  code: |
                    from pathlib import Path
                    p = Path({str(counter)!r})
                    n = int(p.read_text()) + 1 if p.exists() else 1
                    p.write_text(str(n))
                    if n < 3:
                        raise RuntimeError(f"try {{n}} fails")
                    result = {{"tries": n}}
            """
        )
    )
    doc = flowtide.run(playbook, home=tmp_path / "home")
    assert doc["status"] == "completed", doc["error"]
    assert doc["result"] == {"tries": 3}
    assert doc["steps"]["start"]["attempts"] == 3


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        # `on` and `retry_on_status` end up in the rule's template text: only names and
        # numbers get there, never a string that could close a literal or a block.
        ("retry: {on: [\"x'] or True or ['\"]}", "tool.retry.on"),
        ("retry: {on: ['}} {{ 7*7 }}']}", "tool.retry.on"),
        ("retry: {on: ['a\\\\']}", "tool.retry.on"),
        ("retry: {retry_on_status: 'abc'}", "tool.retry.retry_on_status"),
        ("retry: {retry_on_status: [.nan]}", "tool.retry.retry_on_status"),
        ("retry: {retry_on_status: {a: 1}}", "tool.retry.retry_on_status"),
        ("retry: {retry_on_status: [99]}", "tool.retry.retry_on_status"),
        ("retry: {backoff_seconds: 1e300}", "tool.retry.backoff_seconds"),
        ("retry: {backoff_seconds: .nan}", "tool.retry.backoff_seconds"),
        ("retry: {initial_delay: -3}", "tool.retry.initial_delay"),
    ],
)
def test_retry_values_that_would_be_pasted_into_its_template_are_checked(
    extra: str, field: str
) -> None:
    with pytest.raises(PlaybookError) as caught:
        _policy(extra)
    assert f"field '{field}'" in str(caught.value)


def test_a_rules_extreme_backoff_waits_the_longest_it_may() -> None:
    from flowtide.engine.policy import retry_delay

    def rule(delay: float, max_delay: float) -> Rule:
        return Rule(
            when=True,
            is_else=False,
            do="retry",
            attempts=5000,
            backoff="exponential",
            delay=delay,
            max_delay=max_delay,
        )

    assert retry_delay(rule(1.0, 60.0), 1100) == 60.0  # 2**1099 was an OverflowError
    assert retry_delay(rule(1e300, 1e300), 3) == 366 * 86400.0
    assert retry_delay(rule(float("nan"), 60.0), 2) == 0.0
    assert retry_delay(rule(-1.0, -5.0), 2) == 0.0
    assert retry_delay(rule(2.0, 60.0), 3) == 8.0
