"""Process isolation for python steps: a pool of warm child processes.

Why. Code running in the worker's own process cannot be stopped: an exception injected
into its thread waits until the code runs Python again, so `time.sleep(3600)` holds its
slot for an hour after a cancel or a timeout, and code can read the worker's memory. A
child process can be killed. Each child runs one call at a time and is used again for
the next (spawning a Python process costs ~50 ms; a warm child answers in ~0.1 ms).

What the parent enforces while it waits for a reply:

* the step's `timeout` (wall clock): the child is killed, the call fails with kind
  `timeout`;
* cancellation: `ctx.cancelled()` is asked every `POLL` seconds, and `cancel(execution_id)`
  kills that execution's children at once; kind `cancelled`;
* `cpu_seconds` per call (read from /proc while waiting; Linux only);
* a reply larger than the result limit is refused.

The child caps its own address space (`memory_mb`, RLIMIT_AS) before running any user
code. A child that dies (killed, out of memory, `os._exit`) gives kind `crashed` with its
exit status; it is replaced by a fresh one on the next call. Every child is in its own
process group, cgroup (where there is one) and subreaper tree (`flowtide.tools.reaper`),
so what it started (a `subprocess`, also one that left the session and cleared its
environment) is killed with it.

Who the child runs as: the worker's own user, except when the worker runs as root, then
as `user` (default `nobody`), with no supplementary groups. A child that cannot start as
that user (a Python installed under /root, which `nobody` cannot read) is an error, never
a quiet fall-back to root: the worker refuses to start and says how to fix it. Running
them as root anyway takes `--python-user root`, spelled out.

Its environment: PATH, HOME, LANG, LC_*, TZ, TMPDIR and the variables templates may see
(`FLOWTIDE_TEMPLATE_ENV`; never `FLOWTIDE_*`), not the worker's whole environment.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import pwd
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools.python_frames import frame_body, read_frame, write_frame
from flowtide.tools.python_interpreter import child_executable
from flowtide.tools.reaper import Confinement
from flowtide.tools.sweep import MARK_VAR, new_mark, sweep

__all__ = ["DEFAULT_MEMORY_MB", "ChildPool", "Isolation", "child_environment", "resolve_user"]

log = logging.getLogger("flowtide.python")

DEFAULT_MEMORY_MB = 2048
#: Seconds between two looks at `ctx.cancelled()` and the CPU clock while a call runs.
POLL = 0.5
#: How long a new child may take to import flowtide and say it is ready.
START_TIMEOUT = 30.0
_MODES = ("thread", "process")
_ENV_KEPT = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR")
_BOOT = (
    "import json, sys; s = json.loads(sys.argv[1]); sys.path[:0] = s['path']; "
    "from flowtide.tools.python_child import main; main(s)"
)


@dataclass(frozen=True)
class Isolation:
    """How python steps run. `mode`: "process" (a child process per call, from a warm
    pool) or "thread" (in this process, on the calling thread). The rest applies to
    "process" only: `memory_mb` (address space per child; 0 or None: no limit),
    `cpu_seconds` (per call; None: no limit), `user` (who children run as when this
    process is root; None: nobody), `embedded` (the environment is the user's own:
    children see it, as templates do, less FLOWTIDE_*)."""

    mode: str = "thread"
    memory_mb: int | None = DEFAULT_MEMORY_MB
    cpu_seconds: float | None = None
    user: str | None = None
    embedded: bool = True

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ToolError(
                f"python isolation {self.mode!r}: expected one of {', '.join(_MODES)}",
                kind="config_error",
            )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        mode: str = "thread",
        embedded: bool = True,
    ) -> Isolation:
        """Settings from FLOWTIDE_PYTHON_ISOLATION, FLOWTIDE_PYTHON_MEMORY_MB,
        FLOWTIDE_PYTHON_CPU_SECONDS and FLOWTIDE_PYTHON_USER; `mode` when the first is
        unset.

        Raises:
            ToolError: kind "config_error", a value that is not understood.
        """
        from flowtide.errors import SettingsError
        from flowtide.settings import PythonSection, read

        try:
            tree = read(PythonSection, environ)
        except SettingsError as exc:
            raise ToolError(str(exc), kind="config_error") from None
        return cls(
            mode=tree.isolation or mode,
            # Unset: the default (the tree's, DEFAULT_MEMORY_MB); 0: no limit.
            memory_mb=tree.memory_mb if tree.memory_mb > 0 else None,
            cpu_seconds=tree.cpu_seconds if tree.cpu_seconds > 0 else None,
            user=tree.user or None,
            embedded=embedded,
        )


@dataclass(frozen=True)
class _User:
    name: str
    uid: int
    gid: int
    home: str


class _Child:
    """One child process and its two pipe ends."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        path: tuple[str, ...],
        mark: str = "",
        confined: Confinement | None = None,
    ) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        #: Its cgroup and subreaper tree (`flowtide.tools.reaper`).
        self.confined = confined
        #: In its environment and its descendants' (`flowtide.tools.sweep`).
        self.mark = mark
        self.pid = proc.pid
        self.to_child = proc.stdin.fileno()
        self.from_child = proc.stdout.fileno()
        self.poller = select.poll()
        self.poller.register(self.from_child, select.POLLIN | select.POLLHUP | select.POLLERR)
        #: sys.path as the child has it (sent again with a request when it changed).
        self.path = path
        self.execution_id: int | None = None
        #: Why the parent killed it ("timeout", "cancelled", ...), None while it lives.
        self.killed: str | None = None
        #: Where the output it forwards goes, while it runs a live request.
        self.log: Callable[[str], None] | None = None

    def readable(self, seconds: float) -> bool:
        return bool(self.poller.poll(max(0, int(seconds * 1000))))

    def kill(self, reason: str) -> None:
        if self.killed is None:
            self.killed = reason
        if self.confined is not None and self.proc.returncode is None:
            # Its cgroup, its tree (orphans included: it is their subreaper, so first,
            # while it holds them).
            self.confined.kill(self.pid)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.mark:
            # What its step started in a session of its own dies with it too.
            sweep(self.mark)

    def cpu_seconds(self) -> float:
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        # utime and stime, fields 14 and 15 of the line (11 and 12 after the name).
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> int | None:
        """Kill (if still running), reap and close; the exit status."""
        if self.proc.poll() is None:
            self.kill(self.killed or "closed")
        try:
            code = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL did not work
            code = None
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        if self.confined is not None:
            self.confined.close()
        return code


_pools: weakref.WeakSet[ChildPool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    for pool in list(_pools):
        pool.close()


class ChildPool:
    """Warm child processes that run python steps; see the module docstring."""

    def __init__(
        self,
        settings: Isolation,
        *,
        executable: str | None = None,
        max_reply_bytes: int | None = None,
    ) -> None:
        """`executable`: the interpreter of the children (default: this one, or one of
        its version the children's user can run: `python_interpreter`).
        `max_reply_bytes`: largest reply taken (default: four times the result limit,
        FLOWTIDE_MAX_RESULT_BYTES, plus 1 MiB for the output)."""
        self.settings = settings
        self.executable = executable or child_executable()
        if max_reply_bytes is None:
            from flowtide.settings import LimitsSection, current

            result_limit = current(LimitsSection).max_result_bytes
            max_reply_bytes = 4 * result_limit + (1 << 20)
        self.max_reply_bytes = max_reply_bytes
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._user = resolve_user(settings.user)
        _pools.add(self)

    # -- who the children are -------------------------------------------------------------

    @property
    def user(self) -> str:
        """The user the children run as."""
        if self._user is not None:
            return self._user.name
        return pwd.getpwuid(os.geteuid()).pw_name

    def prestart(self, n: int = 1) -> None:
        """Start `n` children now, so the first calls do not wait for them.

        Raises:
            ToolError: a child cannot be started (kind "config_error" or "crashed").
        """
        children = [self._spawn() for _ in range(max(0, n - len(self._idle)))]
        with self._lock:
            self._idle.extend(children)

    # -- running a call -------------------------------------------------------------------

    def run(
        self,
        request: dict[str, Any],
        *,
        execution_id: int | None = None,
        timeout: float | None = None,
        cancelled: Callable[[], bool] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Run one request in a child; its reply (`ok`, `result` or `error`, `stdout`).
        `log`: given what the code prints as the child forwards it (`{"log": text}`
        frames before the reply, sent when the request says `live`).

        Raises:
            ToolError: kind "timeout", "cancelled", "crashed" (the child died; its exit
                status in `data`), "result_too_large", or "config_error" (no child could
                be started).
        """
        for attempt in (1, 2):
            child = self._take(execution_id)
            path = tuple(sys.path)
            body = request if child.path == path else {**request, "path": list(path)}
            try:
                write_frame(child.to_child, json.dumps(body, default=str).encode())
            except OSError:
                # It died while idle (nothing of this call ran): a fresh one, once.
                self._drop(child)
                if attempt == 2:
                    raise ToolError(
                        "the python child process died before it got the call",
                        kind="crashed",
                        retryable=True,
                    ) from None
                continue
            child.path = path
            break
        try:
            child.log = log
            reply = self._wait(child, timeout, cancelled)
        except BaseException:
            self._drop(child)
            raise
        if reply.get("recycle"):
            self._drop(child)
        else:
            self._give_back(child)
        return reply

    def cancel(self, execution_id: int | None = None) -> int:
        """Kill the children running calls of `execution_id` (every busy child when
        None); their callers get a `cancelled` ToolError. Returns how many."""
        with self._lock:
            doomed = [
                c for c in self._busy if execution_id is None or c.execution_id == execution_id
            ]
        for child in doomed:
            child.kill("cancelled")
        return len(doomed)

    def close(self) -> None:
        """Kill every child; calls still running fail as cancelled."""
        with self._lock:
            self._closed = True
            children = [*self._idle, *self._busy]
            self._idle.clear()
        for child in children:
            child.kill("cancelled")
        for child in children:
            child.close()

    def counts(self) -> dict[str, int]:
        """Children idle and busy (for tests and logs)."""
        with self._lock:
            return {"idle": len(self._idle), "busy": len(self._busy)}

    # -- internals ------------------------------------------------------------------------

    def _take(self, execution_id: int | None) -> _Child:
        child = None
        while child is None:
            with self._lock:
                if self._closed:
                    raise ToolError("the python child pool is closed", kind="cancelled")
                child = self._idle.pop() if self._idle else None
            if child is None:
                child = self._spawn()
            elif child.proc.poll() is not None:
                child.close()
                child = None
        child.execution_id = execution_id
        with self._lock:
            self._busy.add(child)
        return child

    def _give_back(self, child: _Child) -> None:
        with self._lock:
            self._busy.discard(child)
            if not self._closed and child.killed is None:
                child.execution_id = None
                self._idle.append(child)
                return
        child.close()

    def _drop(self, child: _Child) -> None:
        with self._lock:
            self._busy.discard(child)
        child.close()

    def _wait(
        self, child: _Child, timeout: float | None, cancelled: Callable[[], bool] | None
    ) -> dict[str, Any]:
        limit = self.settings.cpu_seconds
        cpu_start = child.cpu_seconds() if limit else 0.0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = POLL if deadline is None else min(POLL, deadline - time.monotonic())
            if child.readable(wait):
                reply = self._reply(child)
                if reply is not None:  # else a piece of output: wait on
                    return reply
                continue
            if deadline is not None and time.monotonic() >= deadline:
                child.kill("timeout")
                raise ToolError(
                    f"python code timed out after {timeout:g}s (its process was killed)",
                    kind="timeout",
                    retryable=True,
                    code="Timeout",
                    data={"timeout": timeout},
                )
            if child.killed is None and cancelled is not None and cancelled():
                child.kill("cancelled")
            if child.killed == "cancelled":
                raise _cancelled_error()
            if limit and child.cpu_seconds() - cpu_start > limit:
                child.kill("cpu")
                raise ToolError(
                    f"python code used more than {limit:g} s of CPU (its process was killed;"
                    " the limit is FLOWTIDE_PYTHON_CPU_SECONDS / --python-cpu-seconds)",
                    kind="timeout",
                    code="CpuLimit",
                    data={"cpu_seconds": limit},
                )

    def _reply(self, child: _Child) -> dict[str, Any] | None:
        try:
            # A live child sends output frames before its reply: one frame at a time.
            first = os.read(child.from_child, 4 if child.log is not None else 1 << 16)
            while 0 < len(first) < 4:
                more = os.read(child.from_child, 4 - len(first))
                first = first + more if more else b""
        except OSError:
            first = b""
        if first:
            size = int.from_bytes(first[:4], "big")
            if size > self.max_reply_bytes:
                child.kill("too large")
                raise ToolError(
                    f"the python step's reply is {size} bytes, over the"
                    f" {self.max_reply_bytes}-byte limit (FLOWTIDE_MAX_RESULT_BYTES)",
                    kind="result_too_large",
                )
            try:
                data = frame_body(child.from_child, first[4:], size)
            except OSError:
                data = None
            if data is not None:
                try:
                    reply = json.loads(data)
                except ValueError:
                    reply = None
                if isinstance(reply, dict) and isinstance(reply.get("stdout"), list):
                    return reply
                if isinstance(reply, dict) and isinstance(reply.get("log"), str) and child.log:
                    child.log(reply["log"])
                    return None
                child.kill("garbled")
                raise ToolError(
                    "the python child process sent a reply that is not one (did the code"
                    " write to file descriptor 1 of its own process directly?)",
                    kind="crashed",
                )
        raise self._death(child)

    def _death(self, child: _Child) -> ToolError:
        """The error for a child that closed its end while running a call."""
        if child.killed == "cancelled":
            return _cancelled_error()
        code = child.close()
        memory = self.settings.memory_mb
        if code is not None and code < 0:
            try:
                how = signal.Signals(-code).name
            except ValueError:
                how = f"signal {-code}"
            message = f"the python step's process was killed by {how}"
            if -code in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
                message += (
                    " (out of memory? a python step may use "
                    + (f"{memory} MiB" if memory else "all the machine's memory")
                    + ": FLOWTIDE_PYTHON_MEMORY_MB / --python-memory-mb)"
                )
        else:
            how = f"exit code {code}"
            message = f"the python step's process exited ({how}) before it replied"
        return ToolError(
            message, kind="crashed", code=how, data={"exit_status": code, "memory_mb": memory}
        )

    def _spawn(self) -> _Child:
        user = self._user
        try:
            return self._start(user)
        except ToolError as exc:
            if user is None:
                raise
            raise ToolError(
                f"{exc.message}: user {user.name} cannot start {self.executable} (make the"
                f" interpreter and its packages readable by {user.name}, choose another"
                " user with --python-user / FLOWTIDE_PYTHON_USER, or run python steps as"
                " root with --python-user root)",
                kind="config_error",
                data=exc.data,
            ) from None

    def _start(self, user: _User | None) -> _Child:
        memory = self.settings.memory_mb
        settings = {
            "path": sys.path,
            "memory": memory * 1024 * 1024 if memory else None,
            "max_bytes": self.max_reply_bytes - 1024,
            "parent": os.getpid(),
        }
        mark = new_mark()
        # Its own cgroup where there is one, a subreaper always; it switches to the user.
        confined = Confinement(user)
        try:
            proc = subprocess.Popen(
                [self.executable, "-I", "-c", _BOOT, json.dumps(settings)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**self._environment(user), MARK_VAR: mark},
                start_new_session=True,
                bufsize=0,
                preexec_fn=confined.preexec,
            )
        except OSError as exc:
            confined.close()
            who = f" as user {user.name}" if user is not None else ""
            raise ToolError(
                f"cannot start a python child process{who}: {exc}", kind="config_error"
            ) from None
        child = _Child(proc, tuple(sys.path), mark, confined)
        if child.readable(START_TIMEOUT):
            frame = read_frame(child.from_child)
            if frame is not None and b"ready" in frame:
                return child
        child.kill("start")
        code = child.close()
        who = f" as user {user.name}" if user is not None else ""
        raise ToolError(
            f"a python child process{who} did not start (exit status {code}; its error, if"
            " any, is on this process's stderr)",
            kind="crashed",
            data={"exit_status": code},
        )

    def _environment(self, user: _User | None) -> dict[str, str]:
        return child_environment(user, embedded=self.settings.embedded)


def child_environment(user: _User | None, *, embedded: bool) -> dict[str, str]:
    """The environment of a process that runs a step's code (a python child, a shell
    command): PATH, LANG, LC_*, TZ, TMPDIR, HOME (of `user` when given) and the variables
    templates may see (`FLOWTIDE_TEMPLATE_ENV`; never `FLOWTIDE_*`), not this process's
    whole environment."""
    from flowtide.playbook.template import visible_env

    env = {k: v for k, v in os.environ.items() if k in _ENV_KEPT or k.startswith("LC_")}
    env.update(visible_env(os.environ, embedded=embedded))
    env["HOME"] = user.home if user is not None else os.environ.get("HOME", "/")
    return env


def _cancelled_error() -> ToolError:
    return ToolError(
        "python step cancelled: its process was stopped", kind="cancelled", code="Cancelled"
    )


def resolve_user(name: str | None) -> _User | None:
    """Whom children run as: None (this process's user) unless this process is root."""
    if os.geteuid() != 0:
        return None
    chosen = name or "nobody"
    try:
        entry = pwd.getpwuid(int(chosen)) if chosen.isdigit() else pwd.getpwnam(chosen)
    except KeyError:
        raise ToolError(
            f"python user {chosen!r}: no such user on this machine (--python-user)",
            kind="config_error",
        ) from None
    if entry.pw_uid == 0:
        return None
    return _User(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def default_user_works(executable: str | None = None) -> bool:
    """Whether python children can start as the default user (`nobody`) here; always
    True when this process is not root. The dev stack and the tests ask before they
    start workers as root, and then choose `--python-user root` out loud."""
    if os.geteuid() != 0:
        return True
    pool = ChildPool(Isolation(mode="process", embedded=False), executable=executable)
    try:
        pool.prestart(1)
    except ToolError:
        return False
    finally:
        pool.close()
    return True
