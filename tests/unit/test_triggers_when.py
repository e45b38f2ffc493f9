"""When a schedule fires (flowtide.triggers.when): cron over wall times with the DST
rules, fixed intervals, durations, and the errors a user sees."""

from __future__ import annotations

import datetime as dt
import time
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowtide.errors import TriggerError
from flowtide.triggers.when import (
    MAX_SLOTS,
    Cron,
    Every,
    cron,
    describe,
    every,
    format_duration,
    from_json,
    next_slots,
    parse_duration,
    slots,
    to_json,
)

BERLIN = "Europe/Berlin"


def utc(*parts: int) -> float:
    return dt.datetime(*parts, tzinfo=dt.UTC).timestamp()


def shown(instants: list[float], zone: str = "UTC") -> list[str]:
    """Each instant as wall time with its UTC offset, e.g. `03:00+02`."""
    out = []
    for t in instants:
        at = dt.datetime.fromtimestamp(t, ZoneInfo(zone))
        offset = at.utcoffset() or dt.timedelta()
        out.append(f"{at:%H:%M:%S}+{offset.seconds // 3600:02d}")
    return out


# -- DST: Europe/Berlin springs forward 2026-03-29 02:00 CET -> 03:00 CEST (01:00 UTC) and
# falls back 2026-10-25 03:00 CEST -> 02:00 CET (01:00 UTC).

SPRING = (utc(2026, 3, 28, 22), utc(2026, 3, 29, 4))
FALL = (utc(2026, 10, 24, 22), utc(2026, 10, 25, 4))


def test_a_daily_wall_time_in_the_spring_gap_fires_once_when_the_gap_ends() -> None:
    fired = list(slots(cron("30 2 * * *", BERLIN), *SPRING))
    assert fired == [utc(2026, 3, 29, 1)]
    assert shown(fired, BERLIN) == ["03:00:00+02"]
    # and the days around it fire at 02:30 local as usual
    week = list(slots(cron("30 2 * * *", BERLIN), utc(2026, 3, 27), utc(2026, 4, 1)))
    assert (
        shown(week, BERLIN) == ["02:30:00+01", "02:30:00+01", "03:00:00+02"] + ["02:30:00+02"] * 2
    )


def test_a_daily_wall_time_in_the_repeated_hour_fires_once_at_its_first_occurrence() -> None:
    fired = list(slots(cron("30 2 * * *", BERLIN), *FALL))
    assert fired == [utc(2026, 10, 25, 0, 30)]
    assert shown(fired, BERLIN) == ["02:30:00+02"]


def test_half_hourly_across_spring_forward() -> None:
    fired = list(slots(cron("*/30 * * * *", BERLIN), *SPRING))
    # 02:00 and 02:30 do not exist; they and 03:00 are one instant, fired once.
    assert shown(fired, BERLIN) == [
        "23:30:00+01",
        "00:00:00+01",
        "00:30:00+01",
        "01:00:00+01",
        "01:30:00+01",
        "03:00:00+02",
        "03:30:00+02",
        "04:00:00+02",
        "04:30:00+02",
        "05:00:00+02",
        "05:30:00+02",
        "06:00:00+02",
    ]
    assert len(set(fired)) == len(fired)


def test_half_hourly_across_fall_back() -> None:
    fired = list(slots(cron("*/30 * * * *", BERLIN), *FALL))
    # The repeated 02:00 and 02:30 fire in CEST only; the hour then passes in silence.
    assert shown(fired, BERLIN) == [
        "00:30:00+02",
        "01:00:00+02",
        "01:30:00+02",
        "02:00:00+02",
        "02:30:00+02",
        "03:00:00+01",
        "03:30:00+01",
        "04:00:00+01",
        "04:30:00+01",
        "05:00:00+01",
    ]
    assert fired[4] - fired[3] == 1800 and fired[5] - fired[4] == 5400


def test_hourly_across_both_transitions() -> None:
    spring = list(slots(cron("0 * * * *", BERLIN), *SPRING))
    assert shown(spring, BERLIN) == [
        "00:00:00+01",
        "01:00:00+01",
        "03:00:00+02",
        "04:00:00+02",
        "05:00:00+02",
        "06:00:00+02",
    ]
    fall = list(slots(cron("0 * * * *", BERLIN), *FALL))
    assert shown(fall, BERLIN) == [
        "01:00:00+02",
        "02:00:00+02",
        "03:00:00+01",
        "04:00:00+01",
        "05:00:00+01",
    ]
    assert list(slots(cron("@hourly", BERLIN), *FALL)) == fall


def test_every_second_across_the_gap_collapses_it_to_one_instant() -> None:
    start = utc(2026, 3, 29, 0, 59, 58)
    assert next_slots(cron("* * * * * *", BERLIN), start, 4) == [
        start + 1,
        start + 2,  # 02:00:00 wall = 03:00:00 CEST; the gap's other seconds are the same
        start + 3,
        start + 4,
    ]


def test_the_same_expression_in_utc_has_no_gap() -> None:
    fired = list(slots(cron("30 2 * * *"), *SPRING))
    assert fired == [utc(2026, 3, 29, 2, 30)]


def test_aliases_and_the_leading_seconds_field() -> None:
    at = utc(2026, 1, 1, 0, 0, 5)
    assert next_slots(cron("*/10 * * * * *"), at, 3) == [at + 5, at + 15, at + 25]
    assert next_slots(cron("15 0 0 * * *"), utc(2026, 1, 1), 2) == [
        utc(2026, 1, 1, 0, 0, 15),
        utc(2026, 1, 2, 0, 0, 15),
    ]
    assert next_slots(cron("@hourly"), utc(2026, 1, 1), 2) == [
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
    ]
    assert next_slots(cron("@daily", BERLIN), utc(2026, 1, 1), 1) == [utc(2026, 1, 1, 23)]
    assert next_slots(cron("@weekly"), utc(2026, 1, 1), 1) == [utc(2026, 1, 4)]  # a Sunday
    assert next_slots(cron("@monthly"), utc(2026, 1, 1), 1) == [utc(2026, 2, 1)]
    assert next_slots(cron("@yearly"), utc(2026, 1, 1), 1) == [utc(2027, 1, 1)]
    assert cron("@annually") == Cron("@annually")
    assert cron("@MIDNIGHT").expr == "@MIDNIGHT"


def test_cron_specials_come_from_croniter() -> None:
    # the last day of the month, the third Friday, weekdays by name
    assert next_slots(cron("0 0 L * *"), utc(2026, 2, 1), 1) == [utc(2026, 2, 28)]
    assert next_slots(cron("0 12 * * 5#3"), utc(2026, 1, 1), 1) == [utc(2026, 1, 16, 12)]
    monday_to_friday = next_slots(cron("0 9 * * MON-FRI"), utc(2026, 1, 2, 10), 2)
    assert monday_to_friday == [utc(2026, 1, 5, 9), utc(2026, 1, 6, 9)]


def test_every_is_aligned_to_the_epoch_with_its_offset() -> None:
    at = utc(2026, 1, 1)
    assert list(slots(every("2s"), at, at + 6)) == [at + 2, at + 4, at + 6]
    assert list(slots(every("2s", "1s"), at, at + 6)) == [at + 1, at + 3, at + 5]
    assert list(slots(every(2, 1), at + 1, at + 5)) == [at + 3, at + 5]
    assert next_slots(every("15m", "30s"), at + 1, 2) == [at + 30, at + 930]
    assert next_slots(every("500ms"), at, 3) == [at + 0.5, at + 1.0, at + 1.5]


def test_ranges_are_open_below_and_closed_above() -> None:
    at = utc(2026, 1, 1)
    assert list(slots(every(10), at, at)) == []
    assert list(slots(every(10), at + 5, at)) == []
    assert list(slots(cron("* * * * *"), at, at + 60)) == [at + 60]


def test_too_many_slots_are_refused_before_any_is_yielded() -> None:
    start = time.perf_counter()
    with pytest.raises(TriggerError, match="more than 100000 times") as err:
        slots(cron("* * * * *", BERLIN), utc(2026, 1, 1), utc(2027, 1, 1))
    assert err.value.field == "range"
    with pytest.raises(TriggerError) as err:
        slots(every("1s"), utc(2026, 1, 1), utc(2026, 1, 3))
    assert err.value.field == "range"
    assert len(list(slots(every("1s"), 0, MAX_SLOTS))) == MAX_SLOTS
    assert time.perf_counter() - start < 1.0


def test_a_year_of_slots_is_fast() -> None:
    start = time.perf_counter()
    year = list(slots(cron("*/10 * * * *", BERLIN), utc(2026, 1, 1), utc(2027, 1, 1)))
    # The spring gap's six wall times fall on 03:00 CEST (one instant with it); the
    # repeated hour fires once per wall time.
    assert len(year) == 365 * 24 * 6 - 6
    assert time.perf_counter() - start < 0.5
    start = time.perf_counter()
    for _ in range(100):
        next_slots(cron("* * * * * *", BERLIN), utc(2026, 10, 25, 0, 30), 5)
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "minute 61 out of range 0-59"),
        ("0 24 * * *", "hour 24 out of range 0-23"),
        ("0 0 0 * *", "day of month 0 out of range 1-31"),
        ("0 0 * 13 *", "month 13 out of range 1-12"),
        ("0 0 * * 8", "day of week 8 out of range 0-7"),
        ("60 * * * * *", "second 60 out of range 0-59"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * * *", "a year field is not supported"),
        ("@reboot", "unknown alias"),
        ("0 0 31 2 *", "never fires"),
        ("H * * * *", "hashed (H) and random (R) values are not supported"),
        ("R * * * *", "not supported"),
        ("*/0 * * * *", "minute field '*/0' is not valid"),
        ("x * * * *", "minute field 'x' is not valid"),
        ("", "expected 5 fields"),
    ],
)
def test_bad_cron_expressions_say_which_field(expr: str, message: str) -> None:
    with pytest.raises(TriggerError) as err:
        cron(expr)
    assert err.value.field == "cron"
    assert message in str(err.value)
    assert repr(expr) in str(err.value)


def test_unknown_time_zones_suggest_a_close_one() -> None:
    with pytest.raises(TriggerError) as err:
        cron("0 2 * * *", "Europe/Berln")
    assert err.value.field == "timezone"
    assert str(err.value).endswith(
        "unknown time zone 'Europe/Berln' (did you mean 'Europe/Berlin'?)"
    )
    for bad in ("Nowhere", "", "../../etc/passwd", "/etc/localtime"):
        with pytest.raises(TriggerError, match="unknown time zone"):
            cron("0 2 * * *", bad)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("2s", 2),
        ("15m", 900),
        ("1h", 3600),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("1.5h", 5400),
        ("1d", 86400),
        ("2w", 1209600),
        ("90", 90),
        ("0.25", 0.25),
        (90, 90),
        (1.5, 1.5),
    ],
)
def test_durations(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "must be more than zero"),
        ("0s", "must be more than zero"),
        ("-1", "is not a duration"),
        ("abc", "is not a duration"),
        ("15 minutes", "is not a duration"),
        ("1y", "is not a duration"),
        ("367d", "longer than 366 days"),
        (True, "expected a duration"),
        (float("nan"), "must be more than zero"),
    ],
)
def test_bad_durations(text: str | float, message: str) -> None:
    with pytest.raises(TriggerError, match=message) as err:
        parse_duration(text, field="jitter")
    assert err.value.field == "jitter"


def test_zero_only_where_allowed_and_offsets_within_the_interval() -> None:
    assert parse_duration("0s", field="catchup", allow_zero=True) == 0
    with pytest.raises(TriggerError, match="less than the interval") as err:
        every("1m", "1m")
    assert err.value.field == "offset"
    with pytest.raises(TriggerError) as err:
        every("1m", "-1s")
    assert err.value.field == "offset"
    with pytest.raises(TriggerError, match="at least 1ms") as err:
        every(0.0001)
    assert err.value.field == "every"


def test_describe_and_format_duration() -> None:
    assert describe(cron("*/5  * * * *", BERLIN)) == "cron '*/5 * * * *' Europe/Berlin"
    assert describe(every("15m", "30s")) == "every 15m (offset 30s)"
    assert describe(every("1h30m")) == "every 1h30m"
    assert [format_duration(s) for s in (0.5, 2, 86400 + 1, 0, 0.0001)] == [
        "500ms",
        "2s",
        "1d1s",
        "0s",
        "0.0001s",
    ]


def test_json_round_trip_and_bad_stored_forms() -> None:
    for when in (cron("0 2 * * *", BERLIN), every("15m", "30s"), every(0.5)):
        assert from_json(to_json(when)) == when
    assert to_json(every("2s")) == {"every": 2.0, "offset": 0.0}
    assert from_json({"every": 2, "offset": 0}) == Every(2.0, 0.0)
    assert from_json({"cron": "@hourly"}) == Cron("@hourly", "UTC")
    for bad in ({}, {"cron": "x"}, {"every": "2s", "cron": "* * * * *"}, {"every": True}, []):
        with pytest.raises(TriggerError):
            from_json(bad)  # type: ignore[arg-type]


# -- invariants --------------------------------------------------------------------------

WHENS = st.one_of(
    st.sampled_from(
        [
            Cron("*/7 * * * *", BERLIN),
            Cron("30 2 * * *", BERLIN),
            Cron("0 */3 * * *", "America/New_York"),
            Cron("*/20 * * * * *", "Australia/Lord_Howe"),  # a 30-minute DST shift
            Cron("0 0 L * *", "Pacific/Apia"),
        ]
    ),
    st.builds(
        lambda e, o: Every(e, o * e),
        st.sampled_from([1.0, 2.0, 0.5, 90.0, 3600.0]),
        st.sampled_from([0.0, 0.25, 0.5]),
    ),
)
INSTANTS = st.floats(min_value=utc(2025, 1, 1), max_value=utc(2028, 1, 1))


@settings(max_examples=60, deadline=None)
@given(when=WHENS, after=INSTANTS, span=st.floats(min_value=0, max_value=3 * 86400))
def test_slots_are_ascending_unique_within_range_and_agree_with_next_slots(
    when: Cron | Every, after: float, span: float
) -> None:
    until = after + span
    if isinstance(when, Every) and span / when.every > 50_000:
        until = after + 50_000 * when.every
    found = list(slots(when, after, until))
    assert all(after < t <= until for t in found)
    assert all(a < b for a, b in zip(found, found[1:], strict=False))
    assert next_slots(when, after, len(found)) == found
    following = next_slots(when, after, len(found) + 1)[-1:]
    assert not following or following[0] > until
    # resuming from any slot continues the same sequence
    if len(found) > 2:
        middle = found[len(found) // 2]
        assert list(slots(when, middle, until)) == found[len(found) // 2 + 1 :]
