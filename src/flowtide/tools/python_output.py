"""Capturing what a python step prints: `_Capture` is one call's buffer, capped at its
limit; `_make_print` is the `print` bound to it in the code's namespace; `_RoutingStream`
replaces sys.stdout/sys.stderr once and sends a write from a thread running python-tool
code (`_tls.capture`) to that call's buffer and any other write to the stream that was
there before. See `flowtide.tools.python` for why both are needed.
"""

from __future__ import annotations

import builtins
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any


class _Capture:
    """One call's output buffer, capped at `limit` characters. `tee`: also given every
    write as it happens (the command's live log, `flowtide.logs`)."""

    __slots__ = ("parts", "size", "limit", "dropped", "closed", "tee")

    def __init__(self, limit: int, tee: Callable[[str], None] | None = None) -> None:
        self.tee = tee
        self.parts: list[str] = []
        self.size = 0
        self.limit = limit
        self.dropped = 0
        self.closed = False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        n = len(text)
        if self.closed:
            # An abandoned (timed-out) thread still printing: its call already reported.
            return n
        if self.tee is not None:
            self.tee(text)
        room = self.limit - self.size
        if n <= room:
            self.parts.append(text)
            self.size += n
        else:
            if room > 0:
                self.parts.append(text[:room])
                self.size = self.limit
            self.dropped += n - max(room, 0)
        return n

    def drain_into(self, sink: list[str]) -> None:
        """Append the output to `sink` one line per string, then stop accepting writes."""
        self.closed = True
        text = "".join(self.parts)
        self.parts = []
        if text:
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()
            sink.extend(lines)
        if self.dropped:
            sink.append(
                f"[flowtide: output truncated at {self.limit} characters; "
                f"{self.dropped} more not shown]"
            )


_tls = threading.local()
_routing_lock = threading.Lock()


class _RoutingStream:
    """Stand-in for sys.stdout/sys.stderr that routes writes by thread.

    A thread running python-tool code has `_tls.capture` set: its writes go there. Every
    other thread writes through to the stream that was installed before us, so the
    process's real output is never taken over.
    """

    def __init__(self, target: Any) -> None:
        self._target = target

    def write(self, text: str) -> int:
        capture: _Capture | None = getattr(_tls, "capture", None)
        if capture is not None:
            return capture.write(text)
        if self._target is None:  # pythonw-style interpreter without a console
            return len(text)
        written = self._target.write(text)
        return len(text) if written is None else int(written)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if getattr(_tls, "capture", None) is None and self._target is not None:
            self._target.flush()

    def isatty(self) -> bool:
        if getattr(_tls, "capture", None) is not None or self._target is None:
            return False
        return bool(self._target.isatty())

    def __getattr__(self, name: str) -> Any:
        # encoding, errors, fileno, buffer, ...: whatever the wrapped stream offers.
        return getattr(self._target, name)


def _ensure_routing() -> None:
    """Install the routing proxy on sys.stdout/sys.stderr unless it is already there."""
    if type(sys.stdout) is _RoutingStream and type(sys.stderr) is _RoutingStream:
        return
    with _routing_lock:
        for name in ("stdout", "stderr"):
            current = getattr(sys, name)
            if type(current) is not _RoutingStream:
                setattr(sys, name, _RoutingStream(current))


def _make_print(capture: _Capture) -> Callable[..., None]:
    """A `print` for the code's namespace that writes to this call's buffer."""
    real_print = builtins.print

    def print(
        *args: Any,
        sep: str | None = " ",
        end: str | None = "\n",
        file: Any = None,
        flush: bool = False,
    ) -> None:
        if file is not None:
            real_print(*args, sep=sep, end=end, file=file, flush=flush)
            return
        if sep is None:
            sep = " "
        if end is None:
            end = "\n"
        if not isinstance(sep, str) or not isinstance(end, str):
            raise TypeError("sep and end must be None or a string")
        capture.write(sep.join([str(a) for a in args]) + end)

    return print
