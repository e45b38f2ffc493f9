"""Python steps in child processes: what only process isolation has (killing, limits,
the environment and the user the code gets). Results, errors and output capture are
checked against the in-process path by test_python_tool.py, which runs both."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext
from flowtide.tools.python import PythonTool
from flowtide.tools.python_pool import ChildPool, Isolation
from pyuser import PYTHON_USER

SLEEP = "import time\ntime.sleep(3600)\n"


def make_ctx(**kwargs: Any) -> ToolContext:
    kwargs.setdefault("execution_id", 7)
    kwargs.setdefault("step", "step")
    return ToolContext(**kwargs)


@pytest.fixture
def tool() -> Iterator[PythonTool]:
    t = PythonTool(isolation=Isolation(mode="process", user=PYTHON_USER))
    yield t
    t.configure(Isolation())


def error_of(tool: PythonTool, config: dict[str, Any], ctx: ToolContext | None = None) -> ToolError:
    with pytest.raises(ToolError) as info:
        tool.run(config, ctx or make_ctx())
    return info.value


def test_timeout_kills_code_blocked_in_c_and_the_child_is_replaced(tool: PythonTool) -> None:
    started = time.monotonic()
    err = error_of(tool, {"code": SLEEP, "timeout": 0.5})
    assert err.kind == "timeout" and err.retryable
    assert "killed" in err.message
    assert time.monotonic() - started < 2.0
    assert tool.pool().counts() == {"idle": 0, "busy": 0}
    assert tool.run({"code": "result = 1"}, make_ctx()) == 1


def test_cancel_kills_only_that_executions_children(tool: PythonTool) -> None:
    outcomes: dict[int, Any] = {}

    def call(i: int, execution_id: int) -> None:
        try:
            outcomes[i] = tool.run({"code": SLEEP}, make_ctx(execution_id=execution_id))
        except ToolError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=call, args=(i, 1 if i < 2 else 2)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while tool.pool().counts()["busy"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    assert tool.cancel(1) == 2
    threads[0].join(5)
    threads[1].join(5)
    assert time.monotonic() - started < 2.0
    assert [outcomes[i].kind for i in (0, 1)] == ["cancelled", "cancelled"]
    assert threads[2].is_alive()
    assert tool.cancel(None) == 1
    threads[2].join(5)
    assert outcomes[2].kind == "cancelled"
    assert tool.pool().counts()["busy"] == 0


def test_ctx_cancelled_is_asked_while_the_code_runs(tool: PythonTool) -> None:
    stop_at = time.monotonic() + 0.3
    ctx = make_ctx(cancelled=lambda: time.monotonic() > stop_at)
    err = error_of(tool, {"code": SLEEP}, ctx)
    assert err.kind == "cancelled"
    assert time.monotonic() - stop_at < 1.5


def test_memory_limit_is_a_clear_error_and_the_child_is_recycled() -> None:
    tool = PythonTool(isolation=Isolation(mode="process", user=PYTHON_USER, memory_mb=300))
    try:
        err = error_of(tool, {"code": "x = bytearray(600 * 1024 * 1024)"})
        assert err.kind == "python_error" and err.code == "MemoryError"
        assert "300 MiB" in err.message and "--python-memory-mb" in err.message
        assert tool.pool().counts() == {"idle": 0, "busy": 0}
        assert tool.run({"code": "result = len(bytearray(1024))"}, make_ctx()) == 1024
    finally:
        tool.configure(Isolation())


def test_a_dead_child_is_a_crash_with_its_exit_status(tool: PythonTool) -> None:
    err = error_of(tool, {"code": "import os\nos._exit(3)"})
    assert err.kind == "crashed"
    assert "exit code 3" in err.message and err.data["exit_status"] == 3
    err = error_of(tool, {"code": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"})
    assert err.kind == "crashed" and err.code == "SIGKILL"
    assert "out of memory?" in err.message and "2048 MiB" in err.message
    assert tool.run({"code": "result = 'fresh'"}, make_ctx()) == "fresh"


def test_cpu_limit() -> None:
    tool = PythonTool(isolation=Isolation(mode="process", user=PYTHON_USER, cpu_seconds=0.3))
    try:
        started = time.monotonic()
        err = error_of(tool, {"code": "while True:\n    pass\n"})
        assert err.kind == "timeout" and err.code == "CpuLimit"
        assert time.monotonic() - started < 5.0
        # sleeping uses no CPU: not stopped by the limit
        assert tool.run({"code": "import time\ntime.sleep(0.6)\nresult = 1"}, make_ctx()) == 1
    finally:
        tool.configure(Isolation())


def test_processes_the_code_started_die_with_it(tool: PythonTool, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = (
        "import subprocess, time\n"
        "p = subprocess.Popen(['sleep', '3600'])\n"
        "open(pid_file, 'w').write(str(p.pid))\n"
        "time.sleep(3600)\n"
    )
    err = error_of(tool, {"code": code, "input": {"pid_file": str(pid_file)}, "timeout": 1})
    assert err.kind == "timeout"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid):
        assert time.monotonic() < deadline, f"sleep {pid} outlived its python step"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_writes_to_fd_1_do_not_garble_the_reply(tool: PythonTool) -> None:
    ctx = make_ctx()
    code = "import os\nos.write(1, b'raw bytes\\n')\nprint('captured')\nresult = 5"
    assert tool.run({"code": code}, ctx) == 5
    assert ctx.stdout == ["captured"]


def test_an_oversized_reply_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWTIDE_MAX_RESULT_BYTES", "1000")
    tool = PythonTool(isolation=Isolation(mode="process", user=PYTHON_USER))
    try:
        err = error_of(tool, {"code": "result = 'x' * (3 * 1024 * 1024)"})
        assert err.kind == "result_too_large"
        assert tool.run({"code": "result = 'small'"}, make_ctx()) == "small"
    finally:
        tool.configure(Isolation())


def test_the_environment_is_the_templates_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWTIDE_TOKEN", "worker-secret")
    monkeypatch.setenv("SHOWN_VAR", "yes")
    monkeypatch.setenv("HIDDEN_VAR", "no")
    monkeypatch.setenv("FLOWTIDE_TEMPLATE_ENV", "SHOWN_*,FLOWTIDE_*")
    code = "import os\nresult = {k: os.environ.get(k) for k in keys}"
    keys = ["FLOWTIDE_TOKEN", "SHOWN_VAR", "HIDDEN_VAR", "PATH"]
    worker = PythonTool(isolation=Isolation(mode="process", user=PYTHON_USER, embedded=False))
    try:
        got = worker.run({"code": code, "input": {"keys": keys}}, make_ctx())
    finally:
        worker.configure(Isolation())
    assert got == {
        "FLOWTIDE_TOKEN": None,
        "SHOWN_VAR": "yes",
        "HIDDEN_VAR": None,
        "PATH": os.environ["PATH"],
    }


def test_settings_from_the_environment() -> None:
    assert Isolation.from_env({}) == Isolation(mode="thread", memory_mb=2048)
    assert Isolation.from_env({"FLOWTIDE_PYTHON_MEMORY_MB": ""}).memory_mb == 2048
    assert Isolation.from_env({}, mode="process", embedded=False).mode == "process"
    got = Isolation.from_env(
        {
            "FLOWTIDE_PYTHON_ISOLATION": "process",
            "FLOWTIDE_PYTHON_MEMORY_MB": "0",
            "FLOWTIDE_PYTHON_CPU_SECONDS": "2.5",
            "FLOWTIDE_PYTHON_USER": "daemon",
        }
    )
    assert got == Isolation(mode="process", memory_mb=None, cpu_seconds=2.5, user="daemon")
    with pytest.raises(ToolError, match="expected one of thread, process"):
        Isolation.from_env({"FLOWTIDE_PYTHON_ISOLATION": "fork"})
    with pytest.raises(ToolError, match="expected a number"):
        Isolation.from_env({"FLOWTIDE_PYTHON_MEMORY_MB": "lots"})


def _interpreter_for(uid: int) -> str | None:
    """An interpreter of this Python version that user `uid` can run, if any."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if not os.path.exists(candidate):
            continue
        probe = [candidate, "-I", "-c", "import sys"]
        try:
            done = subprocess.run(probe, user=uid, group=uid, capture_output=True, timeout=30)
        except OSError:
            continue
        if done.returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_children_of_a_root_process_run_as_nobody(tmp_path: Path) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    executable = _interpreter_for(nobody.pw_uid)
    if executable is None:
        pytest.skip("no interpreter of this Python version that nobody may run")
    secret = tmp_path / "root-only"
    secret.write_text("s3cret")
    secret.chmod(0o600)
    pool = ChildPool(Isolation(mode="process"), executable=executable)
    code = (
        "import os\n"
        "try:\n"
        "    open(path).read()\n"
        "    readable = True\n"
        "except PermissionError:\n"
        "    readable = False\n"
        "result = [os.getuid(), os.getgid(), os.getgroups(), readable]\n"
    )
    request = {
        "source": code,
        "filename": "<code>",
        "input": {"path": str(secret)},
        "execution_id": 1,
    }
    try:
        assert pool.user == "nobody"
        reply = pool.run(request)
    finally:
        pool.close()
    assert reply["ok"], reply
    assert reply["result"] == [nobody.pw_uid, nobody.pw_gid, [], False]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_an_unknown_python_user_is_a_config_error() -> None:
    with pytest.raises(ToolError, match="no such user") as info:
        ChildPool(Isolation(mode="process", user="no-such-user-here"))
    assert info.value.kind == "config_error"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_a_default_user_that_cannot_start_python_is_an_error_never_root() -> None:
    import pwd

    from flowtide.tools.python_pool import default_user_works

    nobody = pwd.getpwnam("nobody")
    probe = [sys.executable, "-I", "-c", "import sys"]
    try:
        runs = subprocess.run(probe, user=nobody.pw_uid, capture_output=True, timeout=30)
    except PermissionError:
        pass
    else:
        if runs.returncode == 0:
            pytest.skip("nobody can run this interpreter here")
    assert not default_user_works()
    pool = ChildPool(Isolation(mode="process"))
    try:
        with pytest.raises(ToolError, match="--python-user root") as info:
            pool.prestart(1)
        assert info.value.kind == "config_error"
        assert "nobody cannot start" in info.value.message
        # Asked for out loud, root it is.
        chosen = ChildPool(Isolation(mode="process", user="root"))
        try:
            chosen.prestart(1)
            assert chosen.user == "root"
        finally:
            chosen.close()
    finally:
        pool.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_a_root_worker_whose_python_cannot_drop_privileges_refuses_to_start(
    tmp_path: Path,
) -> None:
    if PYTHON_USER is None:
        pytest.skip("nobody can run this interpreter here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTIDE_")}
    # Refused before it looks for the server or NATS (neither is there).
    argv = [sys.executable, "-m", "flowtide.cli", "worker", "--server", "http://127.0.0.1:9"]
    argv += ["--nats", "nats://127.0.0.1:9", "--home", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "nobody cannot start" in done.stderr and "--python-user root" in done.stderr


def _gone(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_process_that_left_the_group_dies_with_the_timed_out_step(
    tool: PythonTool, tmp_path: Path
) -> None:
    """Issue 31: `Popen(..., start_new_session=True)` in a step outlived its timeout
    (adopted by PID 1); the step's mark in its environment finds it."""
    folder = tmp_path / "out"
    folder.mkdir()
    folder.chmod(0o777)  # the child may run as another user
    tmp_path.chmod(0o755)
    pid_file = folder / "pid"
    code = (
        "import subprocess, time\n"
        "p = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(3600)\n"
    )
    err = error_of(tool, {"code": code, "timeout": 1.0})
    assert err.kind == "timeout"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), "the setsid child survived the step's timeout"
