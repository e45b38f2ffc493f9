"""Pacing a spark loop's item starts: `loop.spec.rate` items per second across the job.

The driver runs a loop with a `rate` as one wave, one partition per task slot, and gives
each partition an equal share of the rate (`share`). A partition's `Pacer` schedules its
item starts on the monotonic clock: start `i` is due at `t0 + i / share`, `t0` the first
start. Due times are computed from `t0`, never from the previous start, so sleeping late
or an item that ran long does not shift the schedule (no drift). A partition that fell
behind starts its late items at once, but keeps at most `burst` slots of lateness: what
is beyond is forgiven, so after a stall (a slow server) the starts are never more than
`burst` ahead of the rate. With `max_in_flight` threads each thread waits for the slot it took:
the pacing is at start time, whatever the items take.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["CATCH_UP_SECONDS", "Pacer", "burst_for", "share_of"]

#: How far behind its schedule a partition may catch up, in seconds of its share.
CATCH_UP_SECONDS = 0.05


def share_of(rate: float, partitions: int, slots: int) -> float:
    """Items per second for each partition: the rate split over the partitions that run
    at once (more partitions than slots run in waves, each wave at the full rate)."""
    return rate / max(1, min(partitions, slots))


def burst_for(share: float, max_in_flight: int) -> int:
    """Slots of lateness a partition may catch up at once: 50 ms of its share (a late
    wake-up or a slow call costs nothing; a stall is not made up for), and at least one
    per thread (a window of `max_in_flight` items starts together)."""
    return max(1, max_in_flight, math.ceil(share * CATCH_UP_SECONDS))


class Pacer:
    """Item starts at `per_second` on `clock` (thread-safe): call `wait()` before each.

    `clock` and `sleep` are `time.monotonic` and `time.sleep` unless given (tests pass a
    fake clock).
    """

    def __init__(
        self,
        per_second: float,
        *,
        burst: int = 1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not per_second > 0:
            raise ValueError(f"a pace needs a positive rate, got {per_second!r}")
        self.interval = 1.0 / per_second
        # Lateness kept (seconds): `burst` starts besides the one due now, at most.
        self.slack = max(1, burst) * self.interval
        self.clock = clock
        self.sleep = sleep
        self.t0: float | None = None
        self.started = 0
        self._lock = threading.Lock()

    def due(self) -> float:
        """Take the next start's slot: the clock time at which it may start (now or later)."""
        with self._lock:
            now = self.clock()
            if self.t0 is None:
                self.t0 = now
            at = self.t0 + self.started * self.interval
            if at < now - self.slack:
                # Too far behind: forgive what is over `burst` slots (the schedule moves on).
                self.t0 += (now - self.slack) - at
                at = now - self.slack
            self.started += 1
            return at

    def wait(self) -> None:
        """Sleep until the next start's slot (no busy wait; not at all when it is due)."""
        delay = self.due() - self.clock()
        if delay > 0:
            self.sleep(delay)
