"""Processes a step started that left its process group: found by a mark in their
environment and killed.

A step's program runs in a process group of its own, and the whole group is killed when
the step ends, times out or is cancelled. A descendant that called `setsid` (or
`start_new_session=True`, or daemonized by double fork) is in no group of the step's any
more, but it still carries the environment it inherited: `FT_STEP_MARK=<random>`, set
on the step's process. `sweep(mark)` kills every process holding that mark, a few rounds
(a process may fork while it is being found).

What escapes: a descendant that clears or rewrites its environment before it is found,
and one running as another user whose environment this process cannot read (a setuid
program). `flowtide.tools.reaper` holds those: a cgroup per step program where there is
one, else the program as the subreaper of its tree; this sweep is the net behind them.
"""

from __future__ import annotations

import os
import secrets
import signal

__all__ = ["MARK_VAR", "new_mark", "sweep"]

MARK_VAR = "FT_STEP_MARK"
_ROUNDS = 5


def new_mark() -> str:
    """A fresh mark for one step's process (or one pooled python child)."""
    return secrets.token_hex(12)


def sweep(mark: str) -> int:
    """SIGKILL every process (but this one) whose environment holds `mark`; how many were
    killed. Without /proc (not Linux) nothing is found."""
    needle = f"{MARK_VAR}={mark}".encode()
    me = os.getpid()
    killed = 0
    for _ in range(_ROUNDS):
        found = [pid for pid in _pids() if pid != me and _marked(pid, needle)]
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def _pids() -> list[int]:
    try:
        return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return []


def _marked(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:  # gone, or not ours to read
        return False
    # Whole entries only: NUL-separated `KEY=value` strings.
    return (
        environ.startswith(needle + b"\0")
        or (b"\0" + needle + b"\0") in environ
        or (environ.endswith(b"\0" + needle) or environ == needle)
    )
