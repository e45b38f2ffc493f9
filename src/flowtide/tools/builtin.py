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

A table that both a check and the kind's runner read (the nats operations and the fields
each needs) is declared here, beside the check, and imported by the runner: this module
imports nothing heavy, and the loader cannot import a runner.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from flowtide.tools.spec import TaskCheck, ToolSpec, did_you_mean

_SPARK_SINK_FORMATS = ("parquet", "csv", "json", "orc", "text", "jdbc")
_SPARK_SOURCE_FORMATS = _SPARK_SINK_FORMATS
_SPARK_SINK_MODES = ("overwrite", "append", "error", "errorifexists", "ignore")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NO_PASSWORD = "a password in the playbook: use 'auth' with a credential alias"
_AUTH = "auth: <alias from `flowtide credential set`>"

#: The operations of `kind: nats` and the fields each needs: NoETL's (its
#: `noetl/tools/nats/executor.py` OPERATIONS) and core NATS `publish` and `request`.
#: `flowtide.tools.nats` runs them.
NATS_OPERATIONS: dict[str, tuple[str, ...]] = {
    "kv_get": ("bucket", "key"),
    "kv_put": ("bucket", "key", "value"),
    "kv_delete": ("bucket", "key"),
    "kv_keys": ("bucket",),
    "kv_purge": ("bucket", "key"),
    "object_get": ("bucket", "name"),
    "object_put": ("bucket", "name", "data"),
    "object_delete": ("bucket", "name"),
    "object_list": ("bucket",),
    "object_info": ("bucket", "name"),
    "js_publish": ("subject", "data"),
    "js_get_msg": ("stream",),
    "js_stream_info": ("stream",),
    "publish": ("subject",),
    "request": ("subject",),
}
#: Where a nats task may say which server to use.
NATS_SERVER_FIELDS = ("auth", "credential", "nats_url")
# `transfer` (flowtide.tools.transfer reads these too): the types each side may have
# (`type: file` takes its `format`), the other spellings NoETL accepts, modes, engines.
TRANSFER_SOURCE_TYPES = ("http", "postgres", "duckdb", "parquet", "csv", "json")
TRANSFER_TARGET_TYPES = ("postgres", "duckdb", "parquet", "csv", "json")
TRANSFER_TYPE_ALIASES = {
    "postgresql": "postgres",
    "pg": "postgres",
    "jsonl": "json",
    "ndjson": "json",
}
TRANSFER_MODES = ("append", "insert", "replace", "upsert")
TRANSFER_ENGINES = ("python", "spark")
_TRANSFER_SIDES = {"source": TRANSFER_SOURCE_TYPES, "target": TRANSFER_TARGET_TYPES}
_ARTIFACT_ACTIONS = ("get", "put")
_FALSE_WORDS = ("false", "0", "no", "off", "")
_TEMPLATE_PARTS = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.DOTALL)


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


def _mapping_field(t: TaskCheck, key: str, message: str) -> None:
    """Field `key`, when given and not a template, must be a mapping."""
    value = t.config.get(key)
    if value is not None and not isinstance(value, dict) and not _is_template(value):
        t.error(t.at(key), message)


def _check_nats(t: TaskCheck) -> None:
    """A known operation (unless a template chooses it), the fields it needs, a server."""
    config = t.config
    operation = config.get("operation")
    if isinstance(operation, str) and not _is_template(operation):
        fields = NATS_OPERATIONS.get(operation)
        if fields is None:
            t.error(
                t.at("operation"),
                f"unknown nats operation '{operation}'{did_you_mean(operation, NATS_OPERATIONS)}",
                expected=" | ".join(NATS_OPERATIONS),
            )
            return
        for name in fields:
            if config.get(name) is None or (name != "value" and config.get(name) == ""):
                t.error((), f"nats operation '{operation}' needs '{name}'", field=name)
    if not any(config.get(name) not in (None, "") for name in NATS_SERVER_FIELDS):
        t.error(
            (),
            "nats tool needs 'auth': a credential alias holding the server's url (and user"
            " and password, or token)",
            field="auth",
            expected=_AUTH,
        )


def _check_shell(t: TaskCheck) -> None:
    """Commands are strings. With a shell (the default), their templates must stand where
    a value can (`flowtide.playbook.shellvalues`); with `shell: false`, their own text
    (templates aside: the tool checks their values once rendered) needs no shell."""
    from flowtide.playbook.shellsyntax import normalize_command, shell_syntax
    from flowtide.playbook.shellvalues import ShellTemplateError, shell_script

    config = t.config
    key = next((k for k in ("cmds", "cmd", "command") if config.get(k) not in (None, "")), "")
    commands = config.get(key)
    items = commands if isinstance(commands, list) else [commands]
    shell = config.get("shell", True)
    if isinstance(shell, str):
        argv_mode = not _is_template(shell) and shell.strip().lower() in _FALSE_WORDS
    else:
        argv_mode = not shell
    _mapping_field(t, "env", "shell 'env' must be a mapping of names to values")
    if not key:
        return  # no command at all: `requires` says so
    for i, command in enumerate(items):
        where: tuple[str | int, ...] = (*t.at(key), i) if isinstance(commands, list) else t.at(key)
        if not isinstance(command, str | int | float) or isinstance(command, bool):
            t.error(where, "a shell command must be a string")
            continue
        if not isinstance(command, str):
            continue
        if not argv_mode:
            try:
                shell_script(command)
            except ShellTemplateError as exc:
                t.error(where, str(exc))
            continue
        problem = shell_syntax(normalize_command(_TEMPLATE_PARTS.sub("x", command)))
        if problem is not None:
            t.error(
                where,
                f"shell command uses shell syntax, {problem}, outside quotes, and the task"
                " says `shell: false` (no shell)",
                expected="no `shell: false`, or plain words (quote values with | shlex_quote)",
            )


def _check_script(t: TaskCheck) -> None:
    """`script` is a path or a mapping with a `uri` (or `path`); `args` a mapping."""
    script = t.config.get("script")
    if script is None or isinstance(script, str):
        return  # none at all: `requires` says so; a string is the file's path
    if not isinstance(script, dict) or not (script.get("uri") or script.get("path")):
        t.error(
            t.at("script"),
            "script tool's 'script' must be a mapping with 'uri' (the script file)",
            expected="script: {uri: scripts/run.py, source: {type: file}}",
        )
    message = "script 'args' must be a mapping (the script gets it as JSON in argv[1])"
    _mapping_field(t, "args", message)


def _check_choice(
    t: TaskCheck, value: Any, choices: tuple[str, ...], at: tuple[str, ...], what: str
) -> None:
    """`value`, when written literally, must be one of `choices`."""
    if not isinstance(value, str) or _is_template(value):
        return
    if value.strip().lower() not in choices:
        t.error(
            at,
            f"unsupported {what} '{value}'{did_you_mean(value.lower(), choices)}",
            expected=" | ".join(choices),
        )


def _check_transfer(t: TaskCheck) -> None:
    """A transfer's `source` and `target` are mappings with a known `type`; its `mode`
    and `engine` are known ones (templated values are checked when the step runs)."""
    config = t.config
    for side, types in _TRANSFER_SIDES.items():
        spec = config.get(side)
        if not isinstance(spec, dict):
            if not _is_template(spec):
                t.error(
                    t.at(side),
                    f"transfer tool requires '{side}': a mapping with a 'type'",
                    expected="{type: " + " | ".join(types) + ", ...}",
                )
            continue
        key = next((k for k in ("type", "tool", "kind") if k in spec), None)
        if key is None:
            t.error(
                t.at(side),
                f"transfer {side} has no 'type'",
                field=(side, "type"),
                expected=" | ".join(types),
            )
            continue
        written, at = spec[key], (*t.at(side), key)
        if isinstance(written, str) and written.strip().lower() == "file" and "format" in spec:
            written, at = spec["format"], (*t.at(side), "format")
        if isinstance(written, str):
            written = TRANSFER_TYPE_ALIASES.get(written.strip().lower(), written)
        _check_choice(t, written, types, at, f"{side} type")
    raw_target = config.get("target")
    target: Mapping[str, Any] = raw_target if isinstance(raw_target, dict) else {}
    for owner, at in ((config, t.at("mode")), (target, (*t.at("target"), "mode"))):
        if "mode" in owner:
            _check_choice(t, owner["mode"], TRANSFER_MODES, at, "transfer mode")
    if "engine" in config:
        _check_choice(t, config["engine"], TRANSFER_ENGINES, t.at("engine"), "transfer engine")


def _check_artifact(t: TaskCheck) -> None:
    """An artifact task's `action` is get or put."""
    action = t.config.get("action", "get")
    _check_choice(t, action, _ARTIFACT_ACTIONS, t.at("action"), "artifact action")


def _workbook_action(config: Mapping[str, Any], playbook: Any) -> Any:
    """The workbook action a `workbook` task names (the loader checked that it exists)."""
    return playbook.workbook[str(config.get("name"))]


SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "python",
        "flowtide.tools.python:PythonTool",
        requires=("code", "script"),
        requires_text="'code' (inline Python) or 'script' (a file)",
        check=_check_python,
        loop_input=True,
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
        requires=("command", "query", "script"),
        requires_text="'command' (SQL to run) or 'script' (a file)",
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
        call="flowtide.tools.subplaybook:call",
        result="the sub-playbook's result",
        doc="a sub-playbook (run by the runtime)",
    ),
    ToolSpec(
        "workbook",
        None,
        requires=("name",),
        requires_text="'name' of a workbook action",
        delegate=_workbook_action,
        result="the action's result",
        doc="an action of the playbook's workbook (run by the runtime)",
    ),
    ToolSpec(
        "noop",
        "flowtide.tools.noop:NoopTool",
        result="its `result:` field (or null)",
        doc="does nothing",
    ),
    ToolSpec(
        "nats",
        "flowtide.tools.nats:NatsTool",
        requires=("operation",),
        requires_text="'operation' (kv_get, kv_put, kv_delete, kv_keys, publish, ...)",
        check=_check_nats,
        result="{status, ...} the operation's fields (kv_get: bucket, key, value, revision)",
        doc="NATS KV, object store, JetStream and core publish/request",
    ),
    ToolSpec(
        "shell",
        "flowtide.tools.shell:ShellTool",
        requires=("cmds", "cmd", "command"),
        requires_text="'cmds' (a list of commands)",
        check=_check_shell,
        unrendered=("cmds", "cmd", "command"),
        result="{status, data: {returncode, stdout, stderr, duration_ms, commands}, text}",
        doc="commands run one after the other with /bin/sh, template values as variables",
    ),
    ToolSpec(
        "script",
        "flowtide.tools.script:ScriptTool",
        requires=("script",),
        requires_text="'script' ({uri, source: {type: file}})",
        check=_check_script,
        result="{status, exit_code, output, execution_time, ...} (NoETL's script job)",
        doc="a Python script file run as a local process, its `args` as JSON in argv[1]",
    ),
    ToolSpec(
        "transfer",
        "flowtide.tools.transfer:TransferTool",
        # Both sides are required: the check says which is missing (`requires` means any
        # one of its fields).
        check=_check_transfer,
        result="{status, direction, source_type, target_type, mode, engine, rows_read,"
        " rows_written, rows_transferred, chunks_processed, seconds, ...}",
        doc="rows from a source to a target in chunks, with column mapping",
    ),
    ToolSpec(
        "artifact",
        "flowtide.tools.artifact:ArtifactTool",
        check=_check_artifact,
        result="get: what was stored; put: {status, uri, size_bytes, sha256, compressed,"
        " result_ref}",
        doc="reads back a result stored by reference (get), or stores a value (put)",
    ),
)
