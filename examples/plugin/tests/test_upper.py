"""The example plugin, installed (`pip install -e examples/plugin`): flowtide finds
`kind: upper` through its entry point, checks its fields with positions, and runs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import flowtide

PLAYBOOK = Path(__file__).resolve().parents[1] / "upper.yaml"


def errors_of(text: str) -> list[str]:
    with pytest.raises(flowtide.PlaybookError) as info:
        flowtide.parse_playbook(textwrap.dedent(text), file="pb.yaml")
    return [e.render() for e in getattr(info.value, "errors", [info.value])]


def test_the_example_playbook_runs(tmp_path: Path) -> None:
    doc = flowtide.run(PLAYBOOK, home=tmp_path)
    assert doc["status"] == "completed", doc["error"]
    assert doc["result"] == {"text": "Hello World Hello World", "length": 23}


def test_templates_are_rendered_before_the_runner_sees_them(tmp_path: Path) -> None:
    doc = flowtide.run(PLAYBOOK, workload={"greeting": "good morning"}, home=tmp_path)
    assert doc["result"]["text"] == "Good Morning Good Morning"


def test_the_fields_are_checked_with_their_positions() -> None:
    assert errors_of(
        """\
        workflow:
          - step: start
            tool:
              kind: upper
              txt: hello
              case: uper
              repeat: 50
        """
    ) == [
        "pb.yaml:3:5: step 'start', field 'tool.text': upper tool requires 'text'",
        "pb.yaml:5:7: step 'start', field 'tool.txt': upper tool has no field 'txt'; "
        "did you mean 'text'? (expected text | case | repeat)",
        "pb.yaml:6:7: step 'start', field 'tool.case': unsupported case 'uper'; "
        "did you mean 'upper'? (expected upper | lower | title)",
        "pb.yaml:7:7: step 'start', field 'tool.repeat': upper 'repeat' must be between "
        "1 and 10, not 50 (expected 1..10)",
    ]


def test_a_field_of_the_wrong_type() -> None:
    (error,) = errors_of(
        """\
        workflow:
          - step: start
            tool: {kind: upper, text: [a, b]}
        """
    )
    assert error == (
        "pb.yaml:3:25: step 'start', field 'tool.text': upper 'text' must be a string, "
        "not list (expected the text (a template is rendered first))"
    )


def test_a_template_that_renders_to_a_list_fails_the_step(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "workload: {words: [a, b]}\n"
        "workflow:\n"
        "  - step: start\n"
        "    tool: {kind: upper, text: '{{ workload.words }}'}\n",
        encoding="utf-8",
    )
    doc = flowtide.run(bad, home=tmp_path / "home")
    assert doc["status"] == "failed"
    assert "upper 'text' must be a string, not list" in doc["steps"]["start"]["error"]["message"]


def test_validating_does_not_import_the_runner() -> None:
    code = (
        "import sys, flowtide\n"
        f"flowtide.load_playbook({str(PLAYBOOK)!r})\n"
        "print('flowtide_upper' in sys.modules, 'flowtide_upper.runner' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]
