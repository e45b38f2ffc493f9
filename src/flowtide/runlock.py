"""Which process runs an embedded execution.

An embedded execution lives in the process that started it (`flowtide run`, or
`flowtide ui` when a user starts one from the page); its row says `running` until it
ends, also while nobody runs it any more (the process was stopped). Resuming one that a
live process still runs would run its commands twice, so a runtime holds an exclusive
`flock` on `<folder>/<execution_id>.lock` for each execution it runs, and a resume takes
the same lock without waiting: held means "running elsewhere" (the file names the pid).
The operating system drops the lock when the process dies, however it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from flowtide.errors import FlowtideError, NotFoundError
from flowtide.home import private_dir
from flowtide.store.base import ENDED_STATUSES, INTERRUPTED

if TYPE_CHECKING:
    from collections.abc import Iterable

    from flowtide.store.base import Store

__all__ = ["INTERRUPTED", "ExecutionBusy", "RunLocks", "run_locks_for", "stopped_runs"]


class ExecutionBusy(FlowtideError):
    """Another live process runs the execution."""

    def __init__(self, execution_id: int, pid: int | None) -> None:
        self.execution_id = execution_id
        self.pid = pid
        who = f"process {pid}" if pid else "another process"
        super().__init__(f"execution {execution_id} is running in {who}: stop it there first")


class RunLocks:
    """Exclusive per-execution locks in `folder` (made on first use)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._held: dict[int, int] = {}  # execution_id -> open file descriptor
        self._lock = threading.Lock()

    def _path(self, execution_id: int) -> Path:
        return self.folder / f"{int(execution_id)}.lock"

    def acquire(self, execution_id: int) -> None:
        """Hold `execution_id`'s lock (a no-op when this object holds it already).

        Raises:
            ExecutionBusy: another process holds it.
        """
        with self._lock:
            if execution_id in self._held:
                return
            private_dir(self.folder)
            fd = os.open(self._path(execution_id), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _read_pid(fd)
                os.close(fd)
                raise ExecutionBusy(execution_id, pid) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            self._held[execution_id] = fd

    def release(self, execution_id: int) -> None:
        """Let go of `execution_id`'s lock (its file stays: removing it would race a
        process that opened it and is about to lock it)."""
        with self._lock:
            fd = self._held.pop(execution_id, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)

    def release_all(self) -> None:
        for execution_id in list(self._held):
            self.release(execution_id)

    def holds(self, execution_id: int) -> bool:
        """Whether this object holds `execution_id`'s lock."""
        return execution_id in self._held

    def busy(self, execution_id: int) -> int | None:
        """The pid of another process that runs `execution_id` (0 when it is not
        known), or None when no other process runs it."""
        if execution_id in self._held:
            return None
        try:
            fd = os.open(self._path(execution_id), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_pid(fd) or 0
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def run_locks_for(store: Store, home: Path) -> RunLocks:
    """The locks of the executions in `store`: next to a SQLite file (every process that
    opens it sees the same folder), in `home` for another store."""
    path = getattr(store, "path", None)
    if isinstance(path, (str, Path)) and str(path) != ":memory:":
        db = Path(path).absolute()
        return RunLocks(db.with_name(db.name + ".runs"))
    return RunLocks(home.absolute() / "runs")


def stopped_runs(store: Store, locks: RunLocks, execution_ids: Iterable[int]) -> dict[int, float]:
    """Of `execution_ids` (rows that said running), those that no live process runs any
    more, each with when it stopped (its last event's time): nobody holds its run lock,
    and its row, read again after the lock, still has not ended (a run that ends lets go
    of its lock after its row says so). Blocks on the store and the file system."""
    out: dict[int, float] = {}
    for execution_id in execution_ids:
        if locks.holds(execution_id) or locks.busy(execution_id) is not None:
            continue
        try:
            row = store.get_execution(execution_id)
        except NotFoundError:
            continue
        if row.status in ENDED_STATUSES:
            continue
        span = store.event_span(execution_id)
        out[execution_id] = span[1] if span is not None else row.updated
    return out
