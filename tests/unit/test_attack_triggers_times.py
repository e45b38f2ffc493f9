"""Attacks on schedule times: an `every` schedule's slots at an instant where a float can
no longer count milliseconds (`start: 1e300`, a backfill from `-1e300`) used to loop
forever on the server's event loop (listing schedules, the scheduler, a backfill); a
cron backfill from year 1 raised an OverflowError (a 500). Times are Unix seconds from
1970 to the end of year 9999."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest

from flowtide.errors import TriggerError
from flowtide.triggers.plan import backfill, plan
from flowtide.triggers.schedules import schedule_from_fields
from flowtide.triggers.spec import ScheduleSpec, parse_time
from flowtide.triggers.when import LATEST, cron, every, iter_slots, next_slots, slots


def _within(seconds: float, work: Callable[[], Any]) -> Any:
    """`work()`'s result, failing (not hanging) if it takes longer than `seconds`."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.mark.parametrize(
    "value", [1e300, -1e300, 1e20, -1, "0001-01-01T00:00:00Z", "10000-01-01T00:00:00Z", 2**64]
)
def test_a_time_outside_1970_to_9999_is_refused(value: Any) -> None:
    with pytest.raises(TriggerError) as refused:
        _within(5, lambda: parse_time(value, "start"))
    assert refused.value.field == "start"


def test_edges_of_the_range_are_times() -> None:
    assert parse_time(0, "start") == 0.0
    assert parse_time("9999-12-31T23:59:59Z", "end") == LATEST


@pytest.mark.parametrize("key", ["start", "end"])
def test_a_schedule_starting_or_ending_at_1e300_is_refused(key: str) -> None:
    fields = {"playbook": "p", "every": "1ms", key: 1e300}
    with pytest.raises(TriggerError) as refused:
        _within(5, lambda: schedule_from_fields("far", fields))
    assert refused.value.field == key
    with pytest.raises(TriggerError):
        ScheduleSpec(name="far", playbook="p", when=every("1ms"), **{key: 1e300})


@pytest.mark.parametrize("after", [1e300, -1e300, 1e18, -1e18])
def test_every_slots_at_extreme_instants_end(after: float) -> None:
    when = every("1ms")
    found = _within(5, lambda: next_slots(when, after, 3))
    assert len(found) <= 3
    assert all(after < t <= LATEST for t in found)
    _within(5, lambda: list(slots(when, after, after + 1)))


def test_a_stored_spec_with_a_far_start_plans_without_hanging() -> None:
    # A definition written before times were checked: its plan ends.
    spec = ScheduleSpec(name="far", playbook="p", when=every("1ms"))
    object.__setattr__(spec, "start", 1e300)
    result = _within(5, lambda: plan(spec, after=0.0, now=1e9, running=[], buffered=[]))
    assert not any(type(d).__name__ == "Fire" for d in result.decisions)


@pytest.mark.parametrize("expr", ["0 0 * * *", "* * * * * *"])
def test_cron_slots_near_the_calendar_edges_end(expr: str) -> None:
    when = cron(expr)
    assert _within(5, lambda: next_slots(when, -62135596800.0, 1)) is not None
    assert _within(5, lambda: next_slots(when, LATEST, 1)) == []


def test_a_backfill_from_year_one_is_refused_not_a_crash() -> None:
    spec = ScheduleSpec(name="daily", playbook="p", when=cron("0 0 * * *"))
    with pytest.raises(TriggerError):
        start = parse_time("0001-01-01T00:00:00Z", "start")
        backfill(spec, start=start, end=0.0, running=[], buffered=[], limit=1000)
    # The pure function itself ends even when handed such an instant.
    found = _within(5, lambda: list(itertools.islice(iter_slots(spec.when, -62135596800.0), 2)))
    assert len(found) == 2


@pytest.mark.parametrize(
    ("expr", "zone"),
    [
        ("0 0 30 2 *", "UTC"),  # never fires
        ("0 0 31 4,6,9,11 *", "UTC"),
        ("@reboot", "UTC"),
        ("*/0 * * * *", "UTC"),
        ("0 0 * * * 2099", "UTC"),  # a year field
        ("H 0 * * *", "UTC"),  # hashed: not the same on every server
        ("0 0 1 1 *\x00", "UTC"),
        ("٠ ٠ * * *", "UTC"),  # Arabic-Indic digits
        ("0 0 * * *", "UTC\x00"),
        ("0 0 * * *", "\ud800"),
        ("0 0 * * *", "../../etc/passwd"),
        ("0 0 * * *", "x" * 10_000),
        ("x" * 100_000, "UTC"),
    ],
)
def test_cron_that_cannot_fire_or_is_not_cron_is_refused_quickly(expr: str, zone: str) -> None:
    with pytest.raises(TriggerError):
        _within(5, lambda: cron(expr, zone))


@pytest.mark.parametrize("value", ["0s", "-1s", "0.5ms", "1e3", "nan", "inf", -5, 0, 10**400])
def test_every_below_a_millisecond_or_not_a_duration_is_refused(value: Any) -> None:
    with pytest.raises(TriggerError):
        every(value)


def test_rare_cron_slots_over_the_whole_calendar_are_bounded() -> None:
    # Feb 29 on a fifth Monday: a few times a century; a backfill over 1970..9999 ends.
    spec = ScheduleSpec(name="rare", playbook="p", when=cron("0 0 29 2 1#5"))
    found = _within(10, lambda: backfill(spec, start=0, end=LATEST, running=[], buffered=[]))
    assert 0 < len(found) < 1000


@pytest.mark.parametrize("key", ["every", "catchup", "jitter", "start", "end"])
def test_an_integer_too_large_for_a_float_is_refused_not_a_crash(key: str) -> None:
    # A YAML document's `every: 1000...0` (400 digits) was an OverflowError.
    fields: dict[str, Any] = {"playbook": "p", "every": "1h", key: 10**400}
    with pytest.raises(TriggerError) as refused:
        schedule_from_fields("big", fields)
    assert refused.value.field == key


def test_a_rate_given_as_an_integer_too_large_for_a_float_is_refused() -> None:
    from flowtide.triggers.hooks import parse_rate as hook_rate
    from flowtide.triggers.subscription import parse_rate as subscription_rate

    for parse in (hook_rate, subscription_rate):
        with pytest.raises(TriggerError):
            parse(10**400)
