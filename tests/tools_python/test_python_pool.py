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
from pyuser import PYTHON_USER, writable

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


def test_processes_the_code_started_die_with_it(tool: PythonTool, open_dir: Path) -> None:
    pid_file = writable(open_dir / "out") / "pid"
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


_READS = (
    "import os\n"
    "def readable(path):\n"
    "    try:\n"
    "        open(path).read()\n"
    "        return True\n"
    "    except PermissionError:\n"
    "        return False\n"
    "result = [os.getuid(), os.getgid(), os.getgroups(), readable(secret), readable(shared)]\n"
)


def _root_and_public_files(folder: Path) -> tuple[Path, Path]:
    """A root-only file (0600) and a readable one beside it, in a folder any user may
    enter: what stops a step reading the first is its mode alone."""
    secret = folder / "master-key"
    secret.write_text("s3cret-master-key")
    secret.chmod(0o600)
    shared = folder / "shared"
    shared.write_text("for all")
    shared.chmod(0o644)
    return secret, shared


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_children_of_a_root_process_run_as_nobody(open_dir: Path) -> None:
    """Issue 31: as root, python steps run as nobody by default (through an interpreter
    nobody can start, the system's when this one lives under /root), never as root: a
    root-only file is out of their reach."""
    import pwd

    if PYTHON_USER is not None:
        pytest.skip("no interpreter of this Python version that nobody may run")
    nobody = pwd.getpwnam("nobody")
    secret, shared = _root_and_public_files(open_dir)
    pool = ChildPool(Isolation(mode="process", embedded=False))
    request = {
        "source": _READS,
        "filename": "<code>",
        "input": {"secret": str(secret), "shared": str(shared)},
        "execution_id": 1,
    }
    try:
        assert pool.user == "nobody"
        reply = pool.run(request)
        shadow = pool.run({**request, "input": {"secret": "/etc/shadow", "shared": str(shared)}})
    finally:
        pool.close()
    assert reply["ok"], reply
    assert reply["result"] == [nobody.pw_uid, nobody.pw_gid, [], False, True]
    if os.path.exists("/etc/shadow"):
        assert shadow["result"][3:] == [False, True]


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_a_python_step_of_a_root_run_cannot_open_a_root_only_file(open_dir: Path) -> None:
    """Through a playbook run, python steps in child processes as a worker has them (the
    default user): `open()` of a root-only file is a PermissionError that fails the
    step, and nothing of the file reaches the run's document."""
    import flowtide
    from flowtide.tools.registry import get_tool

    if PYTHON_USER is not None:
        pytest.skip("no interpreter of this Python version that nobody may run")
    secret, shared = _root_and_public_files(open_dir)
    book = open_dir / "steal.yaml"
    book.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: steal, path: steal}\n"
        f"workload: {{path: {str(shared)!r}}}\n"
        "workflow:\n"
        "- step: start\n"
        "  tool: {kind: python, code: 'result = open(path).read()', input: {path: '{{ path }}'}}\n"
    )
    tool = get_tool("python")
    old = tool.isolation
    tool.configure(Isolation(mode="process", embedded=False))
    try:
        shared_doc = flowtide.run(book, home=open_dir / "home")
        stolen = flowtide.run(book, workload={"path": str(secret)}, home=open_dir / "home")
    finally:
        tool.configure(old)
    assert shared_doc["status"] == "completed", shared_doc
    assert shared_doc["steps"]["start"]["result"] == "for all"
    assert stolen["status"] == "failed"
    error = stolen["steps"]["start"]["error"]
    assert "PermissionError" in str(error) and str(secret) in str(error)
    assert "s3cret-master-key" not in repr(stolen)


def _nobody_runs(executable: str) -> bool:
    import pwd

    nobody = pwd.getpwnam("nobody")
    probe = [executable, "-I", "-c", "import sys"]
    try:
        runs = subprocess.run(probe, user=nobody.pw_uid, capture_output=True, timeout=30)
    except PermissionError:
        return False
    return runs.returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_a_default_user_that_cannot_start_python_is_an_error_never_root(tmp_path: Path) -> None:
    from flowtide.tools.python_pool import default_user_works

    # An interpreter nobody cannot start: this one, by a path through a 0700 folder.
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    executable = hidden / "python"
    executable.symlink_to(sys.executable)
    assert not default_user_works(str(executable))
    pool = ChildPool(Isolation(mode="process"), executable=str(executable))
    try:
        with pytest.raises(ToolError, match="--python-user root") as info:
            pool.prestart(1)
        assert info.value.kind == "config_error"
        assert "nobody cannot start" in info.value.message
        # Asked for out loud, root it is.
        chosen = ChildPool(Isolation(mode="process", user="root"), executable=str(executable))
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
    """No interpreter nobody can start (this one out of its reach, no system one found):
    the worker refuses, never runs steps as root unasked."""
    if _nobody_runs(sys.executable):
        pytest.skip("nobody can run this interpreter here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTIDE_")}
    # The worker looks for no system interpreter (there is one on this machine).
    boot = (
        "import runpy, flowtide.tools.python_interpreter as p; p._CANDIDATES = ();"
        " runpy.run_module('flowtide.cli', run_name='__main__', alter_sys=True)"
    )
    # Refused before it looks for the server or NATS (neither is there).
    argv = [sys.executable, "-c", boot, "worker", "--server", "http://127.0.0.1:9"]
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
    tool: PythonTool, open_dir: Path
) -> None:
    """Issue 31: `Popen(..., start_new_session=True)` in a step outlived its timeout
    (adopted by PID 1); the step's mark in its environment finds it."""
    pid_file = writable(open_dir / "out") / "pid"  # the child may run as another user
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
