"""The child side of process-isolated python steps (`flowtide.tools.python_pool` starts it).

The process is started as `python -I -c BOOT SETTINGS`, with a minimal environment and,
when the worker runs as root, as an unprivileged user. Before it reads any request it
caps its own memory (RLIMIT_AS, hard limit too, so user code cannot raise it) and moves
the protocol off file descriptors 0 and 1: code that writes to fd 1 (a C extension, a
subprocess) writes to the worker's stderr instead of corrupting a reply.

Protocol: frames (`flowtide.tools.python_frames`) of JSON, requests from the parent on
the original stdin, replies on the original stdout. JSON, never
pickle, in both directions: the parent must not run anything the child says (user code
can write to the reply pipe too; the worst it can do is garble its own reply).

    request  {"source", "filename", "input", "libs", "execution_id", "context"?, "path"?,
              "live"?}
    output   {"log": "..."}   with `live`: what the code printed, before the reply (whole
                             lines, every FLUSH_INTERVAL seconds or CHUNK_BYTES)
    reply    {"ok": true, "result": ..., "stdout": [...]}
             {"ok": false, "error": {message, kind, code, data, retryable}, "stdout": [...],
              "recycle": bool}
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from typing import Any

from flowtide.tools.python_frames import read_frame, write_frame


def _watch_parent(parent: int) -> None:
    """Exit when the parent is gone: a child stuck in user code never reads the EOF."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _limit_memory(limit: int | None) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(settings: dict[str, Any]) -> None:
    """Serve requests until the parent closes the pipe."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    _limit_memory(settings.get("memory"))
    threading.Thread(
        target=_watch_parent, args=(settings["parent"],), name="parent-watch", daemon=True
    ).start()

    from flowtide.errors import ToolError
    from flowtide.tools import python as pytool

    max_bytes = int(settings["max_bytes"])
    # The interpreter's own entries (after the parent's, which BOOT put first) stay: its
    # standard library, when the parent's is one this user cannot read.
    own = [p for p in sys.path[len(settings["path"]) :] if p not in settings["path"]]
    write_frame(proto_out, json.dumps({"ready": os.getpid()}).encode())
    # Frames to the parent are written whole, one at a time (output from the flusher
    # thread, replies from this one).
    lock = threading.Lock()
    current: list[_Forward | None] = [None]
    threading.Thread(target=_flush_every, args=(current,), name="log-flush", daemon=True).start()
    while True:
        frame = read_frame(proto_in)
        if frame is None:
            return
        request = json.loads(frame)
        if "path" in request:
            sys.path[:] = [*request["path"], *own]
        stdout: list[str] = []
        reply: dict[str, Any]
        live = _Forward(proto_out, lock) if request.get("live") else None
        current[0] = live
        try:
            result = pytool.run_request(request, stdout, live.write if live else None)
            reply = {"ok": True, "result": result, "stdout": stdout}
        except ToolError as exc:
            reply = {"ok": False, "error": _error_doc(exc), "stdout": stdout}
            # A MemoryError can leave the interpreter half-broken: start afresh.
            reply["recycle"] = exc.code == "MemoryError"
        if live is not None:
            current[0] = None
            live.close()  # what is left goes before the reply; late writes are dropped
        data = json.dumps(reply).encode("utf-8", "surrogatepass")
        if len(data) > max_bytes:
            size = len(data)
            del data, reply
            error = ToolError(
                f"the result is {size} bytes of JSON, over the {max_bytes}-byte limit"
                " (FLOWTIDE_MAX_RESULT_BYTES): write large data to a table or a file and"
                " return a reference to it",
                kind="result_too_large",
            )
            data = json.dumps({"ok": False, "error": _error_doc(error), "stdout": stdout}).encode()
        with lock:
            write_frame(proto_out, data)
        _reap_orphans()


def _reap_orphans() -> None:
    """Collect the exit status of processes this one adopted (it is their subreaper:
    `flowtide.tools.reaper`), so that they do not stay zombies while it waits."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


FLUSH_INTERVAL = 0.2
CHUNK_BYTES = 16 * 1024


class _Forward:
    """What a live request's code prints, sent to the parent in `{"log"}` frames."""

    def __init__(self, fd: int, lock: threading.Lock) -> None:
        self._fd = fd
        self._lock = lock
        self._mu = threading.Lock()
        self._parts: list[str] = []
        self._size = 0
        self._closed = False

    def write(self, text: str) -> None:
        with self._mu:
            if self._closed:
                return
            self._parts.append(text)
            self._size += len(text)
            if self._size >= CHUNK_BYTES:
                self._send()

    def flush(self) -> None:
        with self._mu:
            if not self._closed:
                self._send()

    def close(self) -> None:
        with self._mu:
            self._send()
            self._closed = True

    def _send(self) -> None:
        if not self._parts:
            return
        text = "".join(self._parts)
        self._parts, self._size = [], 0
        with self._lock:
            write_frame(self._fd, json.dumps({"log": text}).encode("utf-8", "surrogatepass"))


def _flush_every(current: list[_Forward | None]) -> None:
    while True:
        time.sleep(FLUSH_INTERVAL)
        live = current[0]
        if live is not None:
            try:
                live.flush()
            except OSError:
                return  # the parent is gone


def _error_doc(exc: Any) -> dict[str, Any]:
    return {
        "message": exc.message,
        "kind": exc.kind,
        "code": exc.code,
        "data": exc.data,
        "retryable": exc.retryable,
    }
