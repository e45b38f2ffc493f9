"""What each tool kind requires and checks: the fields a task of a kind must have
(`_REQUIRED`), and the static checks of the kinds that have more to check: python (its
inline code must compile) and spark (inputs, sink format and mode, no passwords).

A new tool kind adds its required fields here, and a `_check_<kind>` when it has more.
"""

from __future__ import annotations

import re
from typing import Any

from flowtide.playbook.loader.checker import _Checker, _suggest
from flowtide.playbook.pycode import python_problem
from flowtide.playbook.source import Path as NodePath
from flowtide.playbook.template import is_template

_REQUIRED: dict[str, tuple[tuple[str, ...], str]] = {
    "python": (("code", "script"), "'code' (inline Python) or 'script' (a file)"),
    "http": (("url", "endpoint"), "'url'"),
    "postgres": (("command", "query", "script"), "'command' (SQL to run) or 'script' (a file)"),
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
