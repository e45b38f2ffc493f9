"""Files a spark loop's driver and its python workers share when they run on one machine
(a local master): the stop marker the driver leaves when the loop is cancelled or timed
out, which a partition looks for between items (`stopped`), and each partition's count of
items done, which the driver adds up for the loop's progress (`write_done`, `read_done`).

With another master the python workers may run elsewhere: there are no such files
(`marks_for` gives None); a cancel then stops the items when Spark kills their workers,
and progress moves a task at a time.

The files are named after the loop's random key in the temporary folder: another
process cannot guess them. Counts go in whole (written aside, then renamed); the driver
removes them as the job ends, the stop marker a minute later (a python worker whose task
was cancelled still looks for it), and the files of a driver that could not (killed)
once they are an hour old.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import tempfile
import threading
import time

__all__ = ["forget", "marks_for", "read_done", "stop", "stopped", "write_done"]

_PREFIX = "flowtide-spark-loop-"
#: Seconds the stop marker stays after the job ended (python workers of its cancelled
#: tasks may still be running and look for it).
_STOP_KEEP_SECONDS = 60.0
#: Files older than this are a killed driver's: removed by the next loop's driver.
_STALE_SECONDS = 3600.0

_kept: set[str] = set()
_kept_lock = threading.Lock()


def marks_for(key: str) -> str | None:
    """The base path of loop `key`'s files, or None when its python workers may run on
    another machine (a master that is not local)."""
    from flowtide.spark.session import sessions

    info = sessions.info
    if info is None or not info.master.startswith("local"):
        return None
    return os.path.join(tempfile.gettempdir(), f"{_PREFIX}{key}")


def stop(base: str) -> None:
    """Leave the stop marker of the loop at `base`."""
    open(base + ".stop", "a").close()  # noqa: SIM115 - an empty file


def stopped(base: str) -> bool:
    """Whether the loop at `base` was stopped (its driver left the marker)."""
    return os.path.exists(base + ".stop")


def write_done(base: str, partition: int, done: int) -> None:
    """Partition `partition` of the loop at `base` has run `done` items (its attempt:
    an attempt run again starts from 0, which the driver's count never goes below)."""
    path = f"{base}.p{partition}"
    aside = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with contextlib.suppress(OSError):  # progress is news: a full disk stops no item
        with open(aside, "w") as f:
            f.write(str(done))
        os.replace(aside, path)


def read_done(base: str) -> int | None:
    """The items done in all partitions of the loop at `base`; None when none wrote."""
    total, seen = 0, False
    for path in glob.glob(base + ".p*"):
        if path.count(".") > base.count(".") + 1:
            continue  # a count being written aside
        try:
            with open(path) as f:
                total += int(f.read() or 0)
            seen = True
        except (OSError, ValueError):
            continue
    return total if seen else None


def forget(base: str) -> None:
    """The job of the loop at `base` ended: its counts go now, its stop marker (if it
    was left) in `_STOP_KEEP_SECONDS`; a killed driver's old files go too."""
    for path in glob.glob(base + ".p*"):
        with contextlib.suppress(OSError):
            os.unlink(path)
    now = time.time()
    for old in glob.glob(os.path.join(tempfile.gettempdir(), _PREFIX + "*")):
        with contextlib.suppress(OSError):  # another's, or gone meanwhile
            if now - os.path.getmtime(old) > _STALE_SECONDS:
                os.unlink(old)
    marker = base + ".stop"
    if not os.path.exists(marker):
        return

    def remove() -> None:
        with _kept_lock:
            _kept.discard(marker)
        with contextlib.suppress(OSError):
            os.unlink(marker)

    with _kept_lock:
        _kept.add(marker)
    timer = threading.Timer(_STOP_KEEP_SECONDS, remove)
    timer.daemon = True
    timer.start()


def _remove_kept() -> None:
    with _kept_lock:
        left = list(_kept)
        _kept.clear()
    for path in left:
        with contextlib.suppress(OSError):
            os.unlink(path)


atexit.register(_remove_kept)
