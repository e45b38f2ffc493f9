"""Running one program for a tool (`shell`, `script`): an argument list, never a shell
unless the caller put `/bin/sh -c` in it.

What `Launch.run` guarantees:

* the program runs in a session and process group of its own, with no stdin, in the
  environment and directory it is given, as the user python steps run as (a worker
  running as root runs them as its `--python-user`, `nobody` by default: see
  `flowtide.tools.python_pool`);
* its stdout and stderr are read as they come, at most `limit` bytes of each kept (the
  rest counted), so a chatty program neither fills memory nor blocks on a full pipe;
* on the timeout, on cancellation (`cancelled()` asked every `POLL` seconds, or
  `kill_running(execution_id)`, which the tools' `cancel` call), when the caller's
  thread is interrupted or this process exits, the program and everything it started
  are killed (SIGKILL): its process group, its cgroup or subreaper tree
  (`flowtide.tools.reaper`: also what left the session and cleared its environment),
  and what carries the step's mark (`flowtide.tools.sweep`);
* once the program has exited (and its pipes closed, or `EXIT_GRACE` passed: a
  background job it left may hold them open), whatever it left running in its group is
  killed too, before the program is reaped, so the group id cannot have been reused by
  then.
"""

from __future__ import annotations

import atexit
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools.reaper import Confinement
from flowtide.tools.sweep import MARK_VAR, new_mark, sweep

__all__ = [
    "Finished",
    "Launch",
    "RunsPrograms",
    "kill_running",
    "runner_user",
    "start_error",
    "stopped_error",
]

#: Seconds between two looks at the clock and at `cancelled()` while a program runs.
POLL = 0.1
#: How long the pipes may stay open after the program exited (its leftovers write).
EXIT_GRACE = 0.5
_CHUNK = 65536


# The programs running now: pid (also its process group) -> the execution it runs for
# and its confinement. A pid is taken out under the lock before the program is reaped,
# and killed only under it, so a pid reused by another process is never killed.
_running: dict[int, tuple[int | None, Confinement]] = {}
_killed: set[int] = set()
_running_lock = threading.Lock()


def kill_running(execution_id: int | None = None) -> int:
    """Kill the programs (process groups) running for `execution_id`, every one when
    None (at exit too); their calls end with kind `cancelled`. How many."""
    with _running_lock:
        pids = [pid for pid, (owner, _) in _running.items() if execution_id in (None, owner)]
        for pid in pids:
            _killed.add(pid)
            # Its tree first: the program (their subreaper) must hold it while it is found.
            _running[pid][1].kill(pid)
            _kill_group(pid)
    return len(pids)


atexit.register(kill_running)


class RunsPrograms:
    """What the tools that run programs (`shell`, `script`) share: `cancel`, which
    `flowtide.tools.registry.cancel_running` calls when an execution is cancelled."""

    def cancel(self, execution_id: int | None = None) -> int:
        """Kill the programs running for `execution_id` (every one when None) now; how
        many."""
        return kill_running(execution_id)


@dataclass
class _Stream:
    limit: int
    data: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    #: The command's live log (`flowtide.logs.CommandLog`), given each chunk as read.
    log: Any = None
    name: str = "stdout"

    def add(self, chunk: bytes) -> None:
        if self.log is not None:
            self.log.write_bytes(chunk, self.name)
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))


@dataclass(frozen=True)
class Finished:
    """How a program ended. `returncode` is the exit status (negative: the signal that
    ended it); `stopped` says why flowtide ended it ("timeout", "cancelled"), None when
    it ended on its own. `stdout_dropped`/`stderr_dropped`: bytes over the limit."""

    returncode: int
    stdout: str
    stderr: str
    stdout_dropped: int
    stderr_dropped: int
    duration: float
    stopped: str | None


def runner_user() -> Any:
    """Who a step's programs run as: the python steps' user (`--python-user`) when this
    process is root, else None (this process's own user)."""
    if os.geteuid() != 0:
        return None
    from flowtide.tools.python_pool import resolve_user
    from flowtide.tools.registry import get_tool

    return resolve_user(get_tool("python").isolation.user)


@dataclass(frozen=True)
class Launch:
    """How a task's programs run: as whom (a `python_pool` user; None: this process's),
    in what environment (the whole of it) and folder (None: this process's), how many
    bytes of stdout and of stderr are kept, what cancels them (asked while one runs),
    for which execution."""

    user: Any
    env: Mapping[str, str]
    cwd: Path | None
    limit: int
    cancelled: Callable[[], bool] | None = None
    #: The execution the programs run for (`kill_running`).
    owner: int | None = None
    #: The command's live log: what the programs write goes there as it comes.
    log: Any = None

    def run(self, argv: Sequence[str], timeout: float, *, merge_stderr: bool = False) -> Finished:
        """Run `argv` to its end (or `timeout` seconds, or cancellation); see the module
        docstring. `merge_stderr`: stderr goes to stdout (one stream, in order written).

        Raises:
            OSError: the program cannot be started (not found, not executable).
        """
        return _run(argv, self, timeout, merge_stderr)


def _run(argv: Sequence[str], launch: Launch, timeout: float, merge_stderr: bool) -> Finished:
    """`Launch.run`."""
    limit = launch.limit
    started = time.monotonic()
    mark = new_mark()
    # Its own cgroup where there is one, a subreaper always; it switches to the user.
    confined = Confinement(launch.user)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            env={**launch.env, MARK_VAR: mark},
            cwd=launch.cwd,
            start_new_session=True,
            preexec_fn=confined.preexec,
        )
    except BaseException:
        confined.close()
        raise
    with _running_lock:
        _running[proc.pid] = (launch.owner, confined)
    out, err = _Stream(limit, log=launch.log), _Stream(limit, log=launch.log, name="stderr")
    stopped: str | None = None
    try:
        stopped = _pump(proc, out, err, started + timeout, launch.cancelled)
    finally:
        # Whatever happened (a timeout, a cancel, this thread interrupted, the program
        # done with children left behind): nothing of the group outlives the call. The
        # program is not reaped yet, so its group id is still its own.
        with _running_lock:
            del _running[proc.pid]
            if proc.pid in _killed:
                _killed.discard(proc.pid)
                stopped = "cancelled"
        # What left the group too (setsid, a daemon, a cleared environment): in the
        # program's cgroup or tree (it is their subreaper: first, while it holds them),
        # or still carrying the step's mark.
        confined.kill(proc.pid)
        _kill_group(proc.pid)
        sweep(mark)
        returncode = proc.wait()
        confined.close()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return Finished(
        returncode=returncode,
        stdout=out.data.decode("utf-8", errors="replace"),
        stderr=err.data.decode("utf-8", errors="replace"),
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
        duration=time.monotonic() - started,
        stopped=stopped,
    )


def _pump(
    proc: subprocess.Popen[bytes],
    out: _Stream,
    err: _Stream,
    deadline: float,
    cancelled: Callable[[], bool] | None,
) -> str | None:
    """Read the pipes until the program has exited and they are closed (or EXIT_GRACE
    after it exited: a leftover holds them); the reason to stop it early, if any."""
    selector = selectors.DefaultSelector()
    for pipe, stream in ((proc.stdout, out), (proc.stderr, err)):
        if pipe is not None:
            selector.register(pipe.fileno(), selectors.EVENT_READ, stream)
    exited_at: float | None = None
    nap = 0.002
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if cancelled is not None and cancelled():
                return "cancelled"
            if exited_at is None and _exited(proc.pid):
                exited_at = now
            open_pipes = bool(selector.get_map())
            if exited_at is not None and (not open_pipes or now - exited_at > EXIT_GRACE):
                return None
            wait = min(POLL, deadline - now)
            if not open_pipes:
                # Its output closed, the program not yet gone: look again soon.
                time.sleep(min(nap, wait))
                nap = min(nap * 2, POLL)
                continue
            for key, _ in selector.select(wait):
                chunk = os.read(key.fd, _CHUNK)
                if chunk:
                    key.data.add(chunk)
                else:
                    selector.unregister(key.fd)
    finally:
        selector.close()


def _exited(pid: int) -> bool:
    """Whether the program has exited, without reaping it (its pid stays reserved)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start_error(exc: OSError, program: str, what: str, user: Any = None) -> ToolError:
    """A program that could not be started, with sh's status: 127 not found, 126 found
    but not runnable (by `user`, when the step runs as another user than this process)."""
    who = f" by user {user.name}" if user is not None else ""
    if isinstance(exc, FileNotFoundError) and exc.filename not in (None, program):
        code, reason = 127, f"cannot start: {exc.strerror}: {exc.filename}"
    elif isinstance(exc, FileNotFoundError):
        code, reason = 127, "not found (is it on PATH?)"
    elif isinstance(exc, PermissionError) and "/" not in program:
        # execvp reports EACCES when a PATH folder cannot be searched, found or not.
        code, reason = 126, f"not found on PATH, or not runnable{who}"
    else:
        code, reason = 126, f"cannot be run{who}: {exc.strerror or exc}"
    return ToolError(f"{what}: program {program!r} {reason}", kind="shell_error", code=str(code))


def stopped_error(what: str, run: Finished, timeout: float) -> ToolError | None:
    """Why flowtide ended the program, as the task's error: kind `timeout` (retryable)
    or `cancelled`; None when it ended on its own."""
    if run.stopped == "timeout":
        return ToolError(
            f"{what} timed out after {timeout:g} s and was killed",
            kind="timeout",
            retryable=True,
            code="timeout",
        )
    if run.stopped == "cancelled":
        return ToolError(f"{what} stopped: the execution was cancelled", kind="cancelled")
    return None
