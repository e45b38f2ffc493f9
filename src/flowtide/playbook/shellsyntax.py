"""Shell syntax in a command line that flowtide runs without a shell.

A `kind: shell` command is split into words by POSIX quoting rules (`shlex.split`) and
run as that argument list: no `/bin/sh` reads it, so a pipe, a redirection, a `;`, a
`$VAR` or a backquote in it would reach the program as plain text, and the command would
quietly do something other than what its author meant. `shell_syntax` finds the first
such construct outside quotes, so that the loader (for the text a playbook writes) and
the tool (for the text after rendering, values included) can refuse it and say to write
`shell: true` or to quote the value (`{{ value | shlex_quote }}`).

It also undoes line continuations (a backslash before a newline, outside single quotes),
as a shell would, so that one command may span several lines.
"""

from __future__ import annotations

__all__ = ["normalize_command", "shell_syntax"]

_OPERATORS = {
    "|": "a pipe `|`",
    "&": "`&`",
    ";": "`;`",
    "<": "a redirection `<`",
    ">": "a redirection `>`",
    "(": "`(`",
    ")": "`)`",
}
# `$` starts an expansion when one of these follows it (sh: parameters, `${`, `$(`).
_EXPANDS = (
    frozenset("{(@*#?$!-_")
    | frozenset("abcdefghijklmnopqrstuvwxyz")
    | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
)
# What a backslash escapes inside double quotes (elsewhere there it is literal).
_DQ_ESCAPES = frozenset('$`"\\\n')


def normalize_command(text: str) -> str:
    """`text` without its line continuations (backslash-newline outside single quotes)
    and without the blank lines around it (a YAML `|` block ends with a newline)."""
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote == "'":
            quote = None if ch == "'" else quote
        elif ch == "\\" and i + 1 < len(text):
            if text[i + 1] == "\n":
                i += 2
                continue
            out.append(ch + text[i + 1])
            i += 2
            continue
        elif ch in "'\"" and quote is None:
            quote = ch
        elif ch == '"' and quote == '"':
            quote = None
        out.append(ch)
        i += 1
    return "".join(out).strip()


def shell_syntax(text: str) -> str | None:
    """What in `text` only a shell would understand, outside quotes, named for a message
    ("a pipe `|`", "`$` (a variable or command substitution)"); None when the text is
    plain words. Run it on `normalize_command(text)`."""
    quote: str | None = None
    word_start = True
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if quote == "'":
            if ch == "'":
                quote = None
            i += 1
            continue
        if ch == "\\":
            escaped = text[i + 1] if i + 1 < n else ""
            # Unquoted, a backslash makes the next character literal; in double quotes
            # only the characters a shell escapes there.
            i += 2 if quote is None or escaped in _DQ_ESCAPES else 1
            word_start = False
            continue
        if ch == "`":
            return "a backquote (command substitution)"
        if ch == "$" and i + 1 < n and text[i + 1] in _EXPANDS:
            return "`$` (a variable, `${...}` or `$(...)` substitution)"
        if quote == '"':
            if ch == '"':
                quote = None
            i += 1
            continue
        if ch in "'\"":
            quote = ch
        elif ch in _OPERATORS:
            return _OPERATORS[ch]
        elif ch == "\n":
            return "a second line (a shell reads it as another command)"
        elif ch == "#" and word_start:
            return "`#` (a comment)"
        word_start = ch in " \t"
        i += 1
    if quote is not None:
        return f"an unterminated {quote} quote"
    return None
