"""Tasks: one `tool:` mapping (of a step, of a step's pipeline, or of a workbook action)
into a `Task` of the model.

It owns what is structure and what is tool configuration in a tool mapping, the merge of
flat fields with those under `spec` and of the step's `input` with the tool's, the task's
name, and its policy; the per-kind checks are in `flowtide.playbook.loader.kinds`.
"""

from __future__ import annotations

from typing import Any

from flowtide.playbook.loader.checker import _Checker, _suggest
from flowtide.playbook.loader.kinds import _CHECKS, _REQUIRED, _check_python, _check_spark
from flowtide.playbook.loader.policies import _legacy_retry, _parse_policy
from flowtide.playbook.model import TOOL_KINDS, Task
from flowtide.playbook.source import Path as NodePath
from flowtide.playbook.sqllint import params_problem

# Fields of a tool mapping that are structure, not tool configuration.
_TOOL_STRUCTURE = ("kind", "name", "spec", "input", "set", "desc", "assert", "retry")


def _parse_task(
    c: _Checker,
    raw: Any,
    path: NodePath,
    step: str,
    index: int | None,
    step_input: dict[str, Any] | None,
    step_raw: dict[str, Any],
) -> Task | None:
    label = "tool" if index is None else f"tool[{index}]"
    if not isinstance(raw, dict):
        c.error(
            path,
            f"'{label}' must be a mapping with 'kind'",
            step=step,
            field=label,
            expected="{kind: " + "|".join(TOOL_KINDS) + ", ...}",
        )
        return None
    kind = raw.get("kind")
    if kind is None:
        c.error(
            path,
            "tool has no 'kind'",
            step=step,
            field=f"{label}.kind",
            expected=" | ".join(TOOL_KINDS),
        )
        return None
    kind = str(kind)
    if kind not in TOOL_KINDS:
        c.error(
            (*path, "kind"),
            f"unknown tool kind '{kind}'{_suggest(kind, TOOL_KINDS)}",
            step=step,
            field=f"{label}.kind",
            expected=" | ".join(TOOL_KINDS),
        )
        return None
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        c.error((*path, "spec"), "'spec' must be a mapping", step=step, field=f"{label}.spec")
        spec = {}
    config: dict[str, Any] = {k: v for k, v in raw.items() if k not in _TOOL_STRUCTURE}
    # Fields may also sit under tool.spec (examples/* style); flat fields win.
    for k, v in spec.items():
        if k not in ("policy", "input"):
            config.setdefault(k, v)
    config["kind"] = kind
    if kind == "workbook" and "name" in raw:
        config["name"] = raw["name"]
    tool_input = raw.get("input", spec.get("input"))
    if tool_input is not None and not isinstance(tool_input, dict):
        c.error((*path, "input"), "'input' must be a mapping", step=step, field=f"{label}.input")
        tool_input = None
    merged_input: dict[str, Any] | None = None
    if step_input is not None or tool_input is not None:
        merged_input = {**(step_input or {}), **(tool_input or {})}

    names, expected = _REQUIRED[kind]
    if names and not any(config.get(n) not in (None, "") for n in names):
        misplaced = [n for n in names if n in step_raw]
        hint = ""
        if misplaced and index is None:
            line = c.line((*path[:-1], misplaced[0]))
            hint = (
                f"; '{misplaced[0]}' is written on the step (line {line}), it belongs under 'tool'"
            )
        c.error(
            path,
            f"{kind} tool requires {expected}{hint}",
            step=step,
            field=f"{label}.{names[0]}",
        )

    if kind == "spark":
        _check_spark(c, config, path, step, label)
    if kind == "python":
        _check_python(c, raw, spec, path, step, label)
    if (check := _CHECKS.get(kind)) is not None:
        check(c, config, path, step, label)
    if problem := params_problem(kind, config):
        c.error((*path, "params"), problem, step=step, field=f"{label}.params")

    policy = _parse_policy(c, spec.get("policy"), (*path, "spec", "policy"), step)
    if policy is None and "retry" in raw:
        policy = _legacy_retry(raw.get("retry"))
    task_set = raw.get("set") or {}
    if not isinstance(task_set, dict):
        c.error((*path, "set"), "'set' must be a mapping", step=step, field=f"{label}.set")
        task_set = {}
    c.templates({k: v for k, v in config.items() if k not in ("code",)}, path, step, label)
    c.templates(merged_input or {}, (*path, "input"), step, f"{label}.input")
    c.templates(task_set, (*path, "set"), step, f"{label}.set")
    name = str(raw.get("name") or (step if index is None else f"task_{index}"))
    if kind == "workbook":
        name = (
            str(raw.get("task") or step)
            if index is None
            else str(raw.get("task") or f"task_{index}")
        )
    return Task(
        name=name,
        kind=kind,
        config=config,
        input=merged_input,
        set=dict(task_set),
        policy=policy,
        line=c.line(path),
    )
