"""What each tool kind requires and checks: the fields a task of a kind must have
(`_REQUIRED`), and the static checks of the kinds that have more to check: python (its
inline code must compile), spark (inputs, sink format and mode, no passwords), and in
`_CHECKS`: nats (a known operation and its fields), shell (commands that need no shell
unless `shell: true`) and script (a `script` mapping with a `uri`).

A new tool kind adds its required fields here, and a `_check_<kind>` when it has more.
"""

from __future__ import annotations

import re
from typing import Any

from flowtide.playbook.loader.checker import _Checker, _suggest
from flowtide.playbook.pycode import python_problem
from flowtide.playbook.shellsyntax import normalize_command, shell_syntax
from flowtide.playbook.source import Path as NodePath
from flowtide.playbook.template import is_template

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
    "nats": (("operation",), "'operation' (kv_get, kv_put, kv_delete, kv_keys, publish, ...)"),
    "shell": (("cmds", "cmd", "command"), "'cmds' (a list of commands)"),
    "script": (("script",), "'script' ({uri, source: {type: file}})"),
}
#: The operations of `kind: nats` and the fields each needs: NoETL's (its
#: `noetl/tools/nats/executor.py` OPERATIONS) and core NATS `publish` and `request`.
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


def _at(raw: dict[str, Any], path: NodePath, key: str) -> NodePath:
    """The node of field `key`: flat on the tool, or under its `spec`."""
    return (*path, key) if key in raw or "spec" not in raw else (*path, "spec", key)


def _mapping_field(
    c: _Checker,
    raw: dict[str, Any],
    config: dict[str, Any],
    path: NodePath,
    step: str,
    label: str,
    key: str,
    message: str,
) -> None:
    """Field `key`, when given and not a template, must be a mapping."""
    value = config.get(key)
    if value is not None and not isinstance(value, dict) and not is_template(value):
        c.error(_at(raw, path, key), message, step=step, field=f"{label}.{key}")


def _check_nats(
    c: _Checker, raw: dict[str, Any], config: dict[str, Any], path: NodePath, step: str, label: str
) -> None:
    """A known operation (unless a template chooses it), the fields it needs, a server."""
    operation = config.get("operation")
    if isinstance(operation, str) and not is_template(operation):
        fields = NATS_OPERATIONS.get(operation)
        if fields is None:
            c.error(
                _at(raw, path, "operation"),
                f"unknown nats operation '{operation}'{_suggest(operation, NATS_OPERATIONS)}",
                step=step,
                field=f"{label}.operation",
                expected=" | ".join(NATS_OPERATIONS),
            )
            return
        for name in fields:
            if config.get(name) is None or (name != "value" and config.get(name) == ""):
                c.error(
                    path,
                    f"nats operation '{operation}' needs '{name}'",
                    step=step,
                    field=f"{label}.{name}",
                )
    if not any(config.get(name) not in (None, "") for name in NATS_SERVER_FIELDS):
        c.error(
            path,
            "nats tool needs 'auth': a credential alias holding the server's url (and user"
            " and password, or token)",
            step=step,
            field=f"{label}.auth",
            expected="auth: <alias from `flowtide credential set`>",
        )


_FALSE_WORDS = ("false", "0", "no", "off", "")
_TEMPLATE_PARTS = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.DOTALL)


def _check_shell(
    c: _Checker, raw: dict[str, Any], config: dict[str, Any], path: NodePath, step: str, label: str
) -> None:
    """Commands are strings; without `shell: true`, their own text (templates aside: the
    tool checks their values once rendered) needs no shell."""
    key = next((k for k in ("cmds", "cmd", "command") if config.get(k) not in (None, "")), "")
    commands = config.get(key)
    items = commands if isinstance(commands, list) else [commands]
    shell = config.get("shell")
    if isinstance(shell, str):
        argv_mode = not is_template(shell) and shell.strip().lower() in _FALSE_WORDS
    else:
        argv_mode = not shell
    _mapping_field(
        c, raw, config, path, step, label, "env", "shell 'env' must be a mapping of names to values"
    )
    if not key:
        return  # no command at all: `_REQUIRED` says so
    for i, command in enumerate(items):
        where = (*_at(raw, path, key), i) if isinstance(commands, list) else _at(raw, path, key)
        field = f"{label}.{key}[{i}]" if isinstance(commands, list) else f"{label}.{key}"
        if not isinstance(command, str | int | float) or isinstance(command, bool):
            c.error(where, "a shell command must be a string", step=step, field=field)
            continue
        if not argv_mode or not isinstance(command, str):
            continue
        problem = shell_syntax(normalize_command(_TEMPLATE_PARTS.sub("x", command)))
        if problem is not None:
            c.error(
                where,
                f"shell command uses shell syntax, {problem}, outside quotes; flowtide runs"
                " commands without a shell unless the task says `shell: true`",
                step=step,
                field=field,
                expected="shell: true, or plain words (quote values with | shlex_quote)",
            )


def _check_script(
    c: _Checker, raw: dict[str, Any], config: dict[str, Any], path: NodePath, step: str, label: str
) -> None:
    """`script` is a path or a mapping with a `uri` (or `path`); `args` a mapping."""
    script = config.get("script")
    if script is None or isinstance(script, str):
        return  # none at all: `_REQUIRED` says so; a string is the file's path
    if not isinstance(script, dict) or not (script.get("uri") or script.get("path")):
        c.error(
            _at(raw, path, "script"),
            "script tool's 'script' must be a mapping with 'uri' (the script file)",
            step=step,
            field=f"{label}.script",
            expected="script: {uri: scripts/run.py, source: {type: file}}",
        )
    message = "script 'args' must be a mapping (the script gets it as JSON in argv[1])"
    _mapping_field(c, raw, config, path, step, label, "args", message)


#: The checks of the kinds whose fields need more than `_REQUIRED`, by kind.
_CHECKS = {"nats": _check_nats, "shell": _check_shell, "script": _check_script}
