"""Snowflake ids generated in the application.

41 bits of milliseconds since 2024-01-01T00:00:00Z (NoETL's epoch), 10 bits of machine
id, 12 bits of sequence. Ids never go backwards: when the wall clock steps back we keep
issuing from the last timestamp.

The machine id makes two processes' ids differ within one millisecond, so no two live
processes that write one database may share it. A hash (of WORKER_ID, or of host+pid) is
the embedded default: one process writes its SQLite file. Server processes and workers
**lease** theirs from the cluster database instead (`flowtide.machines`): `lease()` sets
the machine id with a deadline on this process's monotonic clock, set short of the
lease's expiry in the database; past it, `next_id` raises `MachineLeaseExpired` rather
than issue an id another process may issue too, until `lease()` is called again
(renewed, or a new id). A new holder of a machine id starts after the last millisecond
the previous one could have issued (`floor_ms`), whatever its own clock says.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

import xxhash

from flowtide.errors import MachineLeaseExpired

EPOCH_MS = 1704067200000
_MACHINE_BITS = 10
_SEQUENCE_BITS = 12
_MAX_SEQUENCE = (1 << _SEQUENCE_BITS) - 1


def machine_id(worker_id: str | None = None) -> int:
    """Return the 10-bit machine id for `worker_id` (default: $WORKER_ID, else host+pid)."""
    if worker_id is None:
        from flowtide.settings import HomeSection, read

        worker_id = read(HomeSection).worker_id or f"{socket.gethostname()}:{os.getpid()}"
    return xxhash.xxh64_intdigest(worker_id.encode()) & ((1 << _MACHINE_BITS) - 1)


MACHINES = 1 << _MACHINE_BITS


def lease_margin(seconds: float) -> float:
    """How long before a machine-id lease of `seconds` ends its holder stops issuing ids:
    a tenth of it, half a second at least (the room a renewal and the clocks need)."""
    return max(0.5, seconds * 0.1)


def _in_event_loop() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Snowflake:
    """Thread-safe snowflake generator."""

    def __init__(
        self,
        worker_id: str | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.machine = machine_id(worker_id)
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._renewed = threading.Condition(self._lock)
        self._last_ms = -1
        self._seq = 0
        #: With a leased machine id: the monotonic time after which no id is issued.
        self._valid_until: float | None = None
        #: Seconds `next_id` waits for a lapsed lease to be renewed before it raises (a
        #: worker's command threads; never in a thread running an event loop, which may
        #: be the one that renews it). 0: raise at once (a server's requests).
        self.wait_for_lease = 0.0

    def lease(self, machine: int, *, valid_for: float, floor_ms: int = 0) -> None:
        """Issue ids as `machine` for the next `valid_for` seconds (of this process's
        monotonic clock), none at or before Unix millisecond `floor_ms` (the last one
        the machine id's previous holder could have used)."""
        if not 0 <= machine < MACHINES:
            raise ValueError(f"machine id {machine} is outside 0..{MACHINES - 1}")
        with self._lock:
            if machine != self.machine:
                self.machine = machine
                self._seq = 0
            self._last_ms = max(self._last_ms, floor_ms + 1 - EPOCH_MS)
            self._valid_until = self._monotonic() + valid_for
            self._renewed.notify_all()

    def _lapsed(self) -> bool:
        return self._valid_until is not None and self._monotonic() > self._valid_until

    def end_lease(self) -> int:
        """Issue no more ids until the next `lease()` (the machine id is given back);
        the last Unix millisecond an id was issued at, what the next holder of the
        machine id starts after."""
        with self._lock:
            self._valid_until = -1.0
            return self._last_ms + EPOCH_MS

    def issued_until_ms(self, *, extended_by: float = 0.0) -> int:
        """A Unix millisecond no id of this generator will go past while its lease
        lasts (`extended_by` seconds more: the lease being renewed): what the next
        holder of the machine id must start after if this process dies holding it."""
        with self._lock:
            last = self._last_ms + EPOCH_MS
            if self._valid_until is None:
                return last
            # The renewed term replaces what is left of this one; it does not add to it.
            remaining = max(self._valid_until - self._monotonic(), extended_by, 0.0)
            # The clock may not go past the deadline; +1 for a borrowed millisecond.
            return max(last, int((self._clock() + remaining) * 1000)) + 1

    def next_id(self) -> int:
        """The next id.

        Raises:
            MachineLeaseExpired: the machine id's lease ran out (see the module).
        """
        with self._lock:
            if self._lapsed() and self.wait_for_lease > 0 and not _in_event_loop():
                self._renewed.wait_for(lambda: not self._lapsed(), timeout=self.wait_for_lease)
            if self._lapsed():
                raise MachineLeaseExpired(
                    f"the lease of machine id {self.machine} ran out before it was renewed"
                    " (is the cluster database reachable?): no ids until it is"
                )
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


def default_generator() -> Snowflake:
    """The process-wide generator: the one a server or worker process leases a machine
    id for, and the one `new_id` draws from."""
    return _default


def new_id() -> int:
    """Next id from the process-wide generator."""
    return _default.next_id()
