"""`kind: shell` against real processes: argument lists (no shell unless asked), exit
codes, timeouts and cancellation that kill the process group, env/cwd, output caps, the
`shlex_quote` filter, and a template value holding `; rm -rf` that stays one argument.

When the tests run as root, commands run as `nobody` (the python steps' default user):
the folders they use are made world-readable for that.
"""

from __future__ import annotations

import os
import pwd
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import flowtide
from flowtide.errors import PlaybookError, ToolError
from flowtide.playbook.loader import load_playbook
from flowtide.playbook.shellsyntax import normalize_command, shell_syntax
from flowtide.playbook.template import render
from flowtide.tools.base import ToolContext
from flowtide.tools.shell import ShellTool


def ctx(base: Path | None = None, **fields: Any) -> ToolContext:
    return ToolContext(execution_id=7, step="sh", task="t", base_dir=base or Path.cwd(), **fields)


def run(config: dict[str, Any], **fields: Any) -> dict[str, Any]:
    result = ShellTool().run(config, ctx(**fields))
    assert isinstance(result, dict)
    return result


def fail(config: dict[str, Any], **fields: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        ShellTool().run(config, ctx(**fields))
    return info.value


def gone(pid: int) -> bool:
    """The process is gone (or a zombie nobody reaped yet: it runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---------------------------------------------------------------------------------------
# Results and exit codes
# ---------------------------------------------------------------------------------------


def test_commands_run_as_argument_lists_with_noetl_result_shape() -> None:
    result = run({"cmds": ["printf '%s|' 'a b' c", "echo done"]})
    assert result["status"] == "ok"
    data = result["data"]
    assert data["returncode"] == 0
    assert [c["stdout"] for c in data["commands"]] == ["a b|c|", "done\n"]
    assert data["commands"][0]["cmd_preview"] == "printf '%s|' 'a b' c"
    assert data["stdout"] == "a b|c|\ndone\n"
    assert result["text"] == data["stdout"]
    assert data["commands"][1]["truncated"] is False


def test_cmd_and_command_aliases() -> None:
    assert run({"cmd": "echo one"})["data"]["stdout"] == "one\n"
    assert run({"command": "echo two"})["data"]["stdout"] == "two\n"


def test_non_zero_exit_stops_the_list_and_fails_with_its_output() -> None:
    error = fail({"cmds": ["true", "sh -c 'echo out; echo bad news >&2; exit 3'", "echo never"]})
    assert error.kind == "shell_error" and error.code == "3"
    assert "exited with status 3: bad news" in error.message
    data = error.data
    assert data["status"] == "error"
    assert data["data"]["returncode"] == 3
    assert [c["returncode"] for c in data["data"]["commands"]] == [0, 3]  # the third never ran
    assert data["data"]["stdout"] == "out\n" and data["data"]["stderr"] == "bad news\n"


def test_a_program_that_is_not_there_is_127() -> None:
    error = fail({"cmds": ["/nonexistent/tool --flag"]})
    assert error.kind == "shell_error" and error.code == "127"
    assert error.data["data"]["commands"][0]["returncode"] == 127


def test_the_policy_sees_the_error_kind_through_a_playbook(open_dir: Path) -> None:
    book = open_dir / "pb.yaml"
    book.write_text(
        textwrap.dedent(
            """\
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: shell_policy, path: shell_policy}
            workflow:
            - step: start
              tool:
                kind: shell
                cmds: ["sh -c 'exit 4'"]
                spec:
                  policy:
                    rules:
                      - when: "{{ output.error.kind == 'shell_error' and output.error.code == '4' }}"
                        then: {do: continue}
            """
        )
    )
    doc = flowtide.run(book, home=open_dir / "home")
    assert doc["status"] == "completed", doc
    assert doc["steps"]["start"]["result"]["data"]["returncode"] == 4


# ---------------------------------------------------------------------------------------
# Timeouts, cancellation, process groups
# ---------------------------------------------------------------------------------------


def test_a_process_that_left_the_group_dies_when_the_step_ends() -> None:
    """Issue 31: a daemon started in a session of its own (setsid) is no member of the
    step's group; it still carries the step's mark and dies when the step ends."""
    result = run({"cmds": ["sh -c 'setsid sleep 600 > /dev/null 2>&1 & echo $!'"]})
    pid = int(result["data"]["commands"][0]["stdout"].split()[0])
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid), "the setsid sleep survived its step"


def test_timeout_kills_the_whole_process_group() -> None:
    started = time.monotonic()
    # sh starts a background sleep, prints its pid and waits for it.
    error = fail({"cmds": ["sh -c 'sleep 60 & echo $!; wait'"], "timeout_seconds": 0.5})
    assert time.monotonic() - started < 5
    assert error.kind == "timeout" and error.retryable
    pid = int(error.data["data"]["commands"][0]["stdout"].split()[0])
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid), "the background sleep survived the timeout"


def test_task_timeout_applies_too() -> None:
    error = fail({"cmds": ["sleep 30"]}, timeout=0.3)
    assert error.kind == "timeout"


def test_leftover_background_job_is_killed_when_the_command_returns() -> None:
    started = time.monotonic()
    # The sleep keeps the stdout pipe open: the call must not wait for it.
    result = run({"cmds": ["sh -c 'sleep 60 & echo $!'"]})
    assert time.monotonic() - started < 5
    pid = int(result["data"]["stdout"].split()[0])
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid)


def test_cancellation_kills_the_running_command() -> None:
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    started = time.monotonic()
    error = fail({"cmds": ["sleep 30"]}, cancelled=flag.is_set)
    assert error.kind == "cancelled"
    assert time.monotonic() - started < 5


def test_cancel_running_kills_only_that_executions_commands() -> None:
    from flowtide.tools.registry import cancel_running, get_tool

    get_tool("shell")  # instantiated, as the runtime has it once a step used it
    results: dict[str, Any] = {}

    def run_for(execution_id: int) -> None:
        try:
            results[str(execution_id)] = ShellTool().run(
                {"cmds": ["sleep 1.5"]}, ToolContext(execution_id=execution_id, step="s")
            )
        except ToolError as exc:
            results[str(execution_id)] = exc

    threads = [threading.Thread(target=run_for, args=(n,)) for n in (7, 8)]
    for thread in threads:
        thread.start()
    time.sleep(0.4)
    cancel_running(7)
    for thread in threads:
        thread.join(10)
    assert isinstance(results["7"], ToolError) and results["7"].kind == "cancelled"
    assert results["8"]["status"] == "ok"


# ---------------------------------------------------------------------------------------
# Environment, working directory, output caps, user
# ---------------------------------------------------------------------------------------


def test_env_is_the_tasks_over_a_small_base(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWTIDE_MASTER_KEY", "never-shown")
    result = run({"cmds": ["env"], "env": {"GREETING": "hi there", "FLAG": True, "CFG": {"a": 1}}})
    lines = set(result["data"]["stdout"].splitlines())
    assert {"GREETING=hi there", "FLAG=true", 'CFG={"a": 1}'} <= lines
    assert not any(line.startswith("FLOWTIDE_") for line in lines)
    assert any(line.startswith("PATH=") for line in lines)


def test_cwd_is_relative_to_the_playbook_folder(open_dir: Path) -> None:
    (open_dir / "sub").mkdir()
    (open_dir / "sub").chmod(0o755)
    result = run({"cmds": ["pwd"], "cwd": "sub"}, base=open_dir)
    assert result["data"]["stdout"].strip() == str(open_dir / "sub")
    error = fail({"cmds": ["pwd"], "cwd": "missing"}, base=open_dir)
    assert error.kind == "config_error" and "missing" in error.message


def test_output_is_capped_without_blocking_the_program() -> None:
    result = run({"cmds": ["sh -c 'yes | head -c 300000; echo tail >&2'"], "max_output": 1000})
    command = result["data"]["commands"][0]
    assert len(command["stdout"]) == 1000 and command["truncated"] is True
    assert command["stderr"] == "tail\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root process changes user")
def test_a_root_process_runs_commands_as_the_python_user() -> None:
    result = run({"cmds": ["id -u"]})
    assert int(result["data"]["stdout"]) == pwd.getpwnam("nobody").pw_uid


# ---------------------------------------------------------------------------------------
# No shell unless asked; quoting
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, what",
    [
        ("echo a | wc -l", "pipe"),
        ("echo a; echo b", "`;`"),
        ("echo a > /tmp/x", "redirection"),
        ("echo $HOME", "`$`"),
        ('echo "$(id)"', "`$`"),
        ("echo `id`", "backquote"),
        ("echo a && echo b", "`&`"),
        ("echo a\necho b", "second line"),
        ("echo 'unterminated", "unterminated"),
    ],
)
def test_shell_syntax_is_refused_without_shell(command: str, what: str) -> None:
    error = fail({"cmds": ["echo first", command], "shell": False})
    assert error.kind == "config_error"
    assert what in error.message and "shell: false" in error.message
    assert error.data is None  # nothing ran, not even the first command


@pytest.mark.parametrize(
    "command",
    ["echo 'a | b; c > d $HOME `x`'", 'echo "a | b; c"', "echo a\\|b \\$HOME", "echo a#b"],
)
def test_quoted_or_escaped_characters_are_plain_text(command: str) -> None:
    assert shell_syntax(normalize_command(command)) is None
    assert run({"cmds": [command]})["status"] == "ok"


def test_line_continuations_join_one_command() -> None:
    result = run({"cmds": ["printf '%s-' \\\n  a \\\n  b\n"]})
    assert result["data"]["stdout"] == "a-b-"


def test_shell_true_runs_the_command_with_sh() -> None:
    result = run({"cmds": ["echo a b | wc -w", "X=1; echo ${X}"], "shell": True})
    assert [c["stdout"].strip() for c in result["data"]["commands"]] == ["2", "1"]


def test_shlex_quote_filter() -> None:
    assert render("{{ v | shlex_quote }}", {"v": "it's"}) == "'it'\"'\"'s'"
    assert render("{{ v | shlex_quote }}", {"v": None}) == "''"
    assert render("{{ v | shlex_quote }}", {"v": "plain"}) == "plain"
    assert render("{{ v | shlex_quote }}", {"v": 42}) == "42"
    assert render("{{ v | shlex_quote }}", {"v": ["a b", 1]}) == "'[\"a b\", 1]'"


def test_a_value_with_rm_rf_stays_one_argument(open_dir: Path) -> None:
    canary = open_dir / "canary"
    canary.mkdir()
    canary.chmod(0o777)
    (canary / "keep").write_text("x")
    for value in (f"x; rm -rf {canary}", f'x"; rm -rf {canary}; "', f"$(rm -rf {canary})"):
        scope = {"v": value}
        # With the shell (the default), the value reaches it as a variable, wherever the
        # template stands: unquoted, in double quotes, in single quotes.
        for written in ("printf '[%s]' {{ v }}", 'printf "[%s]" "{{ v }}"', "echo '[{{ v }}]'"):
            result = run({"cmds": [written]}, render_context=scope)
            assert result["data"]["stdout"].strip() == f"[{value}]", written
            # The script that ran (and its preview) holds the variable, not the value.
            assert "FLOWTIDE_ARG_1" in result["data"]["commands"][0]["cmd_preview"]
        # Without a shell, quoted with shlex_quote: one argument; unquoted, a value whose
        # `;` or `$(` would be shell syntax is refused and nothing runs.
        quoted = {"cmds": ["printf '[%s]' {{ v | shlex_quote }}"], "shell": False}
        assert run(quoted, render_context=scope)["data"]["stdout"] == f"[{value}]"
        if ";" in value.split('"')[0] or "$(" in value:
            unquoted = {"cmds": ["printf '[%s]' {{ v }}"], "shell": False}
            assert fail(unquoted, render_context=scope).kind == "config_error"
    assert (canary / "keep").exists()


def test_a_template_where_no_value_can_go_is_refused() -> None:
    block = fail({"cmds": ["{% if x %}rm -rf /tmp/x{% endif %}"]}, render_context={"x": 1})
    assert block.kind == "config_error" and "`{%` block" in block.message
    heredoc = fail({"cmds": ["python - <<'EOF'\nprint({{ x }})\nEOF"]}, render_context={"x": 1})
    assert heredoc.kind == "config_error" and "quoted here-document" in heredoc.message
    trimmed = run({"cmds": ["echo {{- x -}}"]}, render_context={"x": "a b"})
    assert trimmed["data"]["stdout"] == "a b\n"
    # An unquoted here-document expands the variable.
    result = run({"cmds": ["cat <<EOF\nvalue: {{ x }}\nEOF"]}, render_context={"x": "$(id)"})
    assert result["data"]["stdout"] == "value: $(id)\n"


def test_the_rm_rf_value_through_a_playbook(open_dir: Path) -> None:
    canary = open_dir / "canary"
    canary.mkdir()
    (canary / "keep").write_text("x")
    book = open_dir / "pb.yaml"
    book.write_text(
        textwrap.dedent(
            """\
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: shell_quote, path: shell_quote}
            workload: {name: "x"}
            workflow:
            - step: start
              tool:
                kind: shell
                cmds:
                  - echo "<{{ name }}>"
                  - printf '<%s>' {{ name }}
              next: [{step: argv}]
            - step: argv
              tool:
                kind: shell
                shell: false
                cmds: ["printf '<%s>' {{ name | shlex_quote }}"]
            """
        )
    )
    doc = flowtide.run(book, workload={"name": f"x; rm -rf {canary}"}, home=open_dir / "home")
    assert doc["status"] == "completed", doc
    ran = doc["steps"]["start"]["result"]["data"]["commands"]
    assert [c["stdout"] for c in ran] == [f"<x; rm -rf {canary}>\n", f"<x; rm -rf {canary}>"]
    assert doc["steps"]["argv"]["result"]["data"]["stdout"] == f"<x; rm -rf {canary}>"
    assert (canary / "keep").exists()


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def test_validation_names_file_line_step_and_field(tmp_path: Path) -> None:
    book = tmp_path / "bad.yaml"
    book.write_text(
        textwrap.dedent(
            """\
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: bad, path: bad}
            workflow:
            - step: start
              tool:
                kind: shell
                shell: false
                cmds:
                  - echo fine
                  - "cat {{ file }} | wc -l"
            - step: other
              tool: {kind: shell}
            - step: with_shell
              tool: {kind: shell, cmds: ["cat {{ file }} | wc -l"]}
            - step: with_a_block
              tool: {kind: shell, cmds: ["{% if x %}ls{% endif %}"]}
            """
        )
    )
    with pytest.raises(PlaybookError) as info:
        load_playbook(book)
    text = str(info.value)
    assert "step 'with_a_block'" in text and "`{%` block" in text
    assert "bad.yaml:13:" in text and "step 'start'" in text
    assert "tool.cmds[1]" in text and "a pipe `|`" in text
    assert "step 'other'" in text and "'cmds' (a list of commands)" in text
    assert "with_shell" not in text
