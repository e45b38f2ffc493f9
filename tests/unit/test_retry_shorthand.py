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
