"""Where a command's time goes between processes: marks for the benchmark's per-hop trace
(`bench/distributed.py --trace`).

Off unless `FLOWTIDE_TRACE` names a directory: then each process (server or worker)
records `(point, command_id, wall-clock time)` marks in memory and writes them, as JSON
lines, to `<dir>/<role>-<pid>.jsonl` every second and when it exits. Disabled, a mark is
one test of a module global. The points, in the order one loop iteration passes them:

    worker   done        the tool finished (the command's `command.completed` time)
    worker   report      its report left in a request
    server   arrived     the report's request reached the server
    server   locked      the step that takes it holds the execution's lock
    server   took        that step committed (for each report it took)
    server   issued      that step committed (for each command it issued)
    server   published   the command's notification was published to JetStream
    worker   delivered   the notification reached a worker
    worker   claim       its claim left in a request
    server   claimed     the claim's transaction committed
    worker   answered    the claim's answer reached the worker
    worker   started     the tool started

Wall clocks are compared across processes: the trace is meant for one machine.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path

__all__ = ["enabled", "mark", "marks"]

_DIR = ""
#: Whether marks are recorded: FLOWTIDE_TRACE is set, read when the process `start`s.
enabled = False
_marks: list[tuple[str, int, float]] = []
_lock = threading.Lock()
_role = "process"
_started = False


def mark(point: str, command_id: int, at: float | None = None) -> None:
    """Record that `command_id` passed `point` now (or at `at`, a time.time())."""
    if not enabled:
        return
    with _lock:
        _marks.append((point, command_id, time.time() if at is None else at))


def marks(ids: list[int], point: str, at: float | None = None) -> None:
    """`mark` for several commands at one time."""
    if not enabled:
        return
    now = time.time() if at is None else at
    with _lock:
        _marks.extend((point, c, now) for c in ids)


def start(role: str) -> None:
    """Name this process's file and start writing it (once; nothing when disabled)."""
    global _DIR, _role, _started, enabled
    if _started:
        return
    from flowtide.settings import HomeSection, current

    _DIR = current(HomeSection).trace or ""
    enabled = bool(_DIR)
    if not enabled:
        return
    _role, _started = role, True
    Path(_DIR).mkdir(parents=True, exist_ok=True)
    atexit.register(_flush)
    threading.Thread(target=_flusher, name="flowtide-trace", daemon=True).start()


def _flusher() -> None:
    while True:
        time.sleep(1.0)
        _flush()


def _flush() -> None:
    with _lock:
        taken = _marks[:]
        _marks.clear()
    if not taken:
        return
    path = Path(_DIR) / f"{_role}-{os.getpid()}.jsonl"
    with path.open("a", encoding="utf-8") as out:
        out.writelines(json.dumps([p, c, t]) + "\n" for p, c, t in taken)
