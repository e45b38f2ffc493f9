"""A worker's command logs (`flowtide.logs`): each chunk is published, as it is flushed,
to the command's subject of the log stream (`flowtide.wire.log_subject`), raw bytes with
the offset of their first byte and the step in headers. The stream keeps the newest
messages of each command (`flowtide.server.logs`); a server reads them for the API.

Publishing never blocks a step: the chunk is handed to the worker's event loop (a core
NATS publish, buffered by the client); past `MAX_PENDING` chunks waiting, the newest are
dropped (and counted) rather than held.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Final

from flowtide.logs import LogKey
from flowtide.wire import log_subject

__all__ = ["MAX_CHUNK", "NatsLogSpool"]

#: Largest message published (the end of a bigger chunk is kept).
MAX_CHUNK: Final = 32 * 1024
#: Chunks handed to the event loop and not yet published, at most.
MAX_PENDING: Final = 256


class NatsLogSpool:
    """A `LogSpool` publishing to NATS from any thread."""

    def __init__(self, nc: Any, loop: asyncio.AbstractEventLoop, pool: str) -> None:
        self._nc = nc
        self._loop = loop
        self._pool = pool
        self._lock = threading.Lock()
        self._pending = 0
        self.dropped = 0

    def append(self, key: LogKey, data: bytes, total: int, lines: int) -> None:
        data = data[-MAX_CHUNK:]
        headers = {"Flowtide-Start": str(total - len(data)), "Flowtide-Step": key.step}
        if key.loop_index is not None:
            headers["Flowtide-Loop-Index"] = str(key.loop_index)
        subject = log_subject(self._pool, key.execution_id, key.command_id)
        with self._lock:
            if self._pending >= MAX_PENDING:
                self.dropped += 1
                return
            self._pending += 1
        try:
            self._loop.call_soon_threadsafe(self._publish, subject, data, headers)
        except RuntimeError:  # the loop is closed: the worker is stopping
            self._done()

    def close(self, key: LogKey, total: int, lines: int) -> None:
        pass

    def _publish(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        task = self._loop.create_task(self._nc.publish(subject, data, headers=headers))
        task.add_done_callback(lambda _: self._done())

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1
