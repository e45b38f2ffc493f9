"""The `shell` tool: run a list of commands, one after the other, and return what they
printed and how they exited.

The fields are NoETL's (its `noetl/tools/shell/executor.py`): `cmds` (a list of command
strings; `cmd` or `command` for one), `env`, `cwd`, `timeout_seconds` (per command,
default 600; flowtide's `timeout` too, the smaller wins), and the result is its shape::

    {"status": "ok",
     "data": {"returncode": 0, "stdout": "...", "stderr": "...", "duration_ms": 12,
              "commands": [{"cmd_preview": "first line", "returncode": 0, "stdout": "...",
                            "stderr": "...", "duration_ms": 12, "truncated": false}]},
     "text": "<stdout, else stderr>"}

Where flowtide differs, for safety:

* **Values never become code.** As in NoETL, each command runs with `/bin/sh -c`, but its
  templates are not pasted into the script: each `{{ expression }}` becomes a variable
  reference (`"${FLOWTIDE_ARG_1}"`, quoted for where it stands) and the variable holds
  the rendered value (`flowtide.playbook.shellvalues`), so a value holding `"; rm -rf`
  or `$(...)` is text to the script. An unquoted value stays one word (NoETL's shell
  would split it). `{% %}` blocks and templates in a quoted here-document are refused.
  `shell: false` runs each rendered command as an argument list (`shlex.split`) with no
  shell at all; there, what only a shell understands (`|`, `;`, `>`, `$VAR`, a second
  line...) outside quotes is refused, never run differently.
* The environment is not the worker's: PATH, LANG, LC_*, TZ, TMPDIR, HOME and the
  variables templates may see, then the task's `env` (as python steps get).
* A relative `cwd` is taken from the playbook's folder.
* Each stream keeps at most `max_output` bytes per command (default 256 KiB; the rest
  is dropped and `truncated` says so).
* A command that exits non-zero stops the list and fails the task: `ToolError` kind
  `shell_error` (code = the exit status), its `data` the result above with `status:
  error`, which policies see as `output.data`. A command past its timeout is killed
  with its process group: kind `timeout`, retryable. A cancelled execution kills the
  running command: kind `cancelled`. A program that cannot be started: `shell_error`
  with code 127 (not found) or 126, as sh says.
* On a worker running as root, commands run as the python steps' user (`--python-user`,
  `nobody` by default), never as root unasked.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from flowtide.errors import ToolError
from flowtide.playbook.shellsyntax import normalize_command, shell_syntax
from flowtide.playbook.shellvalues import ShellTemplateError, shell_script, variable
from flowtide.playbook.template import render, render_string
from flowtide.tools.base import ToolContext, positive_field, seconds
from flowtide.tools.process import (
    Finished,
    Launch,
    RunsPrograms,
    runner_user,
    start_error,
    stopped_error,
)

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "DEFAULT_TIMEOUT",
    "ShellTool",
    "command_argv",
    "last_line",
    "launch_of",
]

DEFAULT_TIMEOUT = 600.0
DEFAULT_OUTPUT_LIMIT = 256 * 1024
SHELL = "/bin/sh"
_FALSE_WORDS = frozenset({"false", "0", "no", "off", ""})


def _invalid(message: str) -> ToolError:
    return ToolError(message, kind="config_error")


def _commands(config: Mapping[str, Any]) -> list[str]:
    raw = config.get("cmds")
    if raw in (None, "", []):
        raw = config.get("cmd") if config.get("cmd") not in (None, "") else config.get("command")
    items = raw if isinstance(raw, list) else [raw] if raw not in (None, "") else []
    if not items:
        raise _invalid("shell task has no command: set `cmds` (a list of commands)")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, str | int | float):
            raise _invalid(f"cmds[{i}]: expected a command string, not {type(item).__name__}")
        out.append(str(item))
    return out


def flag(value: Any, name: str) -> bool:
    """A yes/no field (a YAML bool, or text after rendering)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE_WORDS
    if isinstance(value, int | float):
        return bool(value)
    raise _invalid(f"`{name}` must be true or false, not {type(value).__name__}")


def _text(value: Any) -> str:
    """A rendered value as the text a template pasted into a command would have been
    (JSON for a list or a mapping, as `env` values are)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return "" if value is None else str(value)


def shell_command(raw: str, index: int, ctx: ToolContext) -> tuple[str, list[str], dict[str, str]]:
    """Command `index` as written (`raw`, templates and all) ready to run: the script's
    text (`${FLOWTIDE_ARG_<n>}` where its templates were), its argv, and the variables
    holding the templates' values.

    Raises:
        ToolError: config_error (a template where no value can go, an empty command);
            TemplateError from rendering a value.
    """
    try:
        script = shell_script(raw)
    except ShellTemplateError as exc:
        raise _invalid(f"cmds[{index}]: {exc}") from None
    if not script.text.strip():
        raise _invalid(f"cmds[{index}] is empty")
    values = {
        variable(n): _text(
            render_string(
                "{{ " + expression + " }}",
                ctx.render_context,
                step=ctx.step,
                field=f"cmds[{index}]",
            )
        )
        for n, expression in enumerate(script.expressions, 1)
    }
    return script.text, [SHELL, "-c", script.text], values


def command_argv(text: str, index: int) -> list[str]:
    """The words of command `index` (rendered), for `shell: false`.

    Raises:
        ToolError: config_error, the command is empty or needs a shell.
    """
    line = normalize_command(text)
    problem = shell_syntax(line)
    if problem is not None:
        raise _invalid(
            f"cmds[{index}] uses shell syntax, {problem}, outside quotes, and the task says"
            " `shell: false` (no shell): drop `shell: false` to run it with /bin/sh, or"
            " quote a value that holds such characters with `{{ value | shlex_quote }}`"
        )
    argv = shlex.split(line)
    if not argv:
        raise _invalid(f"cmds[{index}] is empty")
    return argv


def _environment(extra: Any, user: Any, key: str) -> dict[str, str]:
    """What python steps get (`user`'s HOME), then the task's `env` mapping `extra` (a
    None value is left out, a list or mapping is passed as its JSON text, a bool as
    true/false)."""
    from flowtide.tools.python_pool import child_environment
    from flowtide.tools.registry import get_tool

    embedded = bool(getattr(get_tool("python").isolation, "embedded", True))
    env = child_environment(user, embedded=embedded)
    if extra in (None, ""):
        return env
    if not isinstance(extra, Mapping):
        raise _invalid(f"`{key}` must be a mapping of variable names to values")
    for name, value in extra.items():
        if value is None:
            continue
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise _invalid(f"`{key}`: {name!r} is not a variable name")
        if isinstance(value, bool):
            env[name] = "true" if value else "false"
        else:
            env[name] = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return env


def _working_dir(config: Mapping[str, Any], ctx: ToolContext) -> Path | None:
    """`cwd`, relative to the playbook's folder; None when unset."""
    raw = config.get("cwd")
    if raw in (None, ""):
        return None
    path = Path(str(raw)).expanduser()
    if not path.is_absolute():
        path = Path(ctx.base_dir) / path
    if not path.is_dir():
        raise _invalid(f"`cwd`: no such directory {str(path)!r}")
    return path


def launch_of(config: Mapping[str, Any], ctx: ToolContext, env: Any, env_key: str) -> Launch:
    """How the task's programs run: its `cwd`, `max_output` and the `env` mapping (named
    `env_key` in messages), as the python steps' user.

    Raises:
        ToolError: config_error, a field that is not understood.
    """
    user = runner_user()
    limit = positive_field(config, "max_output", what="a number of bytes")
    return Launch(
        user=user,
        env=_environment(env, user, env_key),
        cwd=_working_dir(config, ctx),
        limit=int(limit or DEFAULT_OUTPUT_LIMIT),
        cancelled=ctx.cancelled,
        owner=ctx.execution_id,
        log=ctx.log,
    )


def _preview(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0][:120] if stripped else ""


def _record(text: str, run: Finished) -> dict[str, Any]:
    return {
        "cmd_preview": _preview(text),
        "returncode": run.returncode,
        "stdout": run.stdout,
        "stderr": run.stderr,
        "duration_ms": int(run.duration * 1000),
        "truncated": bool(run.stdout_dropped or run.stderr_dropped),
    }


def _result(status: str, records: list[dict[str, Any]], started: float) -> dict[str, Any]:
    stdout = "\n".join(r["stdout"] for r in records if r["stdout"])
    stderr = "\n".join(r["stderr"] for r in records if r["stderr"])
    return {
        "status": status,
        "data": {
            "returncode": records[-1]["returncode"] if records else 0,
            "stdout": stdout,
            "stderr": stderr,
            "commands": records,
            "duration_ms": int((time.monotonic() - started) * 1000),
        },
        "text": stdout or stderr,
    }


class ShellTool(RunsPrograms):
    """Run commands without a shell unless asked (tool kind `shell`); see the module
    docstring."""

    kind = "shell"

    def run(self, config: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        # The commands arrive as written (ToolSpec.unrendered): with a shell, their
        # templates' values travel as variables; without one, they are rendered here.
        raws = _commands(config)
        use_shell = flag(config.get("shell", True), "shell")
        # Every command is checked (and its values rendered) before the first one runs.
        planned: list[tuple[str, list[str], dict[str, str]]] = []
        for i, raw in enumerate(raws):
            if use_shell:
                planned.append(shell_command(raw, i, ctx))
            else:
                text = str(render(raw, ctx.render_context, step=ctx.step, field=f"cmds[{i}]"))
                planned.append((text, command_argv(text, i), {}))
        timeout = seconds(config, ctx, "timeout_seconds", default=DEFAULT_TIMEOUT)
        assert timeout is not None
        launch = launch_of(config, ctx, config.get("env"), "env")
        started = time.monotonic()
        records: list[dict[str, Any]] = []
        for index, (text, argv, values) in enumerate(planned):
            try:
                run = replace(launch, env={**launch.env, **values}).run(argv, timeout)
            except OSError as exc:
                error = start_error(exc, argv[0], f"cmds[{index}]", launch.user)
                records.append(
                    {**_record(text, _unstarted(int(error.code or 126))), "stderr": error.message}
                )
                error.data = _result("error", records, started)
                raise error from None
            records.append(_record(text, run))
            failure = _failure(index, text, run, timeout)
            if failure is not None:
                failure.data = _result("error", records, started)
                raise failure
        return _result("ok", records, started)


def _unstarted(code: int) -> Finished:
    return Finished(code, "", "", 0, 0, 0.0, None)


def _failure(index: int, text: str, run: Finished, timeout: float) -> ToolError | None:
    what = f"cmds[{index}] ({_preview(text) or '<empty>'})"
    stopped = stopped_error(what, run, timeout)
    if stopped is not None or run.returncode == 0:
        return stopped
    how = (
        f"was killed by signal {-run.returncode}"
        if run.returncode < 0
        else f"exited with status {run.returncode}"
    )
    return ToolError(
        f"{what} {how}{last_line(run.stderr)}", kind="shell_error", code=str(run.returncode)
    )


def last_line(text: str) -> str:
    """`: <the last line of text>` (what a failing program said last), or nothing."""
    lines = text.strip().splitlines()
    return f": {lines[-1][:300]}" if lines else ""
