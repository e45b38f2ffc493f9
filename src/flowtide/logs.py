"""Live logs of a running step: what its tools write (a python step's prints, a shell or
script program's stdout and stderr, spark driver messages) forwarded while it runs.

The process that runs a command gives its tools a `CommandLog` (`ToolContext.log`). Text
written to it is masked with the secrets known at that time (the process's, the call's)
and handed to a `LogSpool` in chunks: whole lines, at least every `FLUSH_INTERVAL`
seconds (one flusher thread per process) or as soon as `CHUNK_BYTES` are waiting. The
spool keeps a bounded ring per command, the last `RING_BYTES` plus the total size and
line count: a file per command for the embedded runtime (`flowtide.logfiles`), a
JetStream subject per command for a worker (`flowtide.worker._logs`). Once the command
has ended its output is read from its events, as before (`flowtide.logread`).
"""

from __future__ import annotations

import codecs
import contextvars
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from flowtide.redaction import known, mask_text

__all__ = [
    "CHUNK_BYTES",
    "FLUSH_INTERVAL",
    "RING_BYTES",
    "CommandLog",
    "LogKey",
    "LogSpool",
    "current_log",
]

#: Bytes of a command's newest output that its ring keeps (the total is counted on).
RING_BYTES: Final = 64 * 1024
#: Largest chunk forwarded at once; a write waits for a flush past this size.
CHUNK_BYTES: Final = 16 * 1024
#: Seconds between two flushes of what a command wrote.
FLUSH_INTERVAL: Final = 0.2


@dataclass(frozen=True)
class LogKey:
    """Which command a log is of."""

    execution_id: int
    command_id: int
    step: str
    loop_index: int | None = None


class LogSpool(Protocol):
    """Where a process's command logs go (bounded per command)."""

    def append(self, key: LogKey, data: bytes, total: int, lines: int) -> None:
        """Add `data` (masked output; `total` bytes and `lines` lines so far)."""
        ...

    def close(self, key: LogKey, total: int, lines: int) -> None:
        """The command has ended: nothing more will be appended."""
        ...


class CommandLog:
    """What one command's tools write, masked and forwarded to a spool in chunks.
    Thread-safe: a step's own threads may write too."""

    def __init__(
        self,
        key: LogKey,
        spool: LogSpool,
        secrets: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self.key = key
        self._spool = spool
        self._secrets = secrets
        self._call_secrets: set[str] = set()
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._size = 0
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self.total = 0
        self.lines = 0
        self.closed = False
        _flusher.add(self)

    def add_secrets(self, values: Iterable[str]) -> None:
        """Mask these values too (the secrets a tool call touched)."""
        self._call_secrets.update(v for v in values if isinstance(v, str) and v)

    def known_secrets(self) -> set[str]:
        """Every value this log masks now (the process's, the execution's, the call's)."""
        secrets = set(known()) | self._call_secrets
        if self._secrets is not None:
            secrets.update(self._secrets())
        return secrets

    def write(self, text: str) -> None:
        """Add `text` (any piece of output: partial lines are held until complete)."""
        if not text or self.closed:
            return
        with self._lock:
            self._pending.append(text)
            self._size += len(text)
            if self._size >= CHUNK_BYTES:
                self._flush_locked(final=False)

    def write_bytes(self, data: bytes, stream: str = "stdout") -> None:
        """Add a program's raw output (UTF-8; invalid bytes replaced); `stream` keeps
        a character split between two reads of the same pipe whole."""
        decoder = self._decoders.get(stream)
        if decoder is None:
            decoder = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
        self.write(decoder.decode(data))

    def flush(self) -> None:
        """Forward the complete lines written so far."""
        with self._lock:
            self._flush_locked(final=False)

    def close(self) -> None:
        """Forward everything left and tell the spool the command has ended."""
        with self._lock:
            if self.closed:
                return
            self._flush_locked(final=True)
            self.closed = True
            self._spool.close(self.key, self.total, self.lines)
        _flusher.discard(self)

    def _flush_locked(self, *, final: bool) -> None:
        if not self._pending:
            return
        text = "".join(self._pending)
        secrets = self.known_secrets()
        rest = ""
        if not final:
            cut = text.rfind("\n") + 1 if self._size < CHUNK_BYTES else len(text)
            # A secret must not be split between two chunks (each masked alone): what may
            # be the start of one waits for what follows.
            cut = _before_secret(text, cut, secrets)
            text, rest = text[:cut], text[cut:]
        self._pending = [rest] if rest else []
        self._size = len(rest)
        if not text:
            return
        data = mask_text(text, frozenset(secrets)).encode("utf-8", "replace")
        self.total += len(data)
        self.lines += text.count("\n")
        self._spool.append(self.key, data, self.total, self.lines)


#: Characters at most held back as the possible start of a secret (a longer secret
#: printed in one line longer than CHUNK_BYTES may be forwarded in two parts, unmasked).
HOLD_BYTES: Final = CHUNK_BYTES // 2


def _before_secret(text: str, cut: int, secrets: Iterable[str]) -> int:
    """`cut`, or the earliest position before it from which `text[p:cut]` is the start
    of a secret (at most HOLD_BYTES back)."""
    start = cut
    for value in secrets:
        n = min(len(value) - 1, cut, HOLD_BYTES)
        if n <= 0:
            continue
        i = text.find(value[0], cut - n, cut)
        while 0 <= i < start:
            if value.startswith(text[i:cut]):
                start = i
                break
            i = text.find(value[0], i + 1, cut)
    return start


class _Flusher:
    """One daemon thread per process flushing every open command log every
    FLUSH_INTERVAL seconds (started with the first log)."""

    def __init__(self) -> None:
        self._logs: weakref.WeakSet[CommandLog] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, log: CommandLog) -> None:
        with self._lock:
            self._logs.add(log)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="flowtide-log-flush", daemon=True
                )
                self._thread.start()

    def discard(self, log: CommandLog) -> None:
        with self._lock:
            self._logs.discard(log)

    def _run(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL)
            with self._lock:
                logs = list(self._logs)
            for log in logs:
                try:
                    log.flush()
                except Exception:  # noqa: BLE001 - a spool's error must not stop the others
                    pass


_flusher = _Flusher()

#: The log of the command the current thread runs (set around a command by the runtime;
#: the step runner gives it to each tool call as `ToolContext.log`).
current_log: contextvars.ContextVar[CommandLog | None] = contextvars.ContextVar(
    "flowtide_command_log", default=None
)
