"""Load and validate a NoETL v2 playbook into the typed model.

Every variation listed in noetl-e2e/DSL-NOTES.md is accepted; everything else is an
error naming file:line:column, the step, the field and what was expected. All errors
of a file are collected in one pass (`PlaybookErrors`); nothing runs when there is one.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook.model import (
    ACTIONS,
    TOOL_KINDS,
    Arc,
    Loop,
    Next,
    Playbook,
    Policy,
    Rule,
    Step,
    Task,
)
from flowtide.playbook.pycode import python_problem
from flowtide.playbook.source import MAX_PLAYBOOK_BYTES, Positions, load_yaml
from flowtide.playbook.source import Path as NodePath
from flowtide.playbook.sqllint import params_problem
from flowtide.playbook.template import check_syntax, is_template

# Fields of a tool mapping that are structure, not tool configuration.
_TOOL_STRUCTURE = ("kind", "name", "spec", "input", "set", "desc", "assert", "retry")
_REQUIRED: dict[str, tuple[tuple[str, ...], str]] = {
    "python": (("code", "script"), "'code' (inline Python) or 'script' (a file)"),
    "http": (("url", "endpoint"), "'url'"),
    "postgres": (("command", "query"), "'command' (SQL to run)"),
    "duckdb": (("query", "command", "commands"), "'query' (SQL to run)"),
    "playbook": (("path",), "'path' (catalog path of the sub-playbook)"),
    "workbook": (("name",), "'name' of a workbook action"),
    "noop": ((), ""),
    "spark": (
        ("sql", "code"),
        "'sql' (Spark SQL over its inputs) or 'code' (def main(spark, ...))",
    ),
}
_SPARK_SINK_FORMATS = ("parquet", "csv", "json", "orc", "text", "jdbc")
_SPARK_SOURCE_FORMATS = _SPARK_SINK_FORMATS
_SPARK_SINK_MODES = ("overwrite", "append", "error", "errorifexists", "ignore")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Checker:
    def __init__(self, file: str | None, positions: Positions) -> None:
        self.file = file
        self.positions = positions
        self.errors: list[PlaybookError] = []

    def error(
        self,
        path: NodePath,
        message: str,
        *,
        step: str | None = None,
        field: str | None = None,
        expected: str | None = None,
    ) -> None:
        line, column = self.positions.get(path)
        self.errors.append(
            PlaybookError(
                message,
                file=self.file,
                line=line,
                column=column,
                step=step,
                field=field,
                expected=expected,
            )
        )

    def error_inside(
        self,
        path: NodePath,
        line: int,
        column: int | None,
        message: str,
        *,
        step: str | None,
        field: str,
    ) -> None:
        """An error at `line`/`column` of the string at `path` (a multi-line template or
        code block): the file position of that line when it can be known."""
        if line <= 1 and column is None:
            self.error(path, message, step=step, field=field)
            return
        at_line, at_column = self.positions.inside(path, line, column)
        self.errors.append(
            PlaybookError(
                message, file=self.file, line=at_line, column=at_column, step=step, field=field
            )
        )

    def line(self, path: NodePath) -> int | None:
        return self.positions.get(path)[0]

    def templates(self, value: Any, path: NodePath, step: str | None, field: str) -> None:
        """Report Jinja syntax errors anywhere inside `value`."""
        if isinstance(value, str):
            if is_template(value):
                problem = check_syntax(value)
                if problem:
                    self.error_inside(
                        path,
                        problem.line,
                        None,
                        f"template syntax error: {problem}",
                        step=step,
                        field=field,
                    )
        elif isinstance(value, dict):
            for k, v in value.items():
                self.templates(v, (*path, k), step, f"{field}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self.templates(v, (*path, i), step, f"{field}[{i}]")


def _suggest(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _as_float(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _parse_then(then: dict[str, Any], when: Any, is_else: bool) -> Rule:
    return Rule(
        when=when,
        is_else=is_else,
        do=str(then.get("do", "continue")),
        attempts=int(then.get("attempts", then.get("max_attempts", 3)) or 1),
        backoff=str(then.get("backoff", "fixed")),
        delay=_as_float(then.get("delay", then.get("backoff_seconds", 0.0)), 0.0),
        max_delay=_as_float(then.get("max_delay", 60.0), 60.0),
        to=then.get("to"),
        set=dict(then.get("set") or {}),
    )


def _parse_policy(c: _Checker, raw: Any, path: NodePath, step: str) -> Policy | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        c.error(
            path,
            "policy must be a mapping",
            step=step,
            field="spec.policy",
            expected="{rules: [...]}",
        )
        return None
    rules_raw = raw.get("rules") or []
    if not isinstance(rules_raw, list):
        c.error(
            (*path, "rules"), "policy rules must be a list", step=step, field="spec.policy.rules"
        )
        return None
    rules: list[Rule] = []
    for i, item in enumerate(rules_raw):
        rpath = (*path, "rules", i)
        if not isinstance(item, dict):
            c.error(
                rpath,
                "a policy rule must be a mapping",
                step=step,
                field=f"spec.policy.rules[{i}]",
                expected="{when: ..., then: {do: ...}} or {else: {then: {...}}}",
            )
            continue
        if "else" in item:
            body = item["else"] or {}
            # Both `else: {then: {...}}` and the then-less `else: {do: ..., set: ...}` occur in
            # real playbooks; NoETL's engines ignore the latter, we honour it.
            then = body.get("then", body) if isinstance(body, dict) else {}
            rule = _parse_then(then or {}, None, True)
            tpath: NodePath = (*rpath, "else")
        else:
            if "when" not in item:
                c.error(
                    rpath,
                    "policy rule needs 'when' (or 'else')",
                    step=step,
                    field=f"spec.policy.rules[{i}]",
                )
                continue
            then = item.get("then") or {}
            if not isinstance(then, dict):
                c.error(
                    (*rpath, "then"),
                    "'then' must be a mapping",
                    step=step,
                    field=f"spec.policy.rules[{i}].then",
                    expected="{do: continue|retry|jump|break|fail}",
                )
                continue
            rule = _parse_then(then, item["when"], False)
            tpath = (*rpath, "then")
            c.templates(item["when"], (*rpath, "when"), step, f"spec.policy.rules[{i}].when")
        if rule.do not in ACTIONS:
            c.error(
                (*tpath, "do"),
                f"unknown policy action '{rule.do}'{_suggest(rule.do, ACTIONS)}",
                step=step,
                field=f"spec.policy.rules[{i}].then.do",
                expected=" | ".join(ACTIONS),
            )
        if rule.do == "jump" and not rule.to:
            c.error(
                tpath,
                "'do: jump' needs 'to' (a task or step name)",
                step=step,
                field=f"spec.policy.rules[{i}].then.to",
            )
        rules.append(rule)
    return Policy(tuple(rules))


def _legacy_retry(raw: Any) -> Policy | None:
    """Translate a tool-level `retry:` block (older playbooks) into policy rules."""
    if raw in (None, False):
        return None
    if raw is True:
        raw = {}
    if isinstance(raw, int):
        raw = {"max_attempts": raw}
    if not isinstance(raw, dict):
        return None
    statuses = raw.get("retry_on_status")
    kinds = raw.get("retry_on")
    cond = "output.status == 'error'"
    if statuses:
        cond += f" and (output.error.http_status in {list(statuses)!r})"
    elif kinds:
        cond += f" and (output.error.kind in {list(kinds)!r})"
    else:
        cond += " and output.error.retryable"
    retry = Rule(
        when="{{ " + cond + " }}",
        is_else=False,
        do="retry",
        attempts=int(raw.get("max_attempts", 3)),
        backoff="exponential" if raw.get("backoff_multiplier") else "fixed",
        delay=_as_float(raw.get("backoff_seconds", raw.get("initial_delay", 1.0)), 1.0),
    )
    return Policy((retry,))


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


def _check_python(
    c: _Checker, raw: dict[str, Any], spec: dict[str, Any], path: NodePath, step: str, label: str
) -> None:
    """A python task's inline code must compile (it is compiled, never run, here)."""
    script = raw.get("script", spec.get("script"))
    where: list[tuple[Any, NodePath, str]] = [
        (raw.get("code"), (*path, "code"), f"{label}.code"),
        (spec.get("code"), (*path, "spec", "code"), f"{label}.spec.code"),
    ]
    if isinstance(script, dict):
        base = (*path, "script") if "script" in raw else (*path, "spec", "script")
        where.append((script.get("code"), (*base, "code"), f"{label}.script.code"))
    for code, at, field in where:
        # Code with Jinja in it is rendered before it runs: `{{ }}` may stand for any text,
        # so what is written here is not the code that will be compiled.
        if not isinstance(code, str) or is_template(code):
            continue
        problem = python_problem(code)
        if problem is None:
            continue
        message = f"python syntax error: {problem.message}"
        if problem.text:
            message += f": {problem.text[:120]!r}"
        c.error_inside(at, problem.line, problem.column, message, step=step, field=field)
        return


def _check_spark(
    c: _Checker, config: dict[str, Any], path: NodePath, step: str, label: str
) -> None:
    """Static checks of a spark task (values that are templates are checked at run time)."""
    if config.get("sql") not in (None, "") and config.get("code") not in (None, ""):
        c.error(
            (*path, "code"),
            "spark tool takes 'sql' or 'code', not both",
            step=step,
            field=f"{label}.code",
        )
    inputs = config.get("inputs")
    if inputs is not None and not isinstance(inputs, dict):
        c.error(
            (*path, "inputs"),
            "spark 'inputs' must be a mapping of name -> input",
            step=step,
            field=f"{label}.inputs",
            expected="{name: records | {{ step }} | {format, path|url, table, options}}",
        )
    for name, spec in (inputs or {}).items() if isinstance(inputs, dict) else ():
        where = (*path, "inputs", name)
        if not _IDENTIFIER.match(str(name)):
            c.error(
                where,
                f"spark input name '{name}' must be an identifier: it becomes a SQL view",
                step=step,
                field=f"{label}.inputs.{name}",
                expected="letters, digits and _",
            )
        if isinstance(spec, dict) and isinstance(spec.get("format"), str):
            fmt = spec["format"].lower()
            if fmt not in _SPARK_SOURCE_FORMATS and not is_template(fmt):
                c.error(
                    (*where, "format"),
                    f"unsupported source format '{spec['format']}'"
                    f"{_suggest(fmt, _SPARK_SOURCE_FORMATS)}",
                    step=step,
                    field=f"{label}.inputs.{name}.format",
                    expected=" | ".join(_SPARK_SOURCE_FORMATS),
                )
            if isinstance(spec.get("options"), dict) and "password" in spec["options"]:
                c.error(
                    (*where, "options", "password"),
                    "a password in the playbook: use 'auth' with a credential alias",
                    step=step,
                    field=f"{label}.inputs.{name}.options.password",
                    expected="auth: <alias from `flowtide credential set`>",
                )
    sink = config.get("sink")
    if sink is None:
        return
    if not isinstance(sink, dict):
        c.error(
            (*path, "sink"),
            "spark 'sink' must be a mapping",
            step=step,
            field=f"{label}.sink",
            expected="{format, path | table, mode, partition_by, options}",
        )
        return
    fmt = str(sink.get("format") or "parquet").lower()
    if fmt not in _SPARK_SINK_FORMATS and not is_template(fmt):
        c.error(
            (*path, "sink", "format"),
            f"unsupported sink format '{sink.get('format')}'{_suggest(fmt, _SPARK_SINK_FORMATS)}",
            step=step,
            field=f"{label}.sink.format",
            expected=" | ".join(_SPARK_SINK_FORMATS),
        )
    mode = sink.get("mode")
    if isinstance(mode, str) and mode.lower() not in _SPARK_SINK_MODES and not is_template(mode):
        c.error(
            (*path, "sink", "mode"),
            f"unsupported sink mode '{mode}'{_suggest(mode.lower(), _SPARK_SINK_MODES)}",
            step=step,
            field=f"{label}.sink.mode",
            expected=" | ".join(_SPARK_SINK_MODES),
        )
    if fmt == "jdbc" and not sink.get("table"):
        c.error(
            (*path, "sink"),
            "a jdbc sink needs 'table'",
            step=step,
            field=f"{label}.sink.table",
        )
    elif fmt in _SPARK_SINK_FORMATS and fmt != "jdbc" and not (sink.get("path") or sink.get("uri")):
        c.error(
            (*path, "sink"),
            f"a {fmt} sink needs 'path'",
            step=step,
            field=f"{label}.sink.path",
        )
    if isinstance(sink.get("options"), dict) and "password" in sink["options"]:
        c.error(
            (*path, "sink", "options", "password"),
            "a password in the playbook: use 'auth' with a credential alias",
            step=step,
            field=f"{label}.sink.options.password",
            expected="auth: <alias from `flowtide credential set`>",
        )


def _parse_next(c: _Checker, raw: Any, path: NodePath, step: str) -> Next:
    if raw is None:
        return Next()
    mode = "exclusive"
    arcs_raw: Any
    if isinstance(raw, dict):
        spec = raw.get("spec") or {}
        mode = str(
            (spec.get("mode") if isinstance(spec, dict) else None) or raw.get("mode") or "exclusive"
        )
        if "arcs" in raw:
            arcs_raw = raw.get("arcs") or []
            arcs_path: NodePath = (*path, "arcs")
        elif "step" in raw:
            arcs_raw = [raw]
            arcs_path = path
        else:
            arcs_raw = []
            arcs_path = path
    elif isinstance(raw, list):
        arcs_raw = raw
        arcs_path = path
    elif isinstance(raw, str):
        arcs_raw = [raw]
        arcs_path = path
    else:
        c.error(
            path,
            "'next' must be a mapping with 'arcs', a list of arcs, or a step name",
            step=step,
            field="next",
        )
        return Next()
    if mode not in ("exclusive", "inclusive"):
        c.error(
            (*path, "spec", "mode"),
            f"unknown routing mode '{mode}'",
            step=step,
            field="next.spec.mode",
            expected="exclusive | inclusive",
        )
    if not isinstance(arcs_raw, list):
        c.error(arcs_path, "'arcs' must be a list", step=step, field="next.arcs")
        return Next(mode=mode)
    arcs: list[Arc] = []
    for i, item in enumerate(arcs_raw):
        apath = (*arcs_path, i)
        if isinstance(item, str):
            arcs.append(Arc(step=item, line=c.line(apath)))
            continue
        if not isinstance(item, dict) or "step" not in item:
            c.error(
                apath,
                "an arc needs 'step'",
                step=step,
                field=f"next.arcs[{i}]",
                expected="{step: NAME, when: TEMPLATE, set: {...}}",
            )
            continue
        arc_set = item.get("set") or {}
        c.templates(item.get("when"), (*apath, "when"), step, f"next.arcs[{i}].when")
        c.templates(arc_set, (*apath, "set"), step, f"next.arcs[{i}].set")
        arcs.append(
            Arc(
                step=str(item["step"]),
                when=item.get("when"),
                set=dict(arc_set),
                line=c.line((*apath, "step")),
            )
        )
    return Next(mode=mode, arcs=tuple(arcs))


def _parse_loop(c: _Checker, raw: Any, path: NodePath, step: str) -> Loop | None:
    if not isinstance(raw, dict):
        c.error(
            path,
            "'loop' must be a mapping",
            step=step,
            field="loop",
            expected="{in: TEMPLATE, iterator: NAME, spec: {mode: sequential|parallel}}",
        )
        return None
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        c.error((*path, "spec"), "loop 'spec' must be a mapping", step=step, field="loop.spec")
        spec = {}
    mode = str(spec.get("mode") or raw.get("mode") or "sequential")
    has_cursor = raw.get("cursor") is not None
    if "in" not in raw and "collection" not in raw and not has_cursor and mode != "cursor":
        c.error(path, "loop needs 'in' (the collection to iterate)", step=step, field="loop.in")
        return None
    iterator = raw.get("iterator") or raw.get("element")
    if not iterator:
        c.error(
            path,
            "loop needs 'iterator' (the name of the current element)",
            step=step,
            field="loop.iterator",
        )
        return None
    if mode not in ("sequential", "parallel", "cursor"):
        c.error(
            (*path, "spec", "mode"),
            f"unsupported loop mode '{mode}'",
            step=step,
            field="loop.spec.mode",
            expected="sequential | parallel | cursor",
        )
    collection = raw.get("in", raw.get("collection"))
    c.templates(collection, (*path, "in"), step, "loop.in")
    mif = spec.get("max_in_flight", raw.get("max_in_flight"))
    if mif is not None and not isinstance(mif, int) and not is_template(mif):
        c.error(
            (*path, "spec", "max_in_flight"),
            f"max_in_flight must be an integer, got {mif!r}",
            step=step,
            field="loop.spec.max_in_flight",
            expected="a positive integer or a template",
        )
    cursor: Task | None = None
    max_rows, process = 1, "row"
    if mode == "cursor" or has_cursor:
        cursor = _parse_cursor(c, raw, path, step, mode)
        max_rows, process = _parse_frame(c, spec, (*path, "spec"), step)
    return Loop(
        collection=collection,
        iterator=str(iterator),
        mode=mode,
        max_in_flight=mif,
        cursor=cursor,
        frame_max_rows=max_rows,
        frame_process=process,
    )


_CURSOR_KINDS = ("postgres",)


def _parse_cursor(
    c: _Checker, raw: dict[str, Any], path: NodePath, step: str, mode: str
) -> Task | None:
    """`loop.cursor` of a `spec.mode: cursor` loop: `{kind: postgres, auth, claim}`."""
    cursor = raw.get("cursor")
    if cursor is None:
        c.error(
            (*path, "spec", "mode"),
            "a cursor loop needs 'cursor' (the claim query)",
            step=step,
            field="loop.cursor",
            expected="cursor: {kind: postgres, auth: ALIAS, claim: SQL}",
        )
        return None
    cpath: NodePath = (*path, "cursor")
    if mode != "cursor":
        c.error(
            cpath,
            f"'loop.cursor' needs 'spec.mode: cursor' (the mode is '{mode}')",
            step=step,
            field="loop.spec.mode",
            expected="cursor",
        )
    if not isinstance(cursor, dict):
        c.error(
            cpath,
            "'loop.cursor' must be a mapping",
            step=step,
            field="loop.cursor",
            expected="{kind: postgres, auth: ALIAS, claim: SQL}",
        )
        return None
    kind = cursor.get("kind")
    if kind not in _CURSOR_KINDS:
        c.error(
            (*cpath, "kind") if "kind" in cursor else cpath,
            f"unsupported cursor kind {kind!r}" if kind else "cursor needs 'kind'",
            step=step,
            field="loop.cursor.kind",
            expected=" | ".join(_CURSOR_KINDS),
        )
    claim = cursor.get("claim")
    if not isinstance(claim, str) or not claim.strip():
        c.error(
            (*cpath, "claim") if "claim" in cursor else cpath,
            "cursor needs 'claim' (SQL that claims rows and returns them)",
            step=step,
            field="loop.cursor.claim",
            expected="claim: UPDATE ... RETURNING ...",
        )
    config = {k: v for k, v in cursor.items() if k != "kind"}
    c.templates(config, cpath, step, "loop.cursor")
    if problem := params_problem(str(kind), config):
        c.error((*cpath, "params"), problem, step=step, field="loop.cursor.params")
    if kind not in _CURSOR_KINDS or not isinstance(claim, str):
        return None
    return Task(name="cursor", kind=str(kind), config=config, line=c.line(cpath))


def _parse_frame(c: _Checker, spec: dict[str, Any], path: NodePath, step: str) -> tuple[int, str]:
    frame = spec.get("frame")
    if frame is None:
        return 1, "row"
    fpath: NodePath = (*path, "frame")
    if not isinstance(frame, dict):
        c.error(
            fpath,
            "loop 'spec.frame' must be a mapping",
            step=step,
            field="loop.spec.frame",
            expected="{max_rows: N, process: row|frame}",
        )
        return 1, "row"
    max_rows = frame.get("max_rows", 1)
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        c.error(
            (*fpath, "max_rows"),
            f"frame max_rows must be an integer >= 1, got {max_rows!r}",
            step=step,
            field="loop.spec.frame.max_rows",
            expected="an integer >= 1",
        )
        max_rows = 1
    process = frame.get("process", "row")
    if process not in ("row", "frame"):
        c.error(
            (*fpath, "process"),
            f"frame process must be 'row' or 'frame', got {process!r}",
            step=step,
            field="loop.spec.frame.process",
            expected="row | frame",
        )
        process = "row"
    return max_rows, str(process)


def _parse_step(c: _Checker, raw: Any, path: NodePath, index: int) -> Step | None:
    if not isinstance(raw, dict):
        c.error(path, "a workflow entry must be a mapping with 'step'", field=f"workflow[{index}]")
        return None
    name = raw.get("step")
    if name is None or name == "":
        c.error(path, "workflow entry has no 'step' name", field=f"workflow[{index}].step")
        return None
    name = str(name)
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
    step_set = raw.get("set") or {}
    if not isinstance(step_set, dict):
        c.error((*path, "set"), "'set' must be a mapping", step=name, field="set")
        step_set = {}
    c.templates(step_set, (*path, "set"), name, "set")
    nxt = _parse_next(c, raw.get("next"), (*path, "next"), name)
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
    )


# NoETL's step policy (`StepPolicy` in noetl/core/dsl/engine/models/workflow.py) has
# `admit`, `lifecycle`, `failure` and `emit`, and says it "MUST NOT include task control
# actions (those are task-level only)"; its validator checks `admit` alone, so `rules`
# written on the step are silently dropped there. flowtide runs `admit` and refuses the
# rest, naming where rules belong, instead of ignoring them.
_STEP_POLICY_KEYS = ("admit",)


def _check_step_policy(c: _Checker, policy: Any, path: NodePath, step: str) -> None:
    ppath: NodePath = (*path, "spec", "policy")
    if not isinstance(policy, dict):
        c.error(
            ppath,
            "a step's 'spec.policy' must be a mapping",
            step=step,
            field="spec.policy",
            expected="{admit: {rules: [...]}}",
        )
        return
    for key in policy:
        if key in _STEP_POLICY_KEYS:
            continue
        if key == "rules":
            c.error(
                (*ppath, "rules"),
                "policy rules written on the step would never run: task policy rules "
                "belong under the tool (a step's spec.policy takes only 'admit')",
                step=step,
                field="spec.policy.rules",
                expected="tool: {kind: ..., spec: {policy: {rules: [...]}}}",
            )
        else:
            c.error(
                (*ppath, key),
                f"step policy '{key}' is not supported: a step's spec.policy takes only "
                f"'admit'{_suggest(str(key), _STEP_POLICY_KEYS)}",
                step=step,
                field=f"spec.policy.{key}",
                expected="admit",
            )


def _parse_admit(
    c: _Checker, raw: dict[str, Any], path: NodePath, step: str
) -> tuple[tuple[Any, bool], ...]:
    spec = raw.get("spec")
    policy = spec.get("policy") if isinstance(spec, dict) else None
    if policy is not None:
        _check_step_policy(c, policy, path, step)
    admit = policy.get("admit") if isinstance(policy, dict) else None
    if admit is None:
        return ()
    apath: NodePath = (*path, "spec", "policy", "admit")
    rules = admit.get("rules") if isinstance(admit, dict) else None
    if not isinstance(rules, list):
        c.error(
            apath,
            "admit needs a list of 'rules'",
            step=step,
            field="spec.policy.admit.rules",
            expected="[{when: ..., then: {allow: true|false}}, {else: {then: {allow: ...}}}]",
        )
        return ()
    out: list[tuple[Any, bool]] = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        body = rule.get("else") if "else" in rule else rule
        then = (body or {}).get("then", body) if isinstance(body, dict) else {}
        allow = then.get("allow", True) if isinstance(then, dict) else True
        when = None if "else" in rule else rule.get("when", True)
        c.templates(when, (*apath, "rules", i, "when"), step, f"spec.policy.admit.rules[{i}].when")
        out.append((when, bool(allow)))
    return tuple(out)


def _reachability(steps: dict[str, Step]) -> dict[str, frozenset[str]]:
    graph = {name: {a.step for a in s.next.arcs if a.step in steps} for name, s in steps.items()}
    out: dict[str, frozenset[str]] = {}
    for name in steps:
        seen: set[str] = set()
        stack = list(graph[name])
        while stack:
            cur = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            stack.extend(graph[cur])
        out[name] = frozenset(seen)
    return out


def parse_playbook(text: str, file: str | None = None) -> Playbook:
    """Parse and validate playbook `text` (from `file`, used in messages and for paths).

    Raises:
        PlaybookError: YAML syntax error, or `PlaybookErrors` listing every problem found.
    """
    data, positions = load_yaml(text, file)
    c = _Checker(file, positions)
    if not isinstance(data, dict):
        raise PlaybookError(
            "a playbook must be a YAML mapping",
            file=file,
            line=1,
            column=1,
            expected="apiVersion/kind/metadata/workflow",
        )
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
    wb_raw = data.get("workbook") or []
    if isinstance(wb_raw, list):
        for i, item in enumerate(wb_raw):
            wpath: NodePath = ("workbook", i)
            if not isinstance(item, dict) or not item.get("name"):
                c.error(wpath, "workbook action needs 'name'", field=f"workbook[{i}].name")
                continue
            name = str(item["name"])
            tool_raw = item.get("tool")
            if tool_raw is None:
                tool_raw = {k: v for k, v in item.items() if k not in ("name", "assert", "desc")}
                tpath = wpath
            else:
                tpath = (*wpath, "tool")
            task = _parse_task(c, tool_raw, tpath, f"workbook:{name}", None, None, item)
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

    executor = data.get("executor") or {}
    entry = None
    if isinstance(executor, dict):
        spec = executor.get("spec") or {}
        if isinstance(spec, dict):
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
    )


def load_playbook(path: str | Path) -> Playbook:
    """Read and validate the playbook file at `path`.

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
    return parse_playbook(text, str(path))
