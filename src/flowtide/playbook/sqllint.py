"""SQL checks that need no database: templates pasted into SQL text, and the shape of
`params`.

A template rendered into SQL text is pasted: whatever its value holds becomes SQL.
`SELECT '{{ name }}'` with a name holding a quote ends the literal and runs what follows;
`WHERE id = {{ id }}` with `id: "0; DROP TABLE t"` needs no quote at all. Every
template of a SQL field is placed (`flowtide.playbook.sqlscan`: inside a string literal
of any form, a quoted identifier, a comment, or bare, with what a bare one stands for)
and each pasted one earns a warning naming the fix for its place: a value is bound with
`params` (the tool's placeholder shown), a LIMIT/OFFSET count too (or `| int`), a name
(table, column, keyword) is restricted to an allow-list.

Not warned about: templates that cannot end a token whatever the run gives them - the
engine's own numbers (`{{ execution_id }}`, `{{ loop_index }}`), a constant, a value
filtered to a number (`| int`, `| float`, `| length`, `| count`, `| wordcount`, `| abs`,
`| round`: each fails the step on anything else), and an allow-list (`{{ c if c in ['a',
'b'] else 'a' }}`, the constants plain words). `{% ... %}` blocks are never values.

Pure: works on the parsed `Playbook` (and its text, for line numbers).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from jinja2 import TemplateSyntaxError, nodes

from flowtide.playbook.model import Playbook, Task
from flowtide.playbook.sqlscan import Position, Role, placements
from flowtide.playbook.template import ENV, is_template

__all__ = [
    "MAX_WARNINGS",
    "SQL_FIELDS",
    "SqlWarning",
    "lint_playbook",
    "params_problem",
    "pasted_templates",
    "safe_template",
]

#: Fields holding SQL, per tool kind (the names each tool reads its SQL from).
SQL_FIELDS: dict[str, tuple[str, ...]] = {
    "postgres": ("command", "query", "commands", "sql"),
    "duckdb": ("query", "command", "commands", "sql"),
    "spark": ("sql",),
}
#: Warnings `lint_playbook` returns at most (the first ones, in step order).
MAX_WARNINGS: Final = 500
PARAMS_EXPECTED = "a list (positional placeholders) or a mapping (named placeholders)"

# Values the engine itself provides, always digits: NoETL playbooks write
# `'{{ execution_id }}'` everywhere.
_ENGINE_NUMBERS: Final = frozenset({"execution_id", "loop_index", "__frame_max_rows"})
# Filters whose result is a number or that fail on anything else.
_NUMBER_FILTERS: Final = frozenset({"int", "float", "length", "count", "wordcount", "abs", "round"})
_PLAIN_WORD: Final = re.compile(r"[A-Za-z0-9_.]*")
# (named placeholder, positional ones) of each tool, `{}` standing for the name.
_PLACEHOLDERS: Final = {
    "postgres": ("%({})s", "%s or $1"),
    "duckdb": ("${}", "? or $1"),
    "spark": (":{}", "?"),
}
# What ends each form, as a value's text would.
_ENDS: Final = {
    "'...'": "a quote",
    "U&'...'": "a quote",
    "E'...'": "a quote or a backslash",
    "$$...$$": "`$$`",
    "$tag$...$tag$": "the closing `$tag$`",
    '"..."': "a double quote",
    "`...`": "a backtick",
    "r'...'": "a quote",
    'r"..."': "a double quote",
    "--": "a newline",
    "/* */": "`*/`",
}


@dataclass(frozen=True)
class SqlWarning:
    """A template pasted into SQL text, where it belongs to `params` or an allow-list."""

    file: str | None
    line: int | None
    step: str
    field: str
    template: str
    #: string, identifier, comment or bare (`flowtide.playbook.sqlscan.Position`).
    position: Position = "string"
    #: The literal, identifier or comment form ("'...'", "$$...$$", "--"...); "" bare.
    form: str = "'...'"
    #: value, limit or name when bare.
    role: Role | None = None
    #: The tool whose placeholders the fix shows (postgres, duckdb, spark; jdbc: a spark
    #: source's query, which takes none).
    tool: str = "postgres"
    #: The bare template follows a `-`: a negative number would start a `--` comment.
    after_minus: bool = False

    @property
    def message(self) -> str:
        t = self.template
        name = _name_of(t)
        named, positional = _PLACEHOLDERS.get(self.tool, _PLACEHOLDERS["postgres"])
        bind = (
            f"bind the value with `params` instead ({self.tool}: `{named.format(name)}` with "
            f'`params: {{{name}: "{t}"}}`, or {positional} with a list)'
        )
        if self.tool == "jdbc":
            bind = (
                "a jdbc source's `query` takes no `params`: read the table and filter in the "
                f"step's `sql` with `params` (`:{name}`)"
            )
        ends = _ENDS.get(self.form, "a quote")
        if self.position == "string":
            return (
                f"template {t} is pasted inside a SQL string literal {self.form}, where "
                f"{ends} in its value ends the literal and the rest runs as SQL; {bind}, "
                "in place of the whole literal (join text around it with ||)"
            )
        allow = f"{{{{ {name} if {name} in ['a', 'b'] else 'a' }}}}"
        if self.position == "identifier":
            return (
                f"template {t} is pasted inside a quoted identifier {self.form}, where {ends} "
                "in its value ends the name and the rest runs as SQL; a name cannot be a bind "
                f"parameter: restrict it to known names ({allow}) or keep it out of user input"
            )
        if self.position == "comment":
            return (
                f"template {t} is pasted inside a SQL comment {self.form}, where {ends} in "
                "its value ends the comment and the rest runs as SQL; take it out of the "
                "comment (or make it a number: | int)"
            )
        head = f"template {t} is pasted bare into the SQL"
        if self.after_minus:
            head += " right after a `-` (a negative number makes it a `--` comment)"
        if self.role == "limit":
            count = (
                f"make it a number ({{{{ {name} | int }}}})"
                if self.tool in ("spark", "jdbc")
                else f"bind it with `params` (`LIMIT {named.format(name)}`) or make it a "
                f"number ({{{{ {name} | int }}}})"
            )
            return f"{head} as a LIMIT/OFFSET count, where its value is SQL text; {count}"
        if self.role == "name":
            return (
                f"{head} as a name or keyword (a table, a column, ORDER BY), where its value "
                "is SQL text and no bind parameter can stand; restrict it to known names "
                f"({allow}), or | int for a number, or keep it out of user input"
            )
        return (
            f"{head} as a value, where its value is SQL text (`0; DROP TABLE t` runs as "
            f"written); {bind}"
        )

    def render(self, level: str = "warning") -> str:
        """`file:line: warning: step '...', field '...': message` (`level` "error" under
        `validate --strict` and a server that refuses pasted SQL)."""
        where = self.file or "<playbook>"
        if self.line is not None:
            where += f":{self.line}"
        return f"{where}: {level}: step '{self.step}', field '{self.field}': {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "step": self.step,
            "field": self.field,
            "template": self.template,
            "position": self.position,
            "role": self.role,
            "message": self.message,
        }


def pasted_templates(sql: str, *, dialect: str = "postgres") -> list[str]:
    """The `{{ ... }}` templates of `sql` (a SQL text not yet rendered) that sit inside a
    string literal (any form: `'...'`, `E'...'`, `U&'...'`, `$$...$$`, `$tag$...$tag$`;
    spark's `"..."` too), whether safe or not."""
    return [p.template for p in placements(sql, dialect) if p.position == "string"]


@functools.lru_cache(maxsize=1024)
def safe_template(template: str) -> bool:
    """Whether the `{{ ... }}` template renders text that cannot end a token of the SQL it
    is pasted into: an engine number, a constant, a value filtered to a number, an
    allow-list of plain words."""
    try:
        tree = ENV.parse(template)
    except TemplateSyntaxError:
        return False
    body = tree.body
    if len(body) != 1 or not isinstance(body[0], nodes.Output):
        return False
    exprs = [
        n for n in body[0].nodes if not (isinstance(n, nodes.TemplateData) and not n.data.strip())
    ]
    return len(exprs) == 1 and _safe(exprs[0])


def _safe(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Const):
        return True
    if isinstance(node, nodes.Name):
        return node.name in _ENGINE_NUMBERS
    if isinstance(node, nodes.Filter):
        if node.name in _NUMBER_FILTERS:
            return True
        # `string` and `trim` keep what a safe value renders to; other filters may add.
        return node.name in ("string", "trim") and node.node is not None and _safe(node.node)
    if isinstance(node, nodes.CondExpr):
        # `',' if not loop.last`: whatever the test, only safe branches are shown.
        both = _safe(node.expr1) and (node.expr2 is None or _safe(node.expr2))
        return both or _allow_listed(node)
    return False


def _allow_listed(node: nodes.CondExpr) -> bool:
    """`x if x in ['a', 'b'] else <safe>`: x is shown only when it is one of the words."""
    test = node.test
    if not (isinstance(test, nodes.Compare) and len(test.ops) == 1):
        return False
    op = test.ops[0]
    words = op.expr
    if op.op != "in" or not isinstance(words, nodes.List | nodes.Tuple):
        return False
    plain = all(
        isinstance(w, nodes.Const)
        and (not isinstance(w.value, str) or _PLAIN_WORD.fullmatch(w.value) is not None)
        for w in words.items
    )
    shown = node.expr1 == test.expr or _safe(node.expr1)
    return plain and shown and (node.expr2 is None or _safe(node.expr2))


def _name_of(template: str) -> str:
    """The variable a template shows (`{{ row.id }}` -> id), for the fix's placeholder."""
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", template.split("|", 1)[0])
    return words[-1] if words else "value"


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
    """Every template pasted into the SQL of a postgres, duckdb or spark task (a cursor
    loop's `claim` and a jdbc input's `query` included), in step order: inside a literal,
    a quoted identifier, a comment or bare, the safe ones (`safe_template`) left out.

    `file` names the playbook in the warnings (default: `playbook.file`). At most
    `MAX_WARNINGS`: a machine-made playbook with a million pasted templates is checked in
    bounded time (the server lints at registration under FLOWTIDE_SQL_STRICT).
    """
    lines = playbook.text.splitlines()
    where = file if file is not None else playbook.file
    warnings: list[SqlWarning] = []
    seen: set[SqlWarning] = set()
    for step_name, field, task, sql, dialect in _sql_fields(playbook):
        # Templates come in text order: each is looked for from the line of the one before
        # (the next line when it sits on a later SQL line), so repeated SQL lines map to
        # their own YAML lines. Rows are counted from the template before: linear.
        line, sql_row, row, counted = task.line, 0, 0, 0
        for place in placements(sql, dialect):
            if len(warnings) >= MAX_WARNINGS:
                return warnings
            offset, template = place.offset, place.template
            after_minus = place.position == "bare" and sql[offset - 1 : offset] == "-"
            if safe_template(template) and not after_minus:
                continue
            row, counted = row + sql.count("\n", counted, offset), offset
            start = sql.rfind("\n", 0, offset) + 1
            stop = sql.find("\n", offset)
            sql_line = sql[start : len(sql) if stop < 0 else stop].strip()
            needles = (sql_line, template.split("\n", 1)[0])
            if line is not None:
                # A later SQL row is on a later YAML line in a block scalar; in a quoted
                # one (`"a\nb"`) it is on the same line.
                later = row > sql_row and bool(warnings) and warnings[-1].field == field
                line = (later and _line_of(lines, line + 1, needles)) or (
                    _line_of(lines, line, needles) or line
                )
            sql_row = row
            warning = SqlWarning(
                file=where,
                line=line,
                step=step_name,
                field=field,
                template=" ".join(template.split()),
                position=place.position,
                form=place.form,
                role=place.role,
                tool=dialect,
                after_minus=after_minus,
            )
            if warning not in seen:  # the same template twice on one line: one warning
                seen.add(warning)
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
    dialect = task.kind
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
                yield step, f"{label}.inputs.{name}.query", task, spec["query"], "jdbc"


def _line_of(lines: list[str], start: int, needles: tuple[str, ...]) -> int | None:
    """The first line at or after the task's own that holds a needle, tried in order: the
    SQL line around the template (as a block scalar keeps it), then the template alone
    (the model keeps the task's line, not each field's); None when none holds one."""
    for needle in needles:
        for number in range(start, len(lines) + 1):
            if needle in lines[number - 1]:
                return number
    return None
