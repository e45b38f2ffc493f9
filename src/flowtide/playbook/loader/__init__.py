"""Load and validate a NoETL v2 playbook into the typed model.

Every variation listed in noetl-e2e/DSL-NOTES.md is accepted; everything else is an
error naming file:line:column, the step, the field and what was expected. All errors
of a file are collected in one pass (`PlaybookErrors`); nothing runs when there is one.

The document is read here: metadata, workload, workbook, the workflow's steps and what
can only be checked once all of them are known (arc targets, workbook actions, the entry
step). The parts: `checker` (errors with positions), `steps`, `tasks`, `kinds` (the
fields and checks of each tool kind), `loops`, `arcs` (`next`) and `policies`.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook.loader.arcs import _reachability
from flowtide.playbook.loader.checker import _Checker, _suggest
from flowtide.playbook.loader.references import (
    MAX_SUGGESTED,
    known_iter_keys,
    known_names,
    suggest,
    unknown,
)
from flowtide.playbook.loader.schema import EXECUTOR_SPEC_MISPLACED
from flowtide.playbook.loader.steps import _parse_step
from flowtide.playbook.loader.tasks import _parse_task
from flowtide.playbook.model import Playbook, Step, Task
from flowtide.playbook.notify import parse_notify
from flowtide.playbook.source import MAX_PLAYBOOK_BYTES, load_yaml
from flowtide.playbook.source import Path as NodePath
from flowtide.storable import bad_char


def parse_playbook(
    text: str, file: str | None = None, *, references: Collection[str] | None = None
) -> Playbook:
    """Parse and validate playbook `text` (from `file`, used in messages and for paths).

    `references`: also resolve every name the templates read (`loader.references`),
    these names (keys a run is given beyond the workload's) counting as known; None: do
    not (a server's payload may bring names the workload does not declare).

    Raises:
        PlaybookError: YAML syntax error, or `PlaybookErrors` listing every problem found.
    """
    data, positions = load_yaml(text, file)
    c = _Checker(file, positions)
    bad = _bad_text(data, ())
    if bad is not None:
        # Names, paths and values travel into the database, events and HTTP answers:
        # text none of them can hold is refused here, with its place.
        place, what = bad
        field = "".join(
            f"[{p}]" if isinstance(p, int) else "." + _shown(str(p)) for p in place
        ).lstrip(".")
        c.error(
            place,
            f"holds {what}: a playbook must be valid Unicode text without NUL",
            field=field or None,
        )
        raise PlaybookErrors(c.errors)
    if not isinstance(data, dict):
        raise PlaybookError(
            "a playbook must be a YAML mapping",
            file=file,
            line=1,
            column=1,
            expected="apiVersion/kind/metadata/workflow",
        )
    c.keys(data, "playbook", (), None, "")
    meta = data.get("metadata") or {}
    if not isinstance(meta, dict):
        c.error(("metadata",), "'metadata' must be a mapping", field="metadata")
        meta = {}
    workload = data.get("workload")
    if workload is None:
        workload = {}
    if not isinstance(workload, dict):
        c.error(("workload",), "'workload' must be a mapping", field="workload")
        workload = {}
    workflow = data.get("workflow")
    if not isinstance(workflow, list) or not workflow:
        c.error(
            ("workflow",) if "workflow" in data else (),
            "playbook has no steps",
            field="workflow",
            expected="workflow: a list of steps",
        )
        raise PlaybookErrors(c.errors)

    workbook: dict[str, Task] = {}
    # An action's errors count only if a step calls it: NoETL looks a workbook action up
    # by name when a step runs it (`noetl/worker/plugin/workbook.py`,
    # `execute_workbook_task`), so one that no step uses is never read.
    action_errors: dict[str, list[PlaybookError]] = {}
    wb_raw = data.get("workbook") or []
    if isinstance(wb_raw, list):
        for i, item in enumerate(wb_raw):
            wpath: NodePath = ("workbook", i)
            if not isinstance(item, dict) or not item.get("name"):
                c.error(wpath, "workbook action needs 'name'", field=f"workbook[{i}].name")
                continue
            name = str(item["name"])
            tool_raw = item.get("tool")
            if tool_raw is not None:
                c.keys(item, "workbook action", wpath, f"workbook:{name}", f"workbook[{i}]")
            if tool_raw is None:
                tool_raw = {k: v for k, v in item.items() if k not in ("name", "assert", "desc")}
                tpath = wpath
            else:
                tpath = (*wpath, "tool")
            before = len(c.errors)
            task = _parse_task(c, tool_raw, tpath, f"workbook:{name}", None, None, item)
            action_errors[name] = c.errors[before:]
            del c.errors[before:]
            if task:
                workbook[name] = Task(
                    name=name,
                    kind=task.kind,
                    config=task.config,
                    input=task.input,
                    set=task.set,
                    policy=task.policy,
                    line=task.line,
                )
    elif wb_raw:
        c.error(("workbook",), "'workbook' must be a list of actions", field="workbook")

    steps: dict[str, Step] = {}
    for i, raw in enumerate(workflow):
        step = _parse_step(c, raw, ("workflow", i), i)
        if step is None:
            continue
        if step.name in steps:
            c.error(
                ("workflow", i, "step"),
                f"duplicate step name '{step.name}'",
                step=step.name,
                field="step",
                expected="unique step names",
            )
            continue
        steps[step.name] = step

    checked: set[str] = set()
    for i, raw in enumerate(workflow):
        if not isinstance(raw, dict) or str(raw.get("step")) not in steps:
            continue
        if str(raw["step"]) in checked:
            continue  # a duplicate name: reported above, its arcs are not this step's
        checked.add(str(raw["step"]))
        step = steps[str(raw["step"])]
        for j, arc in enumerate(step.next.arcs):
            if arc.step not in steps:
                line, column = None, None
                for arc_at in (("workflow", i, "next", "arcs", j), ("workflow", i, "next", j)):
                    if positions.has(arc_at):
                        line, column = positions.get(arc_at)
                        break
                else:
                    line, column = positions.get(("workflow", i, "next"))
                c.errors.append(
                    PlaybookError(
                        f"arc to unknown step '{arc.step}'{_suggest(arc.step, steps)}",
                        file=file,
                        line=line,
                        column=column,
                        step=step.name,
                        field=f"next.arcs[{j}].step",
                        expected="the name of a step in this workflow",
                    )
                )
        for k, task in enumerate(step.tasks):
            if task.kind == "workbook":
                action = str(task.config.get("name"))
                if action not in workbook:
                    where: NodePath = ("workflow", i, "tool") + ((k,) if step.pipeline else ())
                    c.error(
                        (*where, "name"),
                        f"unknown workbook action '{action}'{_suggest(action, workbook)}",
                        step=step.name,
                        field="tool.name",
                        expected="one of: "
                        + (", ".join(workbook) or "(the playbook has no workbook)"),
                    )

    used = {
        str(task.config.get("name"))
        for step in steps.values()
        for task in step.tasks
        if task.kind == "workbook"
    }
    for name, errors in action_errors.items():
        if name in used:
            c.errors.extend(errors)
        elif errors:
            workbook.pop(name, None)

    executor = data.get("executor") or {}
    entry = None
    if isinstance(executor, dict):
        c.keys(executor, "executor", ("executor",), None, "executor")
        spec = executor.get("spec") or {}
        if isinstance(spec, dict):
            c.keys(
                spec,
                "executor.spec",
                ("executor", "spec"),
                None,
                "executor.spec",
                hints=EXECUTOR_SPEC_MISPLACED,
            )
            entry = spec.get("entry_step")
    if entry is None:
        entry = "start" if "start" in steps else next(iter(steps), None)
    if entry is not None and entry not in steps:
        c.error(
            ("executor", "spec", "entry_step"),
            f"entry step '{entry}' does not exist{_suggest(str(entry), steps)}",
            field="executor.spec.entry_step",
        )
    c.templates(workload, ("workload",), None, "workload")

    def notify_problem(
        at: tuple[str | int, ...], message: str, field: str, expected: str | None
    ) -> None:
        c.error(("notify", *at), message, field=field, expected=expected)

    notify = parse_notify(data.get("notify"), notify_problem)
    raw_notify: list[Any] = data["notify"] if notify else []
    for i, raw_target in enumerate(raw_notify):
        for kind, cfg in raw_target.items():
            for key in ("body", "text", "subject") if isinstance(cfg, dict) else ():
                if key in cfg:
                    at = ("notify", i, kind, key)
                    # Rendered with the notification's own names (flowtide.notify).
                    c.templates(cfg[key], at, None, f"notify[{i}].{kind}.{key}", refs=False)

    limits = {key: _duration(c, data, key) for key in ("timeout", "sla")}
    if references is not None and not c.errors:
        _check_references(c, {**dict.fromkeys(references), **workload}, steps, workbook)

    if c.errors:
        raise PlaybookErrors(c.errors)

    upstreams: dict[str, set[str]] = {name: set() for name in steps}
    for name, step in steps.items():
        for arc in step.next.arcs:
            upstreams[arc.step].add(name)
    return Playbook(
        name=str(meta.get("name") or (Path(file).stem if file else "playbook")),
        path=meta.get("path"),
        version=str(meta["version"]) if meta.get("version") is not None else None,
        workload=workload,
        steps=steps,
        entry=str(entry),
        workbook=workbook,
        text=text,
        file=str(Path(file).resolve()) if file else None,
        keychain=list(data.get("keychain") or []),
        executor=executor if isinstance(executor, dict) else {},
        upstreams={k: frozenset(v) for k, v in upstreams.items()},
        reachable=_reachability(steps),
        notify=notify,
        timeout=limits["timeout"],
        sla=limits["sla"],
        warnings=tuple(sorted(c.warnings, key=lambda w: (w.line or 0, w.column or 0))),
    )


def _check_references(
    c: _Checker, workload: dict[str, Any], steps: dict[str, Step], workbook: dict[str, Task]
) -> None:
    """Every name the playbook's templates read is one some context offers."""
    names = known_names(workload, steps, workbook)
    iters = known_iter_keys(steps, workbook)
    found = 0
    for ref in c.references:
        for what, line, choices in unknown(ref, names, workload, iters):
            name = what.split("'")[1]
            found += 1
            hint = suggest(name, choices) if found <= MAX_SUGGESTED else ""
            c.error_inside(
                ref.path,
                line,
                None,
                f"template reads unknown {what}{hint}",
                step=ref.step,
                field=ref.field,
            )


def warning_text(warning: PlaybookError) -> str:
    """A loader warning as `file:line:column: warning: step '...', field '...': message`."""
    text = warning.render()
    where = warning.location()
    return f"{where}: warning: {text[len(where) + 2 :]}"


def _duration(c: _Checker, data: dict[str, Any], key: str) -> float | None:
    """A top-level duration (`timeout: 15m`, `sla: 1h`, or seconds), or None."""
    from flowtide.errors import TriggerError
    from flowtide.triggers.when import parse_duration

    raw = data.get(key)
    if raw is None:
        return None
    try:
        return parse_duration(raw, field=key)
    except TriggerError as exc:
        c.error((key,), exc.message, field=key, expected="a duration like 30s, 15m or 2h")
        return None


def load_playbook(path: str | Path, *, references: Collection[str] | None = None) -> Playbook:
    """Read and validate the playbook file at `path` (`references`: `parse_playbook`'s).

    Raises:
        PlaybookError: unreadable file, YAML syntax error or invalid playbook.
    """
    p = Path(path)
    try:
        if p.stat().st_size > MAX_PLAYBOOK_BYTES:
            # Refused before reading: the file could be any size.
            raise PlaybookError(
                f"the playbook is {p.stat().st_size:,} bytes, more than the limit of "
                f"{MAX_PLAYBOOK_BYTES:,} bytes",
                file=str(path),
            )
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PlaybookError("file not found", file=str(path)) from exc
    except OSError as exc:
        raise PlaybookError(f"cannot read file: {exc.strerror}", file=str(path)) from exc
    return parse_playbook(text, str(path), references=references)


def _shown(key: str) -> str:
    text = key.encode("ascii", "backslashreplace").decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _bad_text(value: Any, path: NodePath) -> tuple[NodePath, str] | None:
    """The first place in the document whose text (a value or a key) cannot be stored
    (`flowtide.storable`), and what it holds."""
    if isinstance(value, str):
        what = bad_char(value)
        return (path, what) if what is not None else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and (what := bad_char(key)) is not None:
                return (*path, key), what
            found = _bad_text(item, (*path, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _bad_text(item, (*path, index))
            if found is not None:
                return found
    return None
