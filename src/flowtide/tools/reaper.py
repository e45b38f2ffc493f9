"""Every process a step started dies with the step, whatever it did to get away.

A step's program (a shell command, a script, a python child) is started confined
(`Confinement`), in two ways at once where the machine allows:

* **cgroup** (Linux, cgroup v2 that this process may write to: a root worker on a host
  or VM, a container given its cgroup): the program is put in a cgroup of its own before
  it runs anything (`preexec`), so every descendant is in it, whatever its session,
  environment or user. `kill` writes `cgroup.kill` (or kills what `cgroup.procs` lists on
  kernels before 5.14); the cgroup is removed after. Nothing escapes.
* **subreaper** (Linux, always): the program is made a child subreaper
  (`PR_SET_CHILD_SUBREAPER`, kept across exec), so a descendant whose parent dies is
  re-parented to the program, not to PID 1: while the program lives, its whole tree
  hangs under it. `kill` stops that tree (SIGSTOP, found again until nothing new turns
  up, so a fork cannot outrun it) and then kills it (SIGKILL), the program included.
  What escapes: what the program's tree leaves behind when the program itself exits on
  its own (it goes to PID 1), when it also cleared its environment (else the mark
  sweep, `flowtide.tools.sweep`, finds it).

The callers also kill the program's process group and sweep the step's mark, as before.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Confinement", "cgroup_base", "kill_tree", "make_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36
_ROUNDS = 20
_counter = itertools.count(1)
_base_lock = threading.Lock()
#: The cgroup under which step cgroups are made; None: none can be (found once).
_base: Path | None = None
_base_known = False


def make_subreaper() -> bool:
    """Mark this process a child subreaper (Linux); whether it now is one. Safe to call
    between fork and exec (no allocation beyond the call)."""
    if _prctl is None:
        return False
    return bool(_prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()


@atexit.register
def _remove_base() -> None:
    """The step cgroups' folder goes with this process (runs after the pools closed:
    registered before them)."""
    if _base is None:
        return
    try:
        left = [p for p in _base.iterdir() if p.is_dir()]
    except OSError:
        left = []
    for cgroup in left:  # of a call still running in a thread that is not coming back
        _remove(cgroup)
    try:
        _base.rmdir()
    except OSError:
        pass


def cgroup_base() -> Path | None:
    """The cgroup v2 folder this process may make step cgroups in (a `flowtide-<pid>`
    folder under its own cgroup), made on first use; None when there is none (no cgroup
    v2, not writable, not Linux). Never raises."""
    global _base, _base_known
    with _base_lock:
        if not _base_known:
            _base_known = True
            _base = _make_base()
        return _base


def _make_base() -> Path | None:
    mount = _cgroup2_mount()
    if mount is None:
        return None
    try:
        own = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    relative = next((line[3:] for line in own.splitlines() if line.startswith("0::")), None)
    if relative is None:
        return None
    base = mount / relative.lstrip("/") / f"flowtide-{os.getpid()}"
    try:
        base.mkdir(exist_ok=True)
        probe = base / "probe"
        probe.mkdir(exist_ok=True)
        usable = (probe / "cgroup.procs").exists()
        probe.rmdir()
    except OSError:
        return None
    return base if usable else None


def _cgroup2_mount() -> Path | None:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if " - cgroup2 " in line and len(fields) > 4:
            return Path(fields[4])
    return None


class Confinement:
    """One step program's confinement: `preexec` runs in the child before exec (it also
    switches to `user`, so that the cgroup is joined while still allowed to), `kill`
    ends the program and everything it started, `close` removes the cgroup."""

    def __init__(self, user: Any = None) -> None:
        self.user = user
        self.cgroup: Path | None = None
        base = cgroup_base()
        if base is not None:
            path = base / f"s{next(_counter)}"
            try:
                path.mkdir()
                self.cgroup = path
            except OSError:
                self.cgroup = None
        procs = None if self.cgroup is None else str(self.cgroup / "cgroup.procs")
        self._procs = procs

    def preexec(self) -> None:
        """In the child, between fork and exec."""
        if self._procs is not None:
            try:
                fd = os.open(self._procs, os.O_WRONLY)
                try:
                    os.write(fd, b"0")  # "0": the writing process itself
                finally:
                    os.close(fd)
            except OSError:
                pass  # the subreaper still holds its tree
        make_subreaper()
        user = self.user
        if user is not None:
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)

    def kill(self, pid: int) -> None:
        """SIGKILL the program `pid` and every descendant: the cgroup's members (all of
        them), else its tree (stopped first)."""
        if self.cgroup is not None:
            _kill_cgroup(self.cgroup)
        else:
            kill_tree(pid)

    def close(self) -> None:
        """Remove the cgroup (killing what is still in it)."""
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None:
            _remove(cgroup)


def _remove(cgroup: Path) -> None:
    """Kill what is in `cgroup` and remove it (waiting a second at most)."""
    _kill_cgroup(cgroup)
    for _ in range(100):
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # members not gone yet
            time.sleep(0.01)


def _members(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_cgroup(cgroup: Path) -> None:
    try:
        (cgroup / "cgroup.kill").write_text("1")
        return
    except OSError:
        pass  # before Linux 5.14: one by one
    for _ in range(_ROUNDS):
        found = _members(cgroup)
        if not found:
            return
        for p in found:
            _signal(p, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    """Runs (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _parents() -> dict[int, int]:
    """pid -> parent pid, of every process (from /proc)."""
    out: dict[int, int] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return out
    for name in entries:
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            out[int(name)] = int(stat.rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def _descendants(root: int, parents: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_tree(root: int, *, include_root: bool = True) -> int:
    """Stop every descendant of `root` (again until no new one turns up), then SIGKILL
    them all, `root` too unless `include_root` is False; how many were killed. With
    `root` a subreaper this is its whole tree, orphans included."""
    if not sys.platform.startswith("linux") or not _alive(root):
        return 0  # an exited program holds no tree: its orphans went up already
    stopped: set[int] = set()
    if include_root:
        _signal(root, signal.SIGSTOP)
    for _ in range(_ROUNDS):
        fresh = _descendants(root, _parents()) - stopped
        if not fresh:
            break
        for pid in fresh:
            _signal(pid, signal.SIGSTOP)
        stopped |= fresh
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    if include_root:
        _signal(root, signal.SIGKILL)
    return len(stopped)
