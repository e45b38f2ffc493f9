"""Tasks: one `tool:` mapping (of a step, of a step's pipeline, or of a workbook action)
into a `Task` of the model.

It owns what is structure and what is tool configuration in a tool mapping, the merge of
flat fields with those under `spec` and of the step's `input` with the tool's, the task's
name, and its policy. Which kinds exist is `flowtide.tools.kinds`'s to say (built-in and
plugin kinds alike); each kind's fields are checked by `flowtide.playbook.loader.kinds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowtide.playbook.loader.checker import _Checker, _suggest
from flowtide.playbook.loader.kinds import _check_kind, _TaskCheck
from flowtide.playbook.loader.policies import _parse_policy, _retry_rule
from flowtide.playbook.loader.schema import KIND_FIELDS, known
from flowtide.playbook.model import Task
from flowtide.playbook.source import Path as NodePath
from flowtide.playbook.sqllint import params_problem
from flowtide.tools import kinds
from flowtide.tools.spec import COMMON_FIELDS, ToolSpec

# Fields of a tool mapping that are structure, not tool configuration.
_TOOL_STRUCTURE = ("kind", "name", "spec", "input", "set", "desc", "assert", "retry")


def _check_keys(
    c: _Checker,
    tool: ToolSpec,
    raw: Mapping[str, Any],
    level: str,
    path: NodePath,
    step: str,
    label: str,
) -> None:
    """The keys of a tool mapping (or its `spec`): the `level` table's and the kind's
    fields. A strict kind refuses the rest itself (`kinds._check_fields`) and a plugin
    kind that is not strict takes any; a built-in kind's unknown field is an error when
    it is close to a known one (a typo), else a warning (the tool ignores it)."""
    own = set(tool.fields) | set(COMMON_FIELDS) | set(KIND_FIELDS.get(tool.kind, ()))
    if level == "tool spec":
        own |= set(known("tool"))  # a task's fields may sit under `spec` as well
    structure = set(known(level))
    extra = [str(k) for k in raw if str(k) not in structure]
    c.keys(raw, level, path, step, label, also=extra)
    if tool.strict or tool.kind not in KIND_FIELDS:
        return
    for name in extra:
        if name in own:
            continue
        where = f"{label}.{name}"
        close = _suggest(name, sorted(own | structure))
        if close:
            c.error(
                (*path, name),
                f"{tool.kind} tool has no field '{name}'{close}",
                step=step,
                field=where,
                expected=" | ".join(sorted(own)),
            )
        else:
            c.warn(
                (*path, name),
                f"{tool.kind} tool does not read '{name}': it is passed on and ignored",
                step=step,
                field=where,
            )


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
            expected="{kind: " + "|".join(kinds.known_kinds()) + ", ...}",
        )
        return None
    kind = raw.get("kind")
    if kind is None:
        c.error(
            path,
            "tool has no 'kind'",
            step=step,
            field=f"{label}.kind",
            expected=" | ".join(kinds.known_kinds()),
        )
        return None
    kind = str(kind)
    tool = kinds.find(kind)
    if tool is None:
        c.error(
            (*path, "kind"),
            kinds.why_unknown(kind),
            step=step,
            field=f"{label}.kind",
            expected=" | ".join(kinds.known_kinds()),
        )
        return None
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        c.error((*path, "spec"), "'spec' must be a mapping", step=step, field=f"{label}.spec")
        spec = {}
    _check_keys(c, tool, raw, "tool", path, step, label)
    _check_keys(c, tool, spec, "tool spec", (*path, "spec"), step, f"{label}.spec")
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

    _check_kind(_TaskCheck(c, kind, raw, config, path, step, label), tool, index is None, step_raw)
    if problem := params_problem(kind, config):
        c.error((*path, "params"), problem, step=step, field=f"{label}.params")

    policy = _parse_policy(c, spec.get("policy"), (*path, "spec", "policy"), step)
    if "retry" in raw:
        retry = _retry_rule(c, raw.get("retry"), (*path, "retry"), step, label)
        if policy is not None and retry is not None:
            c.error(
                (*path, "retry"),
                "'retry' and 'spec.policy' both decide what a failure does: write the retry"
                " as a rule of spec.policy.rules",
                step=step,
                field=f"{label}.retry",
            )
        policy = policy or retry
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
