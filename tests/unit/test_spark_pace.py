"""`flowtide.spark.pace`: a spark loop's item starts at `loop.spec.rate`, on a fake clock."""

from __future__ import annotations

import threading

import pytest

from flowtide.spark.pace import Pacer, burst_for, share_of


class FakeClock:
    """A monotonic clock that moves only when slept on (or told to)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.slept.append(seconds)
        self.now += seconds


def _pacer(rate: float, burst: int = 1) -> tuple[Pacer, FakeClock]:
    clock = FakeClock()
    return Pacer(rate, burst=burst, clock=clock, sleep=clock.sleep), clock


def test_starts_follow_the_schedule_from_the_first_start() -> None:
    pacer, clock = _pacer(50)
    starts = []
    for _ in range(101):
        pacer.wait()
        starts.append(clock.now)
    assert starts[0] == 100.0  # the first start waits for nothing
    assert starts[-1] == pytest.approx(102.0)  # 100 intervals of 20 ms
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) == pytest.approx(0.02) and max(gaps) == pytest.approx(0.02)


def test_time_an_item_takes_is_not_added_to_the_schedule() -> None:
    pacer, clock = _pacer(10)
    starts = []
    for _ in range(11):
        pacer.wait()
        starts.append(clock.now)
        clock.now += 0.07  # the item runs 70 ms of its 100 ms slot
    # Sleeping the remainder only: 10 items in one second, not 10 x 170 ms.
    assert starts[-1] - starts[0] == pytest.approx(1.0)
    assert clock.slept[0] == pytest.approx(0.03)


def test_a_late_sleep_does_not_drift() -> None:
    pacer, clock = _pacer(100)
    pacer.wait()
    clock.now += 0.013  # woke 3 ms late for the second slot (due at +10 ms)
    pacer.wait()  # due in the past: starts at once
    assert clock.slept == []
    pacer.wait()  # the third is due at +20 ms, not at +13 + 10 ms
    assert clock.now == pytest.approx(100.02)


def test_a_stall_is_caught_up_by_at_most_burst_starts() -> None:
    pacer, clock = _pacer(100, burst=5)
    pacer.wait()
    clock.now += 1.0  # a slow item: 100 slots missed
    for _ in range(6):
        pacer.wait()  # the one due now and the burst of five: at once
    assert clock.slept == []
    pacer.wait()  # then the rate again, not 95 more at once
    assert clock.slept == [pytest.approx(0.01)]
    starts = []
    for _ in range(10):
        pacer.wait()
        starts.append(clock.now)
    assert starts[-1] - starts[0] == pytest.approx(0.09)


def test_with_a_burst_of_one_a_long_stall_is_forgiven() -> None:
    pacer, clock = _pacer(100)
    pacer.wait()
    clock.now += 0.5
    pacer.wait()
    pacer.wait()  # one slot caught up
    assert clock.slept == []
    pacer.wait()
    assert clock.slept == [pytest.approx(0.01)]


def test_threads_each_wait_for_the_slot_they_took() -> None:
    pacer, clock = _pacer(4)
    lock = threading.Lock()
    dues: list[float] = []

    def take() -> None:
        due = pacer.due()
        with lock:
            dues.append(due)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(dues) == pytest.approx([100 + i * 0.25 for i in range(8)])


def test_share_and_burst() -> None:
    assert share_of(2000, 2, 2) == 1000
    assert share_of(2000, 8, 2) == 1000  # waves: two at once
    assert share_of(2000, 1, 4) == 2000
    assert share_of(10, 0, 4) == 10
    assert burst_for(1000, 1) == 50
    assert burst_for(2, 1) == 1
    assert burst_for(2, 8) == 8
    with pytest.raises(ValueError, match="positive rate"):
        Pacer(0)
