"""The embedded runtime's command logs (`flowtide.logs`): one file per command that
printed under `<home>/data/logs/<execution>/<command>.log`, so that another process
(`flowtide logs -f`, `flowtide ui`) follows a run of `flowtide run`.

A file is a JSON header line (`step`, `command_id`, `loop_index`, `start`: the offset of
the first byte kept in the command's whole output) and the output from there. Appends go
to the end; once the kept part passes twice `RING_BYTES` the file is rewritten with its
last `RING_BYTES` (from a line start) and a new `start`, and atomically renamed over the
old one, so a reader sees either. The files stay after the command ends (they hold the
end of its output, its events the first 16 KiB) until `flowtide prune` removes the
execution's files.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowtide.home import private_dir
from flowtide.logs import RING_BYTES, LogKey

__all__ = ["FileSpool", "LiveLog", "read_live"]

_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
#: Command logs of one execution that one read looks at, at most (the others wait for
#: the next read of a follower).
MAX_FILES: int = 256


@dataclass(frozen=True)
class LiveLog:
    """What a command's ring holds now: `data` is its output from offset `start`."""

    command_id: int
    step: str
    loop_index: int | None
    start: int
    data: bytes
    #: The command is one its execution runs now (False: a ring the reader could not
    #: tie to a running command of the execution; only an ended command's is shown).
    open: bool = True

    @property
    def end(self) -> int:
        return self.start + len(self.data)


class FileSpool:
    """A `LogSpool` writing each command's ring to a file (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        #: command id -> (start, bytes kept in its file)
        self._kept: dict[int, tuple[int, int]] = {}

    def _path(self, key: LogKey) -> Path:
        return self.root / str(key.execution_id) / f"{key.command_id}.log"

    def _header(self, key: LogKey, start: int) -> bytes:
        doc = {
            "step": key.step,
            "command_id": key.command_id,
            "loop_index": key.loop_index,
            "start": start,
        }
        return json.dumps(doc).encode() + b"\n"

    def append(self, key: LogKey, data: bytes, total: int, lines: int) -> None:
        path = self._path(key)
        with self._lock:
            state = self._kept.get(key.command_id)
            if len(data) > RING_BYTES:  # one chunk over the ring: keep its end
                data = data[-RING_BYTES:]
                start, kept = total - len(data), len(data)
                private_dir(path.parent)
                self._rewrite(path, key, start, data)
            elif state is None:
                start, kept = total - len(data), len(data)
                private_dir(path.parent)
                self._rewrite(path, key, start, data)
            else:
                start, kept = state
                with open(os.open(path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW), "ab") as f:
                    f.write(data)
                kept += len(data)
                if kept > 2 * RING_BYTES:
                    start, kept = self._compact(path, key, start)
            self._kept[key.command_id] = (start, kept)

    def close(self, key: LogKey, total: int, lines: int) -> None:
        with self._lock:
            self._kept.pop(key.command_id, None)

    def _compact(self, path: Path, key: LogKey, start: int) -> tuple[int, int]:
        found = _read(path)
        if found is None:
            return start, 0
        header, data = found
        cut = len(data) - RING_BYTES
        newline = data.find(b"\n", cut, cut + 1024)
        if newline >= 0:
            cut = newline + 1
        start = int(header.get("start") or 0) + cut
        self._rewrite(path, key, start, data[cut:])
        return start, len(data) - cut

    def _rewrite(self, path: Path, key: LogKey, start: int, data: bytes) -> None:
        tmp = path.with_suffix(".tmp")
        # What a step printed is this user's alone (0600; its folders are 0700).
        # Never through a link put in its place: the step's output would go where it
        # points (a file of the user's, written with the log's bytes).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        with open(fd, "wb") as f:
            f.write(self._header(key, start))
            f.write(data)
        os.replace(tmp, path)


def _read(path: Path) -> tuple[dict[str, Any], bytes] | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    line, _, data = raw.partition(b"\n")
    try:
        header = json.loads(line)
    except ValueError:
        return None
    return (header, data) if isinstance(header, dict) else None


def read_live(root: Path, execution_id: int, skip: Set[int] = frozenset()) -> dict[int, LiveLog]:
    """The rings of an execution's commands that printed, but those in `skip`."""
    folder = root / str(execution_id)
    out: dict[int, LiveLog] = {}
    with contextlib.suppress(OSError):
        paths = [p for p in folder.glob("*.log") if not (p.stem.isdigit() and int(p.stem) in skip)]
        for i, path in enumerate(sorted(paths)):
            if i >= MAX_FILES:
                break
            found = _read(path)
            if found is None:
                continue
            header, data = found
            with contextlib.suppress(TypeError, ValueError):
                index = header.get("loop_index")
                log = LiveLog(
                    command_id=int(header["command_id"]),
                    step=str(header["step"]),
                    loop_index=None if index is None else int(index),
                    start=int(header.get("start") or 0),
                    data=data,
                )
                out[log.command_id] = log
    return out
