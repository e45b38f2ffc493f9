"""Files a spark loop's driver and its python workers share when they run on one machine
(a local master): the stop marker the driver leaves when the loop is cancelled or timed
out, which a partition looks for between items (`stopped`), and each partition's count of
items done, which the driver adds up for the loop's progress (`write_done`, `read_done`).

With another master the python workers may run elsewhere: there are no such files
(`marks_for` gives None); a cancel then stops the items when Spark kills their workers,
and progress moves a task at a time.

The files are in a folder of the loop's own, made for it in the temporary folder
(`tempfile.mkdtemp`: a random name, made only if it was not there, readable and
writable by this user alone): another local user cannot stop the loop, forge its counts
or have its files written through a link of theirs, even though the temporary folder
lists the folder's name. Counts go in whole (written aside, then renamed); the driver
removes them as the job ends, the folder with the stop marker a minute later (a python
worker whose task was cancelled still looks for it), and the folders of a driver that
could not (killed) once they are an hour old (only its own user's, never through a link).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import stat
import tempfile
import threading
import time

__all__ = ["forget", "make", "marks_for", "read_done", "stop", "stopped", "write_done"]

_PREFIX = "flowtide-spark-loop-"
#: Seconds the stop marker stays after the job ended (python workers of its cancelled
#: tasks may still be running and look for it).
_STOP_KEEP_SECONDS = 60.0
#: Files older than this are a killed driver's: removed by the next loop's driver.
_STALE_SECONDS = 3600.0
#: Digits of a count, at most (more is not a count a partition wrote).
_MAX_DIGITS = 18
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

_kept: set[str] = set()
_kept_lock = threading.Lock()


def marks_for(key: str) -> str | None:
    """The folder of loop `key`'s files (made now, see `make`), or None when its python
    workers may run on another machine (a master that is not local)."""
    from flowtide.spark.session import sessions

    info = sessions.info
    if info is None or not info.master.startswith("local"):
        return None
    return make(key)


def make(key: str) -> str:
    """A new folder for a loop's files, this user's alone (mode 0700), its name `key`
    and random letters after the common prefix."""
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{key}-")


def stop(base: str) -> None:
    """Leave the stop marker of the loop at `base` (its folder made again, this user's
    alone, if another driver took it for a killed driver's)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OSError(f"{base} is not this user's folder: the stop marker is not left there")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
    with contextlib.suppress(FileExistsError):
        os.close(os.open(_stop_path(base), flags, 0o600))


def stopped(base: str) -> bool:
    """Whether the loop at `base` was stopped (its driver left the marker)."""
    return os.path.exists(_stop_path(base))


def write_done(base: str, partition: int, done: int) -> None:
    """Partition `partition` of the loop at `base` has run `done` items (its attempt:
    an attempt run again starts from 0, which the driver's count never goes below)."""
    path = os.path.join(base, f"p{int(partition)}")
    aside = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with contextlib.suppress(OSError):  # progress is news: a full disk stops no item
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(str(max(0, int(done))))
        os.replace(aside, path)


def read_done(base: str) -> int | None:
    """The items done in all partitions of the loop at `base`; None when none wrote.
    A count that is not a whole number of at most `_MAX_DIGITS` digits is not read."""
    total, seen = 0, False
    try:
        names = os.listdir(base)
    except OSError:
        return None
    for name in names:
        if not name.startswith("p") or "." in name:
            continue  # the stop marker, or a count being written aside
        try:
            with open(os.path.join(base, name)) as f:
                text = f.read(_MAX_DIGITS + 1).strip()
        except OSError:
            continue
        if text.isdigit() and len(text) <= _MAX_DIGITS:
            total += int(text)
            seen = True
    return total if seen else None


def forget(base: str) -> None:
    """The job of the loop at `base` ended: its counts go now, its folder (with the stop
    marker, if it was left) in `_STOP_KEEP_SECONDS`; a killed driver's old folders go
    too."""
    if not os.path.exists(_stop_path(base)):
        _remove(base)
    else:
        with contextlib.suppress(OSError):
            for name in os.listdir(base):
                if name.startswith("p"):
                    os.unlink(os.path.join(base, name))

        def remove() -> None:
            with _kept_lock:
                _kept.discard(base)
            _remove(base)

        with _kept_lock:
            _kept.add(base)
        timer = threading.Timer(_STOP_KEEP_SECONDS, remove)
        timer.daemon = True
        timer.start()
    now = time.time()
    for old in glob.glob(os.path.join(tempfile.gettempdir(), _PREFIX + "*")):
        with contextlib.suppress(OSError):  # gone meanwhile
            info = os.lstat(old)
            mine = stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
            if mine and now - info.st_mtime > _STALE_SECONDS:
                _remove(old)


def _stop_path(base: str) -> str:
    return os.path.join(base, "stop")


def _remove(base: str) -> None:
    """Remove the folder `base` and its files (never what a link in it points to)."""
    shutil.rmtree(base, ignore_errors=True)


def _remove_kept() -> None:
    with _kept_lock:
        left = list(_kept)
        _kept.clear()
    for path in left:
        _remove(path)


atexit.register(_remove_kept)
