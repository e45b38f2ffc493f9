"""A step's processes die with it, also those that try to get away: a grandchild that
left the step's session (`setsid`, a double fork) and cleared its environment (so the
step's mark is not on it), from a python step and from a shell step; on the step's
timeout, on cancel, and when the process that ran the step shuts down. Both ways
`flowtide.tools.reaper` holds a step: its own cgroup (where this machine gives one) and
the subreaper alone (cgroups turned off)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flowtide.errors import ToolError
from flowtide.tools import reaper
from flowtide.tools.base import ToolContext
from flowtide.tools.python import PythonTool
from flowtide.tools.python_pool import Isolation
from flowtide.tools.shell import ShellTool
from pyuser import PYTHON_USER, writable

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def python_code(pid_file: Path) -> str:
    """Double fork, setsid, and exec with an empty environment; then wait."""
    return textwrap.dedent(
        f"""\
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open({str(pid_file)!r}, 'w').write(str(os.getpid()))
                os.execve('/bin/sleep', ['sleep', '300'], {{}})
            os._exit(0)
        os.wait()
        time.sleep(3600)
        """
    )


def shell_command(pid_file: Path) -> str:
    return f"sh -c 'setsid env -i /bin/sleep 300 >/dev/null 2>&1 & echo $! > {pid_file}; sleep 100'"


def gone(pid: int) -> bool:
    """Gone, or a zombie (it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def escaped_pid(pid_file: Path, seconds: float = 20.0) -> int:
    """The pid the step wrote, once its process runs `sleep` with an empty environment."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            pid = int(pid_file.read_text())
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            if "(sleep)" in stat:
                return pid
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"the step never started its escaping sleep ({pid_file})")


def in_step_cgroup(pid: int) -> bool:
    """Whether `pid` is in a step's cgroup (`flowtide-<pid>/s<n>`)."""
    with open(f"/proc/{pid}/cgroup") as f:
        line = next(x for x in f.read().splitlines() if x.startswith("0::"))
    return "/flowtide-" in line


def assert_dies(pid: int, what: str) -> None:
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if not gone(pid):
        os.kill(pid, 9)  # do not leave it behind for the next tests
        raise AssertionError(f"the setsid, environment-less grandchild survived {what}")


@pytest.fixture(params=["cgroup", "subreaper"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "cgroup":
        if reaper.cgroup_base() is None:
            pytest.skip("no cgroup v2 this process may write to here")
    else:
        monkeypatch.setattr(reaper, "_base_known", True)
        monkeypatch.setattr(reaper, "_base", None)
    yield request.param


@pytest.fixture
def out(open_dir: Path) -> Path:
    return writable(open_dir / "out") / "pid"


@pytest.fixture
def python() -> Iterator[PythonTool]:
    tool = PythonTool(isolation=Isolation(mode="process", user=PYTHON_USER))
    yield tool
    tool.configure(Isolation())


def ctx(**fields: Any) -> ToolContext:
    return ToolContext(execution_id=7, step="s", task="t", base_dir=Path.cwd(), **fields)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(call())
        except ToolError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def test_no_cgroup_to_be_had_is_said_by_none_not_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reaper, "_cgroup2_mount", lambda: Path("/nonexistent/cgroup2"))
    assert reaper._make_base() is None
    monkeypatch.setattr(reaper, "_cgroup2_mount", lambda: None)
    assert reaper._make_base() is None


# -- on the step's timeout -----------------------------------------------------------------


def test_python_step_timeout(mode: str, python: PythonTool, out: Path) -> None:
    thread, outcome = in_thread(
        lambda: python.run({"code": python_code(out), "timeout": 1.0}, ctx())
    )
    pid = escaped_pid(out)
    assert in_step_cgroup(pid) == (mode == "cgroup")
    thread.join(20)
    assert isinstance(outcome[0], ToolError) and outcome[0].kind == "timeout"
    assert_dies(pid, f"the python step's timeout ({mode})")


def test_shell_step_timeout(mode: str, out: Path) -> None:
    config = {"cmds": [shell_command(out)], "timeout_seconds": 0.6}
    thread, outcome = in_thread(lambda: ShellTool().run(config, ctx()))
    pid = escaped_pid(out)
    assert in_step_cgroup(pid) == (mode == "cgroup")
    thread.join(20)
    assert isinstance(outcome[0], ToolError) and outcome[0].kind == "timeout"
    assert_dies(pid, f"the shell step's timeout ({mode})")


# -- on cancel ---------------------------------------------------------------------------


def test_python_step_cancel(mode: str, python: PythonTool, out: Path) -> None:
    thread, outcome = in_thread(lambda: python.run({"code": python_code(out)}, ctx()))
    pid = escaped_pid(out)
    assert python.cancel(7) == 1
    thread.join(20)
    assert isinstance(outcome[0], ToolError) and outcome[0].kind == "cancelled"
    assert_dies(pid, f"the python step's cancel ({mode})")


def test_shell_step_cancel(mode: str, out: Path) -> None:
    tool = ShellTool()
    thread, outcome = in_thread(lambda: tool.run({"cmds": [shell_command(out)]}, ctx()))
    pid = escaped_pid(out)
    assert tool.cancel(7) == 1
    thread.join(20)
    assert isinstance(outcome[0], ToolError) and outcome[0].kind == "cancelled"
    assert_dies(pid, f"the shell step's cancel ({mode})")


# -- when the process that runs the step shuts down ---------------------------------------

_SHUTDOWN = """\
import sys, threading
from pathlib import Path
from flowtide.tools import reaper
from flowtide.tools.base import ToolContext
from flowtide.tools.python import PythonTool
from flowtide.tools.python_pool import Isolation
from flowtide.tools.shell import ShellTool
if sys.argv[1] == "subreaper":
    reaper._base_known, reaper._base = True, None
ctx = ToolContext(execution_id=7, step="s", task="t", base_dir=Path.cwd())
python = PythonTool(isolation=Isolation(mode="process", user=sys.argv[4] or None))
calls = [
    lambda: python.run({"code": sys.argv[2]}, ctx),
    lambda: ShellTool().run({"cmds": [sys.argv[3]]}, ctx),
]
def quietly(call):
    try:
        call()
    except Exception:
        pass  # cancelled: this process is going
for call in calls:
    threading.Thread(target=quietly, args=(call,), daemon=True).start()
sys.stdin.readline()  # the test says when: then this process exits (atexit runs)
"""


def test_shutdown_of_the_process_running_the_steps(mode: str, open_dir: Path) -> None:
    """A python step and a shell step run in threads of a process that then exits."""
    py_out = writable(open_dir / "py") / "pid"
    sh_out = writable(open_dir / "sh") / "pid"
    argv = [sys.executable, "-c", _SHUTDOWN, mode, python_code(py_out), shell_command(sh_out)]
    argv.append(PYTHON_USER or "")
    with subprocess.Popen(argv, stdin=subprocess.PIPE, text=True) as proc:
        try:
            pids = {"python": escaped_pid(py_out), "shell": escaped_pid(sh_out)}
        except AssertionError:
            proc.kill()
            raise
        proc.communicate("\n", timeout=20)
    assert proc.returncode == 0
    survived = []
    for kind, pid in pids.items():
        try:
            assert_dies(pid, f"the shutdown of the process that ran the {kind} step ({mode})")
        except AssertionError as exc:
            survived.append(str(exc))
    assert not survived, survived
