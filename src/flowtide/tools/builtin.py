"""The built-in tool kinds, declared as a plugin declares its own: one `ToolSpec` each in
`SPECS` (in the order error messages list them), its runner named by reference so that
its module (and duckdb, psycopg, pyspark behind it) is imported only when a task runs.

A built-in kind is a runner module in `flowtide/tools/` and one `ToolSpec` here, with a
`_check_<kind>` beside it when its fields need more than `requires` and `fields`: the
python kind's inline code must compile; a spark task's inputs, sink format and mode are
checked and passwords refused.

A kind written the older way (an entry in the loader's `_REQUIRED`, in
`model.TOOL_KINDS` and in `registry._KINDS`) becomes `ToolSpec(kind, "<module>:<Class>"
(its `_KINDS` pair), requires=<its _REQUIRED names>, requires_text=<their text>,
check=_check_<kind>)`; a `_check_<kind>(c, config, path, step, label)` reports with
`t.error(keys, message, expected=...)` where it called `c.error((*path, *keys), message,
step=step, field=f"{label}.<keys>", expected=...)` (and `field=` when the field it names
is not the one at the position).
"""

from __future__ import annotations

import re
from typing import Any

from flowtide.tools.spec import TaskCheck, ToolSpec, did_you_mean

_SPARK_SINK_FORMATS = ("parquet", "csv", "json", "orc", "text", "jdbc")
_SPARK_SOURCE_FORMATS = _SPARK_SINK_FORMATS
_SPARK_SINK_MODES = ("overwrite", "append", "error", "errorifexists", "ignore")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NO_PASSWORD = "a password in the playbook: use 'auth' with a credential alias"
_AUTH = "auth: <alias from `flowtide credential set`>"


def _is_template(value: Any) -> bool:
    # The playbook package imports this module's registry: its template module is
    # imported when a check runs (the loader has it loaded by then), not at import.
    from flowtide.playbook.template import is_template

    return is_template(value)


def _check_python(t: TaskCheck) -> None:
    """A python task's inline code must compile (it is compiled, never run, here)."""
    from flowtide.playbook.pycode import python_problem

    spec = t.raw.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    script = t.raw.get("script", spec.get("script"))
    where: list[tuple[Any, tuple[str, ...], tuple[str, ...]]] = [
        (t.raw.get("code"), ("code",), ("code",)),
        (spec.get("code"), ("spec", "code"), ("spec", "code")),
    ]
    if isinstance(script, dict):
        base = ("script",) if "script" in t.raw else ("spec", "script")
        where.append((script.get("code"), (*base, "code"), ("script", "code")))
    for code, at, field in where:
        # Code with Jinja in it is rendered before it runs: `{{ }}` may stand for any text,
        # so what is written here is not the code that will be compiled.
        if not isinstance(code, str) or _is_template(code):
            continue
        problem = python_problem(code)
        if problem is None:
            continue
        message = f"python syntax error: {problem.message}"
        if problem.text:
            message += f": {problem.text[:120]!r}"
        t.error_inside(at, problem.line, problem.column, message, field=field)
        return


def _check_spark(t: TaskCheck) -> None:
    """Static checks of a spark task (values that are templates are checked at run time)."""
    config = t.config
    if config.get("sql") not in (None, "") and config.get("code") not in (None, ""):
        t.error("code", "spark tool takes 'sql' or 'code', not both")
    inputs = config.get("inputs")
    if inputs is not None and not isinstance(inputs, dict):
        t.error(
            "inputs",
            "spark 'inputs' must be a mapping of name -> input",
            expected="{name: records | {{ step }} | {format, path|url, table, options}}",
        )
    for name, spec in (inputs or {}).items() if isinstance(inputs, dict) else ():
        if not _IDENTIFIER.match(str(name)):
            t.error(
                ("inputs", name),
                f"spark input name '{name}' must be an identifier: it becomes a SQL view",
                expected="letters, digits and _",
            )
        if isinstance(spec, dict) and isinstance(spec.get("format"), str):
            fmt = spec["format"].lower()
            if fmt not in _SPARK_SOURCE_FORMATS and not _is_template(fmt):
                t.error(
                    ("inputs", name, "format"),
                    f"unsupported source format '{spec['format']}'"
                    f"{did_you_mean(fmt, _SPARK_SOURCE_FORMATS)}",
                    expected=" | ".join(_SPARK_SOURCE_FORMATS),
                )
            if isinstance(spec.get("options"), dict) and "password" in spec["options"]:
                t.error(("inputs", name, "options", "password"), _NO_PASSWORD, expected=_AUTH)
    sink = config.get("sink")
    if sink is None:
        return
    if not isinstance(sink, dict):
        t.error(
            "sink",
            "spark 'sink' must be a mapping",
            expected="{format, path | table, mode, partition_by, options}",
        )
        return
    fmt = str(sink.get("format") or "parquet").lower()
    if fmt not in _SPARK_SINK_FORMATS and not _is_template(fmt):
        t.error(
            ("sink", "format"),
            f"unsupported sink format '{sink.get('format')}'"
            f"{did_you_mean(fmt, _SPARK_SINK_FORMATS)}",
            expected=" | ".join(_SPARK_SINK_FORMATS),
        )
    mode = sink.get("mode")
    if isinstance(mode, str) and mode.lower() not in _SPARK_SINK_MODES and not _is_template(mode):
        t.error(
            ("sink", "mode"),
            f"unsupported sink mode '{mode}'{did_you_mean(mode.lower(), _SPARK_SINK_MODES)}",
            expected=" | ".join(_SPARK_SINK_MODES),
        )
    if fmt == "jdbc" and not sink.get("table"):
        t.error("sink", "a jdbc sink needs 'table'", field=("sink", "table"))
    elif fmt in _SPARK_SINK_FORMATS and fmt != "jdbc" and not (sink.get("path") or sink.get("uri")):
        t.error("sink", f"a {fmt} sink needs 'path'", field=("sink", "path"))
    if isinstance(sink.get("options"), dict) and "password" in sink["options"]:
        t.error(("sink", "options", "password"), _NO_PASSWORD, expected=_AUTH)


SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "python",
        "flowtide.tools.python:PythonTool",
        requires=("code", "script"),
        requires_text="'code' (inline Python) or 'script' (a file)",
        check=_check_python,
        result="what main() returns (or `result`), JSON-ready",
        doc="Python code, in-process or in a child process",
    ),
    ToolSpec(
        "http",
        "flowtide.tools.http:HttpTool",
        requires=("url", "endpoint"),
        requires_text="'url'",
        result="{status_code, headers, data}",
        doc="an HTTP request",
    ),
    ToolSpec(
        "postgres",
        "flowtide.tools.postgres:PostgresTool",
        requires=("command", "query"),
        requires_text="'command' (SQL to run)",
        result="{command_<i>: {columns, rows, row_count}, columns, rows, row_count}",
        doc="SQL on PostgreSQL",
    ),
    ToolSpec(
        "duckdb",
        "flowtide.tools.duckdb:DuckDBTool",
        requires=("query", "command", "commands"),
        requires_text="'query' (SQL to run)",
        result="the rows (a list of mappings) of the last statement that returned rows",
        doc="SQL on DuckDB",
    ),
    ToolSpec(
        "spark",
        "flowtide.tools.spark:SparkTool",
        requires=("sql", "code"),
        requires_text="'sql' (Spark SQL over its inputs) or 'code' (def main(spark, ...))",
        check=_check_spark,
        result="a dataset reference {uri, format, schema, row_count, preview}",
        doc="Spark SQL or PySpark code over inputs, written to a sink",
    ),
    ToolSpec(
        "playbook",
        None,
        requires=("path",),
        requires_text="'path' (catalog path of the sub-playbook)",
        result="the sub-playbook's result",
        doc="a sub-playbook (run by the runtime)",
    ),
    ToolSpec(
        "workbook",
        None,
        requires=("name",),
        requires_text="'name' of a workbook action",
        result="the action's result",
        doc="an action of the playbook's workbook (run by the runtime)",
    ),
    ToolSpec(
        "noop",
        "flowtide.tools.noop:NoopTool",
        result="its `result:` field (or null)",
        doc="does nothing",
    ),
)
