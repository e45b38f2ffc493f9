"""Template values in a shell script, passed as environment variables, never as code.

NoETL runs a `kind: shell` command with `/bin/sh -c` after rendering it, so a value that
holds `"; rm -rf ~` or `$(...)` becomes part of the script. flowtide runs the same
scripts with the same shell, but renders no value into the script's text:
`shell_script` replaces each `{{ expression }}` with a reference to an environment
variable, quoted for the place it stands in, and the tool sets the variables to the
rendered values. A shell expands a variable without reading its value as code, so the
script does what its author wrote whatever the values hold.

    echo "Project: {{ project_id }}"   ->  echo "Project: ${FLOWTIDE_ARG_1}"
    cd {{ folder }}                    ->  cd "${FLOWTIDE_ARG_1}"
    grep '{{ pattern }}' log.txt       ->  grep ''"${FLOWTIDE_ARG_1}"'' log.txt
    cat <<EOF ... {{ x }} ... EOF      ->  cat <<EOF ... ${FLOWTIDE_ARG_1} ... EOF

What the value means is the same as NoETL's in every one of these places (one word,
spaces and all, where the author quoted it or not), with one difference: an unquoted
value is not split into several words or globbed. Two places cannot take a value this
way and are refused, when the playbook is loaded and when the step runs: a `{% ... %}`
block (it would decide the script's text from values; compute the value in `set` or
`input` instead) and a quoted here-document (`<<'EOF'`, whose body no shell expands:
its text is often code for another interpreter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flowtide.errors import FlowtideError

__all__ = ["ShellScript", "ShellTemplateError", "shell_script", "variable"]

_EXPRESSION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_BLOCK = re.compile(r"\{%|\{#")
_HEREDOC = re.compile(r"<<(-?)[ \t]*(?:'([^'\n]*)'|\"([^\"\n]*)\"|\\?([A-Za-z0-9_]+))")


class ShellTemplateError(FlowtideError):
    """A template stands where a shell script cannot take it as a value."""


@dataclass(frozen=True)
class ShellScript:
    """The script to run (`${FLOWTIDE_ARG_<n>}` where the templates were) and the
    expressions whose values the variables hold, in order (n = index + 1)."""

    text: str
    expressions: tuple[str, ...]


def variable(n: int) -> str:
    """The name of the variable that holds the value of the n-th template (1-based)."""
    return f"FLOWTIDE_ARG_{n}"


def shell_script(text: str) -> ShellScript:
    """`text` with its `{{ }}` templates replaced by quoted variable references.

    Raises:
        ShellTemplateError: a `{% %}` block or `{# #}` comment, or a template in a quoted
            here-document.
    """
    if "{{" not in text and "{%" not in text and "{#" not in text:
        return ShellScript(text, ())
    block = _BLOCK.search(text)
    if block is not None:
        raise ShellTemplateError(
            f"a `{block.group()}` block in a shell script (line {_line(text, block.start())}):"
            " only `{{ value }}` templates may stand in a shell command, each passed to the"
            " shell as a variable; compute the value in `set` or `input` instead"
        )
    out: list[str] = []
    expressions: list[str] = []
    # The quoting in force: N (none), S ('...'), D ("..."), B (`...`, or $(...) as N).
    stack = ["N"]
    heredocs: list[tuple[str, bool, bool]] = []  # (delimiter, quoted, strip tabs)
    in_heredoc: tuple[str, bool, bool] | None = None
    line_start = 0
    i = 0
    n = len(text)
    while i < n:
        match = _EXPRESSION.match(text, i)
        if match is not None:
            # Jinja's whitespace control (`{{- x -}}`) has no meaning for a variable.
            expressions.append(match.group(1).strip().removeprefix("-").removesuffix("-").strip())
            name = variable(len(expressions))
            if in_heredoc is not None:
                if in_heredoc[1]:
                    raise ShellTemplateError(
                        f"a template in the quoted here-document <<'{in_heredoc[0]}' (line"
                        f" {_line(text, i)}): no shell expands its body, so the value would"
                        " become its text; use an unquoted <<" + in_heredoc[0] + " or pass"
                        " the value in `env`"
                    )
                out.append("${" + name + "}")
            else:
                out.append(_reference(stack[-1], name))
            i = match.end()
            continue
        ch = text[i]
        if in_heredoc is not None:
            if ch == "\n":
                line = text[line_start:i]
                if (line.lstrip("\t") if in_heredoc[2] else line) == in_heredoc[0]:
                    in_heredoc = heredocs.pop(0) if heredocs else None
                line_start = i + 1
            out.append(ch)
            i += 1
            continue
        state = stack[-1]
        if state == "S":
            if ch == "'":
                stack.pop()
        elif ch == "\\" and i + 1 < n:
            out.append(text[i : i + 2])
            i += 2
            continue
        elif state == "D" and ch == '"':
            stack.pop()
        elif ch == "$" and text.startswith("$(", i):
            stack.append("N")
            out.append("$(")
            i += 2
            continue
        elif ch == "`":
            if state == "B":
                stack.pop()
            else:
                stack.append("B")
        elif state != "D":
            if ch == "'":
                stack.append("S")
            elif ch == '"':
                stack.append("D")
            elif ch == ")" and len(stack) > 1 and state == "N":
                stack.pop()
            elif ch == "<" and text.startswith("<<", i) and not text.startswith("<<<", i):
                heredoc = _HEREDOC.match(text, i)
                if heredoc is not None:
                    strip, single, double, bare = heredoc.groups()
                    delimiter = single if single is not None else double if double else bare
                    quoted = single is not None or double is not None or "\\" in heredoc.group()
                    heredocs.append((delimiter or "", quoted, strip == "-"))
                    out.append(heredoc.group())
                    i = heredoc.end()
                    continue
        if ch == "\n":
            line_start = i + 1
            if heredocs and stack[-1] != "S" and stack[-1] != "D":
                in_heredoc = heredocs.pop(0)
        out.append(ch)
        i += 1
    return ShellScript("".join(out), tuple(expressions))


def _reference(state: str, name: str) -> str:
    if state == "D":
        return "${" + name + "}"
    if state == "S":
        # Close the single quotes, put the value in double quotes, open them again.
        return "'\"${" + name + "}\"'"
    return '"${' + name + '}"'


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1
