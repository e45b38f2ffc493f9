"""SQL checks that need no database: templates pasted into SQL string literals, and the
shape of `params`.

A template rendered into SQL text is pasted: `SELECT '{{ name }}'` with a name holding a
quote ends the literal and runs whatever follows (SQL injection). Inside a string literal
the value can always be a bind parameter instead, so a template there earns a warning
that suggests `params`. Templates elsewhere in the SQL (a table name, `LIMIT {{ n }}`)
are not flagged: identifiers and keywords cannot be bound, and flagging every template
would bury the warnings that matter.

Pure: works on the parsed `Playbook` (and its text, for line numbers).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flowtide.playbook.model import Playbook, Task
from flowtide.playbook.template import is_template

__all__ = ["SQL_FIELDS", "SqlWarning", "lint_playbook", "params_problem", "pasted_templates"]

#: Fields holding SQL, per tool kind (the names each tool reads its SQL from).
SQL_FIELDS: dict[str, tuple[str, ...]] = {
    "postgres": ("command", "query", "commands", "sql"),
    "duckdb": ("query", "command", "commands", "sql"),
    "spark": ("sql",),
}
PARAMS_EXPECTED = "a list (positional placeholders) or a mapping (named placeholders)"

_JINJA_CLOSE = {"{{": "}}", "{%": "%}", "{#": "#}"}
# Values the engine itself provides, always numbers: pasting them cannot end a literal,
# and NoETL playbooks write `'{{ execution_id }}'` everywhere.
_ENGINE_NUMBER = re.compile(r"^\{\{\s*(execution_id|loop_index|__frame_max_rows)\s*\}\}$")


@dataclass(frozen=True)
class SqlWarning:
    """A template pasted inside a SQL string literal, where `params` belongs."""

    file: str | None
    line: int | None
    step: str
    field: str
    template: str

    @property
    def message(self) -> str:
        return (
            f"template {self.template} is pasted inside a SQL string literal, where a quote "
            "in its value ends the literal and the rest runs as SQL; bind the value with "
            "`params` instead"
        )

    def render(self) -> str:
        where = self.file or "<playbook>"
        if self.line is not None:
            where += f":{self.line}"
        return f"{where}: warning: step '{self.step}', field '{self.field}': {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "step": self.step,
            "field": self.field,
            "template": self.template,
            "message": self.message,
        }


def pasted_templates(sql: str, *, dialect: str = "postgres") -> list[str]:
    """The `{{ ... }}` templates of `sql` (a SQL text not yet rendered) that sit inside a
    string literal.

    Literals are `'...'` (with `''` and, after `E`, backslash escapes); for
    `dialect="spark"` also `"..."`, with backslash escapes in both, as Spark SQL reads
    them. Jinja markup is skipped whole, so quotes inside a template (`{{ x | default('a')
    }}`) do not open a literal. Dollar quoting is not followed: the SQL inside a function
    body has literals of its own, which is where a pasted value would land. Templates in
    `--` and `/* */` comments are ignored.
    """
    return [template for _, template in _pasted(sql, dialect)]


def _pasted(sql: str, dialect: str) -> list[tuple[int, str]]:
    """(offset, template) of each template inside a literal (see `pasted_templates`)."""
    found: list[tuple[int, str]] = []
    spark = dialect == "spark"
    quote = ""  # the open literal's quote character, "" outside a literal
    backslash = False
    n = len(sql)
    i = 0
    while i < n:
        opener = sql[i : i + 2]
        if opener in _JINJA_CLOSE:
            close = sql.find(_JINJA_CLOSE[opener], i + 2)
            end = n if close < 0 else close + 2
            if quote and opener == "{{":
                found.append((i, sql[i:end]))
            i = end
            continue
        ch = sql[i]
        if quote:
            if backslash and ch == "\\":
                i += 2
                continue
            if ch == quote:
                if sql.startswith(quote * 2, i):
                    i += 2
                    continue
                quote = ""
            i += 1
            continue
        if sql.startswith("--", i):
            newline = sql.find("\n", i)
            i = n if newline < 0 else newline + 1
            continue
        if sql.startswith("/*", i):
            close = sql.find("*/", i + 2)
            i = n if close < 0 else close + 2
            continue
        if ch == "'" or (spark and ch == '"'):
            quote = ch
            prefix = sql[i - 1] if i else ""
            before = sql[i - 2] if i > 1 else ""
            backslash = spark or (prefix in "eE" and not (before.isalnum() or before in "_$"))
        i += 1
    return found


def params_problem(kind: str, config: Mapping[str, Any]) -> str | None:
    """What is wrong with a task's `params` before anything runs, or None.

    `params` of a SQL tool must be a list or a mapping, or a template (which may render
    to one); a spark task binds it to `sql`, so `params` beside `code` is a mistake.
    """
    if kind not in SQL_FIELDS or config.get("params") is None:
        return None
    params = config["params"]
    if kind == "spark" and config.get("sql") in (None, ""):
        return (
            "spark 'params' binds the placeholders of 'sql'; 'code' takes its values "
            "through 'input'"
        )
    if isinstance(params, list | dict) or is_template(params):
        return None
    return f"'params' must be {PARAMS_EXPECTED}, not {type(params).__name__}"


def lint_playbook(playbook: Playbook, file: str | None = None) -> list[SqlWarning]:
    """Every template pasted inside a SQL string literal of a postgres, duckdb or spark
    task (a cursor loop's `claim` and a jdbc input's `query` included), in step order.

    `file` names the playbook in the warnings (default: `playbook.file`).
    """
    lines = playbook.text.splitlines()
    where = file if file is not None else playbook.file
    warnings: list[SqlWarning] = []
    for step_name, field, task, sql, dialect in _sql_fields(playbook):
        # Templates come in text order: each is looked for from the line of the one before
        # (the next line when it sits on a later SQL line), so repeated SQL lines map to
        # their own YAML lines.
        line, sql_row = task.line, 0
        for offset, template in _pasted(sql, dialect):
            if _ENGINE_NUMBER.match(template):
                continue
            row = sql.count("\n", 0, offset)
            if line is not None and row > sql_row and warnings and warnings[-1].field == field:
                line += 1
            sql_line = sql[sql.rfind("\n", 0, offset) + 1 :].split("\n", 1)[0].strip()
            line = _line_of(lines, line, (sql_line, template.split("\n", 1)[0]))
            sql_row = row
            warning = SqlWarning(
                file=where,
                line=line,
                step=step_name,
                field=field,
                template=" ".join(template.split()),
            )
            if warning not in warnings:  # the same template twice on one line: one warning
                warnings.append(warning)
    return warnings


def _sql_fields(playbook: Playbook) -> Iterator[tuple[str, str, Task, str, str]]:
    """(step, field, task, SQL text, dialect) for every SQL field of the playbook."""
    for name, action in playbook.workbook.items():
        yield from _task_sql(f"workbook:{name}", "tool", action)
    for step in playbook.steps.values():
        if step.loop is not None and step.loop.cursor is not None:
            claim = step.loop.cursor.config.get("claim")
            if isinstance(claim, str):
                yield step.name, "loop.cursor.claim", step.loop.cursor, claim, "postgres"
        for index, task in enumerate(step.tasks):
            yield from _task_sql(step.name, f"tool[{index}]" if step.pipeline else "tool", task)


def _task_sql(step: str, label: str, task: Task) -> Iterator[tuple[str, str, Task, str, str]]:
    fields = SQL_FIELDS.get(task.kind, ())
    dialect = "spark" if task.kind == "spark" else "postgres"
    for key in fields:
        value = task.config.get(key)
        if isinstance(value, str):
            yield step, f"{label}.{key}", task, value, dialect
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str):
                    yield step, f"{label}.{key}[{i}]", task, item, dialect
    inputs = task.config.get("inputs") if task.kind == "spark" else None
    if isinstance(inputs, Mapping):
        # A jdbc source's `query` runs on the database, as text: the same hazard.
        for name, spec in inputs.items():
            if isinstance(spec, Mapping) and isinstance(spec.get("query"), str):
                yield step, f"{label}.inputs.{name}.query", task, spec["query"], "postgres"


def _line_of(lines: list[str], start: int | None, needles: tuple[str, ...]) -> int | None:
    """The first line at or after the task's own that holds a needle, tried in order: the
    SQL line around the template (as a block scalar keeps it), then the template alone
    (the model keeps the task's line, not each field's)."""
    if start is None:
        return None
    for needle in needles:
        for number in range(start, len(lines) + 1):
            if needle in lines[number - 1]:
                return number
    return start
