"""SQL text without a driver: `mask_sql` blanks out what PostgreSQL would not read as
code (comments, the insides of quoted strings, identifiers and dollar-quoted bodies) at
the same offsets, and `split_sql` uses it to split a script into statements on top-level
semicolons. The SQL tools (postgres, duckdb, spark) use them.
"""

from __future__ import annotations

import re

# `$tag$` opens a dollar-quoted string; the tag follows identifier rules and cannot start
# with a digit, which is what keeps positional parameters such as `$1` out of it.
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$")


def _is_ident_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_$"


def mask_sql(script: str) -> str:
    """`script` with everything that is not SQL code blanked out, at the same offsets.

    Comments become spaces (newlines kept); the insides of single-quoted strings (including
    `E'...'` with backslash escapes), double-quoted identifiers and dollar-quoted bodies
    become `_`, their delimiters stay. A search for `;` or `$1` in the result finds only
    the ones PostgreSQL would read as code.
    """
    out = list(script)
    n = len(script)

    def blank(begin: int, end: int, fill: str) -> None:
        for k in range(begin, min(end, n)):
            if out[k] != "\n":
                out[k] = fill

    i = 0
    while i < n:
        ch = script[i]
        if ch == "-" and script.startswith("--", i):
            newline = script.find("\n", i)
            end = n if newline < 0 else newline
            blank(i, end, " ")
            i = end
            continue
        if ch == "/" and script.startswith("/*", i):
            # PostgreSQL block comments nest, unlike C's.
            begin = i
            depth = 1
            i += 2
            while i < n and depth:
                if script.startswith("/*", i):
                    depth += 1
                    i += 2
                elif script.startswith("*/", i):
                    depth -= 1
                    i += 2
                else:
                    i += 1
            blank(begin, i, " ")
            continue
        if ch == "'":
            prev = script[i - 1] if i else ""
            before = script[i - 2] if i > 1 else ""
            backslash_escapes = prev in "eE" and not _is_ident_char(before)
            begin = i + 1
            i += 1
            while i < n:
                c = script[i]
                if backslash_escapes and c == "\\":
                    i += 2
                    continue
                if c == "'":
                    if i + 1 < n and script[i + 1] == "'":
                        i += 2
                        continue
                    break
                i += 1
            blank(begin, i, "_")
            i += 1
            continue
        if ch == '"':
            begin = i + 1
            i += 1
            while i < n:
                if script[i] == '"':
                    if i + 1 < n and script[i + 1] == '"':
                        i += 2
                        continue
                    break
                i += 1
            blank(begin, i, "_")
            i += 1
            continue
        if ch == "$" and not (i and _is_ident_char(script[i - 1])):
            match = _DOLLAR_TAG.match(script, i)
            if match:
                tag = match.group(0)
                close = script.find(tag, match.end())
                blank(match.end(), n if close < 0 else close, "_")
                i = n if close < 0 else close + len(tag)
                continue
        i += 1
    return "".join(out)


def split_sql(script: str) -> list[str]:
    """Split a SQL script into statements on top-level semicolons.

    Semicolons inside single-quoted strings (including `E'...'` with backslash escapes),
    double-quoted identifiers, dollar-quoted bodies (`$$...$$`, `$tag$...$tag$`), `--` line
    comments and (nested) `/* */` block comments do not split. Pieces holding nothing but
    whitespace and comments are dropped; each statement is returned stripped, without its
    trailing semicolon.
    """
    masked = mask_sql(script)
    statements: list[str] = []
    start = 0
    for end in [*(m.start() for m in re.finditer(";", masked)), len(script)]:
        if masked[start:end].strip():
            statements.append(script[start:end].strip())
        start = end + 1
    return statements
