"""Steps: one entry of `workflow:` into a `Step` of the model.

It owns the step's name, its `input`, its tool (one task, or a pipeline of tasks with
unique names), the fields written on the step that belong under `tool`, and its `set`;
it calls on the loop, arcs and policy parts for `loop`, `next` and `spec.policy`.
"""

from __future__ import annotations

import re
from typing import Any, Final

from flowtide.playbook.loader.arcs import _parse_next
from flowtide.playbook.loader.checker import _Checker
from flowtide.playbook.loader.loops import _parse_loop
from flowtide.playbook.loader.policies import _parse_admit
from flowtide.playbook.loader.schema import KIND_FIELDS, STEP_MISPLACED
from flowtide.playbook.loader.tasks import _parse_task
from flowtide.playbook.model import Step, Task
from flowtide.playbook.source import Path as NodePath
from flowtide.tools import kinds

#: What to say of a tool's field written on the step.
_MISPLACED = {
    **{
        name: f"'{name}' is a tool field: it belongs under 'tool'"
        for fields in KIND_FIELDS.values()
        for name in fields
    },
    **STEP_MISPLACED,
}


def _reported_elsewhere(raw: dict[str, Any]) -> tuple[str, ...]:
    """Tool fields written on the step that another check reports with its fix: SQL or
    code on a step without a tool (below), and what the step's tool requires but lacks
    (`kinds._check_required`)."""
    tool = raw.get("tool")
    if tool is None:
        return ("command", "query", "code")
    spec = kinds.find(str(tool.get("kind"))) if isinstance(tool, dict) else None
    if spec is None:
        return ()
    inner = tool.get("spec") if isinstance(tool.get("spec"), dict) else {}
    if any(tool.get(n) not in (None, "") or inner.get(n) not in (None, "") for n in spec.requires):
        return ()
    return spec.requires


#: What a step name may not hold: C0 and C1 control characters and DEL.
_CONTROL: Final = re.compile("[\x00-\x1f\x7f-\x9f]")


def _parse_step(c: _Checker, raw: Any, path: NodePath, index: int) -> Step | None:
    if not isinstance(raw, dict):
        c.error(path, "a workflow entry must be a mapping with 'step'", field=f"workflow[{index}]")
        return None
    name = raw.get("step")
    if name is None or name == "":
        c.error(path, "workflow entry has no 'step' name", field=f"workflow[{index}].step")
        return None
    name = str(name)
    if _CONTROL.search(name):
        # A name is printed on terminals, sent in headers of the log stream (a CR LF
        # there starts a header of its own) and shown in pages: no control characters.
        c.error(
            (*path, "step"),
            f"step name {name!r} holds a control character (a newline, a tab, ESC...)",
            field=f"workflow[{index}].step",
            expected="a name of printable characters",
        )
        return None
    c.keys(raw, "step", path, name, "", skip=_reported_elsewhere(raw), hints=_MISPLACED)
    spec = raw.get("spec")
    if isinstance(spec, dict):
        c.keys(spec, "step spec", (*path, "spec"), name, "spec")
    step_input = raw.get("input")
    if step_input is not None and not isinstance(step_input, dict):
        c.error((*path, "input"), "'input' must be a mapping", step=name, field="input")
        step_input = None
    tasks: list[Task] = []
    tool = raw.get("tool")
    pipeline = isinstance(tool, list)
    if isinstance(tool, list):
        if not tool:
            c.error((*path, "tool"), "'tool' list is empty", step=name, field="tool")
        for i, item in enumerate(tool):
            task = _parse_task(c, item, (*path, "tool", i), name, i, step_input, raw)
            if task:
                tasks.append(task)
        seen: set[str] = set()
        for task in tasks:
            if task.name in seen:
                c.error(
                    (*path, "tool"), f"duplicate task name '{task.name}'", step=name, field="tool"
                )
            seen.add(task.name)
    elif tool is not None:
        task = _parse_task(c, tool, (*path, "tool"), name, None, step_input, raw)
        if task:
            tasks.append(task)
    elif "command" in raw or "query" in raw or "code" in raw:
        field = next(k for k in ("command", "query", "code") if k in raw)
        c.error(
            (*path, field),
            f"'{field}' is written on the step but the step has no 'tool'",
            step=name,
            field=field,
            expected="tool: {kind: ..., " + field + ": ...}",
        )
    loop = (
        _parse_loop(c, raw["loop"], (*path, "loop"), name) if raw.get("loop") is not None else None
    )
    if loop is not None and loop.mode == "spark":
        _check_spark_loop(c, tasks, pipeline, (*path, "tool"), name)
    step_set = raw.get("set") or {}
    if not isinstance(step_set, dict):
        c.error((*path, "set"), "'set' must be a mapping", step=name, field="set")
        step_set = {}
    c.templates(step_set, (*path, "set"), name, "set")
    nxt = _parse_next(c, raw.get("next"), (*path, "next"), name)
    output = raw.get("output")
    if output is not None and not isinstance(output, dict | list):
        c.error(
            (*path, "output"),
            "'output' must be a mapping",
            step=name,
            field="output",
            expected="{output_select: [fields], store: {kind: auto|kv|disk|s3|gcs}, "
            "inline_max_bytes: n}",
        )
        output = None
    return Step(
        name=name,
        tasks=tuple(tasks),
        pipeline=pipeline,
        loop=loop,
        set=dict(step_set),
        next=nxt,
        desc=raw.get("desc"),
        line=c.line(path),
        admit=_parse_admit(c, raw, path, name),
        output=output,
    )


#: The tools whose calls a `mode: spark` loop runs as Spark tasks (flowtide.spark.loop).
SPARK_LOOP_KINDS = ("python", "http")


def _check_spark_loop(
    c: _Checker, tasks: list[Task], pipeline: bool, path: NodePath, step: str
) -> None:
    """A `mode: spark` loop runs one python or http tool per item, in Spark's executors."""
    if pipeline or len(tasks) != 1 or tasks[0].kind not in SPARK_LOOP_KINDS:
        kinds = ", ".join(t.kind for t in tasks) or "none"
        c.error(
            path,
            f"a 'mode: spark' loop runs one python or http tool per item (this step has: "
            f"{kinds}{', a pipeline' if pipeline else ''}); for other tools, or several, "
            "use 'mode: parallel'",
            step=step,
            field="tool",
            expected="tool: {kind: python, ...} or tool: {kind: http, ...}",
        )
