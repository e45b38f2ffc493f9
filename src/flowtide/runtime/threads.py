"""The embedded runtime's threads that run commands: tools block, so `runtime.local`
hands each command to one of these rather than running it on its engine loop. Not the
distributed runtime's worker processes (`flowtide.worker`) nor the server's registry of
them (`server.worker_registry`).

Long-lived threads reading one queue: no Future and no Condition per command (the
standard ThreadPoolExecutor costs ~20 µs per submit on the engine's hot path). The pool
grows on demand up to `max_workers`, so commands that block on a sub-playbook never
starve the commands that would finish it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


class WorkerPool:
    def __init__(self, max_workers: int = 256, name: str = "flowtide-worker") -> None:
        self.max_workers = max_workers
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on a worker thread. Exceptions are the caller's to catch in fn."""
        with self._lock:
            if self._closed:
                raise RuntimeError("worker pool is closed")
            if self._idle == 0 and len(self._threads) < self.max_workers:
                thread = threading.Thread(
                    target=self._run, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1  # claimed by this item
        self._queue.put((fn, args))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, args = item
            try:
                fn(*args)
            finally:
                with self._lock:
                    self._idle += 1

    def shutdown(self) -> None:
        """Stop the threads once they are done with what they run (does not wait)."""
        with self._lock:
            self._closed = True
            count = len(self._threads)
        for _ in range(count):
            self._queue.put(_STOP)
