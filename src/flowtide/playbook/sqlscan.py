"""Where each `{{ ... }}` template sits in a SQL text not yet rendered: inside a string
literal, a quoted identifier, a comment, or bare in the SQL (`= {{ id }}`, `LIMIT {{ n
}}`, `FROM {{ table }}`). Pure: a small tokenizer, no database, no SQL parser.

The forms followed, per dialect:

- postgres and duckdb (DuckDB's parser is PostgreSQL's): `'...'` (`''` is a quote),
  `E'...'` (backslash escapes too), `U&'...'`, dollar quotes `$$...$$` and
  `$tag$...$tag$` (a `$` right after an identifier character is part of the identifier,
  and `$1` is a parameter), `"..."` identifiers (`""` is a quote), `--` comments to the
  end of the line and `/* */` comments, which nest.
- spark: `'...'` and `"..."` are both strings with backslash escapes (`r'...'`: raw,
  none), `` `...` `` identifiers (``` `` ``` is a backtick), the same comments.

Jinja markup is skipped whole: quotes inside a template (`{{ x | default('a') }}`) do
not open a literal, and `{% ... %}` / `{# ... #}` are never values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["Placement", "Position", "Role", "placements"]

#: Where a template is: `string` (any literal form, dollar-quoted included),
#: `identifier` (a quoted one), `comment`, or `bare` (in the SQL itself).
Position = Literal["string", "identifier", "comment", "bare"]
#: What a bare template stands for: `value` (an expression: `= {{ id }}`, `IN ({{ ids
#: }})`, `VALUES ({{ a }})`, a function's argument), `limit` (LIMIT/OFFSET/FETCH's
#: count) or `name` (a table or column name, a keyword: `FROM {{ t }}`, `ORDER BY {{ c
#: }}`, `t_{{ suffix }}`). None when not bare.
Role = Literal["value", "limit", "name"]

_JINJA_CLOSE: Final = {"{{": "}}", "{%": "%}", "{#": "#}"}
_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_DOLLAR_TAG: Final = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_IDENT_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$")
# Keywords after which a bare template is a name (a table, a column, a clause word).
_NAME_AFTER: Final = frozenset(
    {"FROM", "JOIN", "INTO", "UPDATE", "TABLE", "BY", "AS", "ASC", "DESC", "SCHEMA", "VIEW"}
    | {"INDEX", "EXISTS", "TRUNCATE", "COPY", "ONLY", "LATERAL", "USING", "SEQUENCE"}
)
# Keywords after which a bare template is a value; after any other word (or another
# template) it is a name or keyword: `ORDER BY a {{ dir }}`, `SELECT a {{ alias }}`.
_VALUE_AFTER: Final = frozenset(
    {"SELECT", "WHERE", "AND", "OR", "NOT", "IN", "THEN", "ELSE", "WHEN", "CASE", "SET"}
    | {"VALUES", "RETURNING", "ON", "HAVING", "BETWEEN", "LIKE", "ILIKE", "IS", "DISTINCT"}
    | {"ANY", "ALL", "SOME", "RETURN", "PERFORM", "INTERVAL", "ARRAY", "DEFAULT"}
)
_LIMIT_AFTER: Final = frozenset({"LIMIT", "OFFSET", "FETCH", "FIRST", "NEXT", "TOP"})
# Clause words remembered so that `ORDER BY a, {{ b }}` (a list of names) is told from
# `IN (1, {{ b }})` (a list of values).
_CLAUSES: Final = frozenset(
    {"SELECT", "FROM", "WHERE", "ORDER", "GROUP", "HAVING", "VALUES", "SET", "ON", "IN"}
    | {"LIMIT", "OFFSET", "RETURNING", "INTO", "UPDATE", "JOIN", "PARTITION", "USING"}
)


@dataclass(frozen=True)
class Placement:
    """One `{{ ... }}` template of a SQL text and where it sits."""

    offset: int
    template: str
    position: Position
    #: The form it sits in: `'...'`, `E'...'`, `U&'...'`, `"..."` (spark: a string),
    #: `$$...$$`, `$tag$...$tag$`, `` `...` ``, `--`, `/* */`; "" when bare.
    form: str = ""
    role: Role | None = None


def placements(sql: str, dialect: str = "postgres") -> list[Placement]:
    """Every `{{ ... }}` template of `sql`, in text order, with its position."""
    return _Scanner(sql, dialect).run()


class _Scanner:
    def __init__(self, sql: str, dialect: str) -> None:
        self.sql = sql
        self.n = len(sql)
        self.spark = dialect == "spark"
        self.found: list[Placement] = []
        # The last two significant tokens (upper-cased words, punctuation), nearest first,
        # and the last clause word: what a bare template's role is read from.
        self.recent: list[str] = ["", ""]
        self.clause = ""

    def run(self) -> list[Placement]:
        sql, n, i = self.sql, self.n, 0
        while i < n:
            if sql[i] == "{" and sql[i : i + 2] in _JINJA_CLOSE:
                end = self._jinja_end(i)
                if sql[i + 1] == "{":
                    self.found.append(Placement(i, sql[i:end], "bare", role=self._role(i, end)))
                    self._token("{{}}")
                i = end
                continue
            i = self._step(i)
        return self.found

    # -- the SQL around templates ----------------------------------------------------

    def _step(self, i: int) -> int:
        sql, ch = self.sql, self.sql[i]
        if sql.startswith("--", i):
            return self._comment_line(i)
        if sql.startswith("/*", i):
            return self._comment_block(i)
        if ch == "'":
            if self.spark:
                raw = i > 0 and sql[i - 1] in "rR" and not self._ident_before(i - 1)
                return self._quoted(i, "'", "string", "r'...'" if raw else "'...'", not raw)
            prefix = sql[max(0, i - 2) : i]
            if prefix[-1:] in ("e", "E") and not self._ident_before(i - 1):
                return self._quoted(i, "'", "string", "E'...'", True)
            if prefix.upper() == "U&" and not self._ident_before(i - 2):
                return self._quoted(i, "'", "string", "U&'...'", False)
            return self._quoted(i, "'", "string", "'...'", False)
        if ch == '"':
            if self.spark:
                raw = i > 0 and sql[i - 1] in "rR" and not self._ident_before(i - 1)
                return self._quoted(i, '"', "string", 'r"..."' if raw else '"..."', not raw)
            return self._quoted(i, '"', "identifier", '"..."', False)
        if ch == "`" and self.spark:
            return self._quoted(i, "`", "identifier", "`...`", False)
        if ch == "$" and not self.spark and not self._ident_before(i):
            match = _DOLLAR_TAG.match(sql, i)
            if match is not None:
                return self._dollar(i, match.group(0))
        if ch.isspace():
            return i + 1
        word = _WORD.match(sql, i) if ch.isalpha() or ch == "_" else None
        if word is not None:
            self._token(word.group(0).upper())
            return word.end()
        self._token(ch)
        return i + 1

    def _ident_before(self, i: int) -> bool:
        return i > 0 and self.sql[i - 1] in _IDENT_CHARS

    def _token(self, token: str) -> None:
        self.recent = [token, self.recent[0]]
        if token in _CLAUSES:
            self.clause = token

    def _jinja_end(self, i: int) -> int:
        close = self.sql.find(_JINJA_CLOSE[self.sql[i : i + 2]], i + 2)
        return self.n if close < 0 else close + 2

    def _inner(self, start: int, end: int, position: Position, form: str) -> None:
        """Templates of sql[start:end] (a literal's or comment's body), all at `position`."""
        sql, i = self.sql, start
        while i < end:
            j = sql.find("{", i, end)
            if j < 0:
                return
            if sql[j : j + 2] in _JINJA_CLOSE:
                stop = self._jinja_end(j)
                if sql[j + 1] == "{":
                    self.found.append(Placement(j, sql[j:stop], position, form))
                i = stop
            else:
                i = j + 1

    def _skip_jinja(self, i: int) -> int | None:
        """The end of Jinja markup starting at `i`, None when there is none."""
        if self.sql[i : i + 2] in _JINJA_CLOSE:
            return self._jinja_end(i)
        return None

    def _quoted(self, i: int, quote: str, position: Position, form: str, backslash: bool) -> int:
        """A literal or quoted identifier opening at `i`: its templates; where it ends."""
        sql, n, j = self.sql, self.n, i + 1
        while j < n:
            skipped = self._skip_jinja(j)
            if skipped is not None:
                if sql[j + 1] == "{":
                    self.found.append(Placement(j, sql[j:skipped], position, form))
                j = skipped
                continue
            ch = sql[j]
            if backslash and ch == "\\":
                j += 2
                continue
            if ch == quote:
                if sql.startswith(quote * 2, j):
                    j += 2
                    continue
                break
            j += 1
        self._token(quote)
        return j + 1

    def _dollar(self, i: int, tag: str) -> int:
        close = self.sql.find(tag, i + len(tag))
        end = self.n if close < 0 else close
        self._inner(i + len(tag), end, "string", "$$...$$" if tag == "$$" else "$tag$...$tag$")
        self._token("'")
        return self.n if close < 0 else close + len(tag)

    def _comment_line(self, i: int) -> int:
        newline = self.sql.find("\n", i)
        end = self.n if newline < 0 else newline
        self._inner(i, end, "comment", "--")
        return end

    def _comment_block(self, i: int) -> int:
        sql, n, depth, j = self.sql, self.n, 1, i + 2
        while j < n and depth:
            skipped = self._skip_jinja(j)
            if skipped is not None:
                j = skipped
            elif sql.startswith("/*", j):
                depth, j = depth + 1, j + 2
            elif sql.startswith("*/", j):
                depth, j = depth - 1, j + 2
            else:
                j += 1
        self._inner(i, j, "comment", "/* */")
        return j

    # -- a bare template's role ------------------------------------------------------

    def _role(self, start: int, end: int) -> Role:
        sql = self.sql
        before = sql[start - 1] if start else ""
        after = sql[end] if end < self.n else ""
        if before in _IDENT_CHARS or before == "." or after in _IDENT_CHARS or after == ".":
            return "name"  # part of a name: t_{{ x }}, {{ schema }}.t
        last, previous = self.recent
        if last in _LIMIT_AFTER:
            return "limit"
        if last in _NAME_AFTER or (last == ":" and previous == ":"):  # x::{{ type }}
            return "name"
        if last == "," and self.clause in ("ORDER", "GROUP", "FROM", "PARTITION"):
            return "name"
        if last == "{{}}" or (_WORD.fullmatch(last) and last not in _VALUE_AFTER):
            return "name"
        return "value"
