"""What the runtime does differently for a kind is said by its `ToolSpec`, never by its
name in the runtime: `call` (a kind without a runner, such as `playbook`), `delegate` (a
task that stands for another, such as `workbook`), `loop_input` (the loop's element in
the runner's input, such as `python`). A plugin's kind declaring the same hooks is run
the same way, through a real entry point (`importlib.metadata`)."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

import flowtide.runtime
from flowtide.engine.context import base_context
from flowtide.errors import ToolError
from flowtide.playbook.loader import parse_playbook
from flowtide.runtime.outcome import Outcome
from flowtide.runtime.pipeline import StepRunner
from flowtide.tools import kinds
from flowtide.tools.base import ToolContext
from flowtide.tools.spec import ToolSpec

HOOKS = """
from flowtide.tools.spec import ToolSpec


def shout(config, ctx):
    return {"said": str(config["message"]).upper(), "input": config.get("input"), "task": ctx.task}


def first_action(config, playbook):
    return playbook.workbook[sorted(playbook.workbook)[0]]


SHOUT = ToolSpec("shout", None, requires=("message",), call=shout, loop_input=True)
SHOUT_BY_NAME = ToolSpec("shout_by_name", None, requires=("message",), call="hooks_plugin:shout")
FIRST_ACTION = ToolSpec("first_action", None, delegate=first_action)
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Installs the kinds of `HOOKS` as a plugin would: a dist-info with entry points."""
    info = tmp_path / "hooks_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hooks-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[flowtide.tools]\n"
        "shout = hooks_plugin:SHOUT\n"
        "shout_by_name = hooks_plugin:SHOUT_BY_NAME\n"
        "first_action = hooks_plugin:FIRST_ACTION\n"
    )
    (tmp_path / "hooks_plugin.py").write_text(dedent(HOOKS))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    kinds.refresh()
    yield
    sys.modules.pop("hooks_plugin", None)
    monkeypatch.undo()
    kinds.refresh()


def run(text: str, step: str = "start", **kwargs: Any) -> Outcome:
    playbook = parse_playbook(dedent(text), "p.yaml")
    base = base_context(7, {"who": "world"}, list(playbook.steps), {}, {})
    return StepRunner(playbook, sleep=lambda s: None).run(
        playbook.steps[step], base, {}, execution_id=7, **kwargs
    )


# -- ToolSpec.invoke -----------------------------------------------------------------------


def _echo(config: dict[str, Any], ctx: Any) -> Any:
    return {"config": config, "step": ctx.step}


def test_invoke_calls_the_function_or_the_reference() -> None:
    ctx = ToolContext(execution_id=1, step="s")
    expected = {"config": {"a": 1}, "step": "s"}
    assert ToolSpec("e", None, call=_echo).invoke({"a": 1}, ctx) == expected
    assert ToolSpec("e", None, call=f"{__name__}:_echo").invoke({"a": 1}, ctx) == expected
    with pytest.raises(LookupError, match="kind 'e' has no call"):
        ToolSpec("e", None).invoke({}, ctx)
    with pytest.raises(LookupError, match="call 'flowtide.tools.spec:nothing' of kind 'e'"):
        ToolSpec("e", None, call="flowtide.tools.spec:nothing").invoke({}, ctx)


# -- the built-in kinds' hooks -------------------------------------------------------------


def test_the_playbook_kind_calls_the_runtimes_sub_playbook_runner(tmp_path: Path) -> None:
    spec = kinds.find("playbook")
    assert spec is not None and spec.runner is None and spec.call is not None
    calls: list[dict[str, Any]] = []

    def run_playbook(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return {"child": "done"}

    ctx = ToolContext(execution_id=9, step="s", base_dir=tmp_path, run_playbook=run_playbook)
    config = {"path": "lib/child", "input": {"n": 1}, "return_step": "end"}
    assert spec.invoke(config, ctx) == {"child": "done"}
    assert calls == [
        {
            "path": "lib/child",
            "workload": {"n": 1},
            "return_step": "end",
            "parent_execution_id": 9,
            "base_dir": tmp_path,
        }
    ]


def test_the_playbook_kind_without_a_sub_playbook_runner_is_a_config_error() -> None:
    spec = kinds.find("playbook")
    assert spec is not None
    with pytest.raises(ToolError, match="not available in this runtime") as info:
        spec.invoke({"path": "x"}, ToolContext(execution_id=1, step="s"))
    assert info.value.kind == "config_error"
    outcome = run("workflow:\n  - step: start\n    tool: {kind: playbook, path: lib/child}\n")
    assert outcome.status == "error" and outcome.error is not None
    assert outcome.error["kind"] == "config_error"


def test_only_the_built_in_kinds_that_need_them_have_hooks() -> None:
    hooked = {
        spec.kind: (spec.call is not None, spec.delegate is not None, spec.loop_input)
        for spec in map(kinds.find, kinds.BUILTIN)
        if spec is not None and (spec.call or spec.delegate or spec.loop_input)
    }
    assert hooked == {
        "playbook": (True, False, False),
        "workbook": (False, True, False),
        "python": (False, False, True),
    }


def test_a_workbook_task_runs_its_action_with_its_input_over_the_defaults() -> None:
    outcome = run(
        """
        workbook:
          - name: greet
            tool:
              kind: python
              input: {greeting: hello, who: nobody}
              code: "result = {'text': greeting + ' ' + who}"
        workflow:
          - step: start
            tool: {kind: workbook, name: greet, input: {who: "{{ workload.who }}"}}
        """
    )
    assert (outcome.status, outcome.result) == ("ok", {"text": "hello world"}), outcome.error


def test_python_in_a_loop_gets_the_element_as_input_other_kinds_do_not() -> None:
    text = """
    workflow:
      - step: start
        tool: {kind: python, code: "result = {'item': item, 'index': loop_index}"}
      - step: other
        tool: {kind: noop, result: "{{ input is defined }}"}
    """
    loop = {"iterator": "item", "element": {"id": 4}, "index": 2}
    assert run(text, **loop).result == {"item": {"id": 4}, "index": 2}
    assert run(text, "other", **loop).result is False


# -- a plugin's kind gets the same treatment by its spec -----------------------------------


@pytest.mark.usefixtures("plugin")
def test_a_plugin_kind_without_a_runner_is_run_by_its_call() -> None:
    outcome = run("workflow:\n  - step: start\n    tool: {kind: shout, message: hi}\n")
    assert outcome.result == {"said": "HI", "input": None, "task": "start"}, outcome.error
    by_name = run("workflow:\n  - step: start\n    tool: {kind: shout_by_name, message: hi}\n")
    assert by_name.result == {"said": "HI", "input": None, "task": "start"}, by_name.error


@pytest.mark.usefixtures("plugin")
def test_a_plugin_kind_with_loop_input_gets_the_element() -> None:
    text = "workflow:\n  - step: start\n    tool: {kind: shout, message: hi, input: {x: 1}}\n"
    outcome = run(text, iterator="row", element="r", index=0)
    assert outcome.result == {
        "said": "HI",
        "input": {"row": "r", "loop_index": 0, "x": 1},
        "task": "start",
    }
    plain = run(text.replace("shout", "shout_by_name"), iterator="row", element="r", index=0)
    assert plain.result == {"said": "HI", "input": {"x": 1}, "task": "start"}


@pytest.mark.usefixtures("plugin")
def test_a_plugin_kind_may_delegate_to_another_task() -> None:
    outcome = run(
        """
        workbook:
          - name: a_first
            tool: {kind: shout, message: "{{ greeting }} {{ workload.who }}", input: {greeting: hey}}
        workflow:
          - step: start
            tool: {kind: first_action}
        """
    )
    # the action runs under the step's task name
    assert outcome.result == {"said": "HEY WORLD", "input": {"greeting": "hey"}, "task": "start"}


def test_the_runtime_names_no_kind() -> None:
    # `task.kind == "python"` in the runtime is what the hooks replace: a kind's special
    # case belongs on its ToolSpec, where a plugin can declare it too.
    found = []
    for path in Path(flowtide.runtime.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            reads_kind = any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides)
            names = [
                s.value
                for side in sides
                for s in ast.walk(side)
                if isinstance(s, ast.Constant) and s.value in kinds.BUILTIN
            ]
            if reads_kind and names:
                found.append(f"{path.name}:{node.lineno} compares a kind with {names}")
    assert not found
