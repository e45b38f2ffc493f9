"""Snowflake ids generated in the application.

41 bits of milliseconds since 2024-01-01T00:00:00Z (NoETL's epoch), 10 bits of machine
id (hash of WORKER_ID, or of host+pid when unset), 12 bits of sequence. Ids never go
backwards: when the wall clock steps back we keep issuing from the last timestamp.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

import xxhash

EPOCH_MS = 1704067200000
_MACHINE_BITS = 10
_SEQUENCE_BITS = 12
_MAX_SEQUENCE = (1 << _SEQUENCE_BITS) - 1


def machine_id(worker_id: str | None = None) -> int:
    """Return the 10-bit machine id for `worker_id` (default: $WORKER_ID, else host+pid)."""
    if worker_id is None:
        worker_id = os.environ.get("WORKER_ID") or f"{socket.gethostname()}:{os.getpid()}"
    return xxhash.xxh64_intdigest(worker_id.encode()) & ((1 << _MACHINE_BITS) - 1)


class Snowflake:
    """Thread-safe snowflake generator."""

    def __init__(
        self, worker_id: str | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.machine = machine_id(worker_id)
        self._clock = clock
        self._lock = threading.Lock()
        self._last_ms = -1
        self._seq = 0

    def next_id(self) -> int:
        with self._lock:
            now = int(self._clock() * 1000) - EPOCH_MS
            if now <= self._last_ms:
                # Same millisecond, or the clock stepped back: keep counting from the last one.
                now = self._last_ms
                self._seq = (self._seq + 1) & _MAX_SEQUENCE
                if self._seq == 0:
                    now += 1  # sequence exhausted: borrow the next millisecond
            else:
                self._seq = 0
            self._last_ms = now
            return (
                (now << (_MACHINE_BITS + _SEQUENCE_BITS))
                | (self.machine << _SEQUENCE_BITS)
                | self._seq
            )


def timestamp_ms(snowflake: int) -> int:
    """Milliseconds since the Unix epoch at which `snowflake` was generated."""
    return (snowflake >> (_MACHINE_BITS + _SEQUENCE_BITS)) + EPOCH_MS


_default = Snowflake()


def new_id() -> int:
    """Next id from the process-wide generator."""
    return _default.next_id()
