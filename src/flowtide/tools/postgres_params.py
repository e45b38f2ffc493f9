"""Bind parameters of the SQL tools: `read_params` reads a task's `params` (a list for
positional placeholders, a mapping for named ones; shared by the postgres, duckdb and
spark tools), and `_bind` pairs each statement of a postgres command with what psycopg
sends apart from its text: the mapping for `%(name)s`, the list for `%s` in a single
statement, or `$1..$n` rewritten as named placeholders in any. Mappings go as jsonb.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools.postgres_sql import mask_sql

# `params:` is how a value reaches SQL: handed to the driver, never pasted into the text,
# so a quote in a value cannot end a literal and start a statement of its own.
# What NoETL does (checked in its public source): the Python postgres tool
# (noetl/noetl, noetl/tools/postgres/command.py) has no parameters at all; it renders
# templates into the SQL after doubling single quotes in `with:` values. The newer Rust
# tool runner (noetl/tools, src/tools/postgres.rs) takes `params: [...]` bound to
# `$1..$n`, and sends a command that has params as one statement (splitting only
# commands without them). flowtide accepts that list-with-`$n` form, and psycopg's own:
# a mapping for `%(name)s`, a list for `%s`.
_NUMBERED = re.compile(r"(?<![\w$])\$([0-9]+)")


def read_params(
    config: Mapping[str, Any], tool: str, step: str
) -> list[Any] | dict[str, Any] | None:
    """The task's `params`: a list (positional placeholders), a mapping with string keys
    (named placeholders), or None when the task has none.

    Raises:
        ToolError: kind "config_error" for any other shape.
    """
    raw = config.get("params")
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        bad = [repr(k) for k in raw if not isinstance(k, str) or not k]
        if bad:
            raise ToolError(
                f"step '{step}': {tool} `params` keys must be placeholder names, "
                f"not {', '.join(bad)}",
                kind="config_error",
            )
        return dict(raw)
    if isinstance(raw, list | tuple):
        return list(raw)
    raise ToolError(
        f"step '{step}': {tool} `params` must be a list (positional placeholders) or a "
        f"mapping (named placeholders), not {type(raw).__name__}",
        kind="config_error",
    )


def _adapt(value: Any) -> Any:
    """A rendered value as psycopg should send it: mappings (and lists holding any) as
    jsonb, which psycopg does not do by itself; other lists as arrays (`= ANY(%s)`)."""
    from psycopg.types.json import Jsonb

    if isinstance(value, Mapping):
        return Jsonb(dict(value))
    if isinstance(value, list | tuple):
        if any(isinstance(item, Mapping) for item in value):
            return Jsonb(list(value))
        return [_adapt(item) for item in value]
    return value


def _numbered_to_named(
    statement: str, index: int, values: list[Any], step: str
) -> tuple[str, dict[str, Any]]:
    """Rewrite `$n` placeholders as psycopg's `%(n)s` (and every `%` as `%%`, which
    psycopg then reads back as one `%`), binding each to `values[n - 1]`."""
    parts: list[str] = []
    bound: dict[str, Any] = {}
    last = 0
    for match in _NUMBERED.finditer(mask_sql(statement)):
        number = int(match.group(1))
        if not 1 <= number <= len(values):
            raise ToolError(
                f"step '{step}': postgres statement {index} (command_{index}) uses "
                f"${number} but `params` has {len(values)} value(s)",
                kind="config_error",
            )
        parts.append(statement[last : match.start()].replace("%", "%%"))
        parts.append(f"%({number})s")
        bound[str(number)] = values[number - 1]
        last = match.end()
    parts.append(statement[last:].replace("%", "%%"))
    return "".join(parts), bound


def _bind(
    statements: list[str], params: list[Any] | dict[str, Any] | None, step: str
) -> list[tuple[str, Any]]:
    """(SQL, driver parameters) per statement; parameters are None without `params`."""
    if params is None:
        return [(statement, None) for statement in statements]
    if isinstance(params, dict):
        # Every statement gets the whole mapping: each uses the names it needs (psycopg
        # ignores the others), so one command can create, insert and select.
        named = {key: _adapt(value) for key, value in params.items()}
        return [(statement, named) for statement in statements]
    values = [_adapt(value) for value in params]
    if any(_NUMBERED.search(mask_sql(statement)) for statement in statements):
        return [
            _numbered_to_named(statement, index, values, step)
            for index, statement in enumerate(statements)
        ]
    if len(statements) > 1:
        raise ToolError(
            f"step '{step}': postgres `params` is a list, which binds the %s placeholders of "
            f"one statement, and `command` has {len(statements)} statements: use a mapping "
            "(%(name)s placeholders, shared by every statement) or $1..$n",
            kind="config_error",
        )
    return [(statements[0], values)]
