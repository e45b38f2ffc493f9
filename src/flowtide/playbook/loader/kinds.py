"""A task's fields, checked against its kind's `ToolSpec` (`flowtide.tools.kinds`: the
built-in kinds and the plugins'): the fields it requires, the types and values of those
its schema names, the fields a strict schema does not know, then the kind's own `check`,
which reports through a `_TaskCheck` (errors with file:line:column, step and field, as
every error of the loader).

Nothing here knows a kind by name: a kind's checks are declared with its ToolSpec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowtide.playbook.loader.checker import _Checker
from flowtide.playbook.source import Path as NodePath
from flowtide.playbook.template import is_template
from flowtide.tools.spec import COMMON_FIELDS, At, ToolSpec, did_you_mean

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "a mapping",
}


def _keys(at: At) -> tuple[str | int, ...]:
    return (at,) if isinstance(at, str) else tuple(at)


class _TaskCheck:
    """One task as a kind's `check` sees it (`flowtide.tools.spec.TaskCheck`)."""

    def __init__(
        self,
        c: _Checker,
        kind: str,
        raw: Mapping[str, Any],
        config: Mapping[str, Any],
        path: NodePath,
        step: str,
        label: str,
    ) -> None:
        self._c = c
        self._path = path
        self._label = label
        self.kind = kind
        self.step = step
        self.raw = raw
        self.config = config

    def at(self, name: str) -> tuple[str, ...]:
        spec = self.raw.get("spec")
        if name not in self.raw and isinstance(spec, dict) and name in spec:
            return ("spec", name)
        return (name,)

    def line_on_step(self, name: str) -> int | None:
        """The line of field `name` of the step that holds this tool."""
        return self._c.line((*self._path[:-1], name))

    def _field(self, at: At, field: At | None) -> str:
        """The field's name in a report: `field`, or `at` without `spec` (a field means
        the same written flat or under `spec:`); a list position is `[i]`
        (`tool.cmds[1]`), as the rest of the loader writes it."""
        keys = _keys(at) if field is None else _keys(field)
        if field is None and keys[:1] == ("spec",):
            keys = keys[1:]
        return self._label + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys)

    def error(
        self,
        at: At,
        message: str,
        *,
        field: At | None = None,
        expected: str | None = None,
    ) -> None:
        self._c.error(
            (*self._path, *_keys(at)),
            message,
            step=self.step,
            field=self._field(at, field),
            expected=expected,
        )

    def error_inside(
        self, at: At, line: int, column: int | None, message: str, *, field: At | None = None
    ) -> None:
        self._c.error_inside(
            (*self._path, *_keys(at)),
            line,
            column,
            message,
            step=self.step,
            field=self._field(at, field),
        )


def _check_required(
    t: _TaskCheck, spec: ToolSpec, on_step: bool, step_raw: Mapping[str, Any]
) -> None:
    """One of `spec.requires` must be set; a hint when it is written on the step instead
    of under `tool` (`on_step`: the step's only tool)."""
    names = spec.requires
    if not names or any(t.config.get(n) not in (None, "") for n in names):
        return
    misplaced = [n for n in names if n in step_raw]
    hint = ""
    if misplaced and on_step:
        line = t.line_on_step(misplaced[0])
        hint = f"; '{misplaced[0]}' is written on the step (line {line}), it belongs under 'tool'"
    t.error((), f"{spec.kind} tool requires {spec.requirement()}{hint}", field=names[0])


def _has_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # a bool is an int to isinstance, not to a schema
        return bool in types
    if isinstance(value, int) and float in types:  # an integer is a number
        return True
    return isinstance(value, types)


def _check_fields(spec: ToolSpec, t: _TaskCheck) -> None:
    """The fields `spec.fields` names have the declared types and values; a strict spec
    knows every field."""
    for name, value in t.config.items():
        declared = spec.fields.get(name)
        if declared is None:
            if spec.strict and name not in COMMON_FIELDS:
                t.error(
                    t.at(name),
                    f"{spec.kind} tool has no field '{name}'{did_you_mean(name, spec.fields)}",
                    expected=" | ".join(spec.fields) or None,
                )
            continue
        if value is None or is_template(value):
            continue
        if declared.types and not _has_type(value, declared.types):
            wanted = " or ".join(_TYPE_NAMES.get(tp, tp.__name__) for tp in declared.types)
            t.error(
                t.at(name),
                f"{spec.kind} '{name}' must be {wanted}, not {type(value).__name__}",
                expected=declared.doc or None,
            )
            continue
        choices = declared.choices
        if choices and str(value).lower() not in choices:
            t.error(
                t.at(name),
                f"unsupported {name} '{value}'{did_you_mean(str(value).lower(), choices)}",
                expected=" | ".join(choices),
            )


def _check_kind(t: _TaskCheck, spec: ToolSpec, on_step: bool, step_raw: Mapping[str, Any]) -> None:
    """Every check `spec` declares, on the task `t` (`on_step`: the step's only tool,
    whose fields `step_raw` holds)."""
    _check_required(t, spec, on_step, step_raw)
    if spec.fields or spec.strict:
        _check_fields(spec, t)
    if spec.check is None:
        return
    try:
        spec.check(t)
    except Exception as exc:  # noqa: BLE001 - a plugin's bug is one error, not a crash
        t.error(
            (),
            f"the checks of kind '{spec.kind}' failed: {type(exc).__name__}: {exc}",
            field="kind",
        )
