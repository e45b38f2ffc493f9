"""Snowflake ids: layout, uniqueness under threads, and no going back with the clock."""

from __future__ import annotations

import threading

import xxhash

from flowtide.ids import EPOCH_MS, Snowflake, machine_id, timestamp_ms


class FakeClock:
    def __init__(self, seconds: float) -> None:
        self.now = seconds

    def __call__(self) -> float:
        return self.now


def test_layout_time_machine_sequence() -> None:
    clock = FakeClock(1_750_000_000.0)
    gen = Snowflake("worker-a", clock=clock)
    first = gen.next_id()
    assert timestamp_ms(first) == 1_750_000_000_000
    assert (first >> 22) == 1_750_000_000_000 - EPOCH_MS
    assert (first >> 12) & 0x3FF == machine_id("worker-a")
    assert first & 0xFFF == 0
    second = gen.next_id()
    assert second == first + 1  # same millisecond: the sequence counts


def test_machine_id_is_the_hash_of_worker_id() -> None:
    assert machine_id("w1") == xxhash.xxh64_intdigest(b"w1") & 0x3FF
    assert 0 <= machine_id("anything") < 1024


def test_monotonic_when_the_clock_steps_back() -> None:
    clock = FakeClock(1_750_000_000.0)
    gen = Snowflake("w", clock=clock)
    before = [gen.next_id() for _ in range(5)]
    clock.now -= 30.0  # NTP steps the clock back half a minute
    after = [gen.next_id() for _ in range(5)]
    ids = before + after
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_sequence_overflow_borrows_the_next_millisecond() -> None:
    clock = FakeClock(1_750_000_000.0)
    gen = Snowflake("w", clock=clock)
    ids = [gen.next_id() for _ in range(5000)]  # more than 4096 in one millisecond
    assert ids == sorted(ids) and len(set(ids)) == 5000
    assert timestamp_ms(ids[-1]) == 1_750_000_000_001


def test_unique_across_threads() -> None:
    gen = Snowflake("w")
    out: list[list[int]] = [[] for _ in range(8)]

    def work(slot: list[int]) -> None:
        slot.extend(gen.next_id() for _ in range(2000))

    threads = [threading.Thread(target=work, args=(slot,)) for slot in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for slot in out for i in slot]
    assert len(set(every)) == len(every) == 16000
