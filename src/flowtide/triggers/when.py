"""When a schedule fires: a cron expression in a time zone, or a fixed interval.

Pure: no clock, no I/O beyond reading the time zone database. Instants are Unix seconds
(floats, UTC).

`Cron` iterates its expression over naive wall times of its zone (croniter does the cron
arithmetic; it never sees a zone) and turns each wall time into an instant here:

* a wall time that does not exist (the spring-forward gap) fires once, at the first
  instant after the gap (Europe/Berlin 2026-03-29 02:30 -> 03:00 CEST = 01:00 UTC);
* a repeated wall time (fall-back) fires once, at its first occurrence (`fold=0`);
* wall times that land on the same instant (several in one gap) fire it once.

The six-field form has its seconds field FIRST (`*/10 * * * * *`: every ten seconds),
as Quartz and Spring write it (croniter's default puts it last; we ask it for first).

Iteration is by day: croniter finds the matching days (day of month, month, day of week
with every cron special: `L`, `W`, `#`), and a day's fire times are its sorted
time-of-day offsets (the product of the second, minute and hour fields) added to the
day's start. On a day without a zone transition that is arithmetic; only transition days
convert each wall time through zoneinfo.
"""

from __future__ import annotations

import bisect
import datetime as dt
import difflib
import functools
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from flowtide.errors import TriggerError

#: Most instants one `slots` call yields (the caller bounds backfills and catch-ups).
MAX_SLOTS = 100_000

#: Longest interval or duration: a year and a day.
MAX_DURATION = 366 * 86400.0

#: Shortest `every` interval.
MIN_EVERY = 0.001

#: The last instant a schedule fires at (9999-12-31T23:59:59Z); times given by users lie
#: in [0, LATEST] (`spec.parse_time`). Past it a float no longer counts milliseconds
#: exactly, and `datetime` has no year 10000.
LATEST = 253402300799.0
#: Where slots are looked for at the earliest (0001-01-08: days inside the calendar).
EARLIEST = -62134992000.0


@dataclass(frozen=True, slots=True)
class Cron:
    """A cron expression (5 fields, 6 with a leading seconds field, or an `@` alias)
    evaluated in the IANA zone `timezone`. Build with `cron()`, which validates."""

    expr: str
    timezone: str = "UTC"


@dataclass(frozen=True, slots=True)
class Every:
    """The instants `k * every + offset` (k any integer), aligned to the Unix epoch."""

    every: float
    offset: float = 0.0


When = Cron | Every

# -- durations ---------------------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)")
_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)\s*(?:ms|s|m|h|d|w)\s*)+")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def parse_duration(text: str | float, *, field: str = "every", allow_zero: bool = False) -> float:
    """Seconds in `text`: `500ms`, `2s`, `15m`, `1h`, `1h30m`, `1d`, `2w`, or a plain
    number of seconds (`90`, `0.5`, or a number given as such).

    Raises:
        TriggerError(field=field): not a duration, zero (unless `allow_zero`) or negative,
            or longer than 366 days.
    """
    if isinstance(text, bool):
        raise TriggerError(f"expected a duration like '15m', got {text!r}", field=field)
    if isinstance(text, int | float):
        seconds = float(text) if abs(text) < 1e300 else math.inf  # no OverflowError
        shown = repr(text)
    elif isinstance(text, str):
        body = text.strip().lower()
        shown = repr(text)
        if _NUMBER.fullmatch(body):
            seconds = float(body)
        elif _DURATION.fullmatch(body):
            seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(body))
        else:
            raise TriggerError(
                f"{shown} is not a duration: write a number of seconds or "
                "number+unit parts (ms, s, m, h, d, w), e.g. '500ms', '15m', '1h30m'",
                field=field,
            )
    else:
        raise TriggerError(
            f"expected a duration like '15m', got {type(text).__name__}", field=field
        )
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        least = "zero or more" if allow_zero else "more than zero"
        raise TriggerError(f"duration {shown} must be {least}", field=field)
    if seconds > MAX_DURATION:
        raise TriggerError(f"duration {shown} is longer than 366 days", field=field)
    return seconds


def format_duration(seconds: float) -> str:
    """`seconds` the way `parse_duration` reads it, shortest first: `15m`, `1h30m`, `500ms`."""
    if seconds == 0:
        return "0s"
    millis = round(seconds * 1000)
    if abs(millis - seconds * 1000) > 1e-6:
        return f"{seconds:g}s"
    out = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        count, millis = divmod(millis, size)
        if count:
            out.append(f"{count}{unit}")
    if millis:
        out.append(f"{millis}ms")
    return "".join(out)


# -- building ----------------------------------------------------------------------------

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELDS_5 = ("minute", "hour", "day of month", "month", "day of week")
_FIELDS_6 = ("second", *_FIELDS_5)
_RANGES = {
    "second": (0, 59),
    "minute": (0, 59),
    "hour": (0, 23),
    "day of month": (1, 31),
    "month": (1, 12),
    "day of week": (0, 7),
}
# croniter's hashed (`H`) and random (`R`) values: a slot must be the same on every server.
_HASHED = re.compile(r"(?<![a-z])[hr](?![a-z])", re.IGNORECASE)
_MAX_EXPR = 256


def cron(expr: str, timezone: str = "UTC") -> Cron:
    """A validated `Cron` (whitespace in `expr` normalised).

    Raises:
        TriggerError(field="cron"): the expression is not valid or never fires, with the
            field at fault; TriggerError(field="timezone"): not an IANA zone.
    """
    if not isinstance(expr, str):
        raise TriggerError("a cron expression must be a string", field="cron")
    if not isinstance(timezone, str):
        raise TriggerError("a time zone must be a string", field="timezone")
    when = Cron(" ".join(expr.split()), timezone.strip())
    _compiled(when.expr, when.timezone)
    return when


def every(duration: str | float, offset: str | float = 0) -> Every:
    """A validated `Every`.

    Raises:
        TriggerError(field="every"/"offset"): not a duration, `every` under 1 ms, or an
            offset not in [0, every).
    """
    seconds = parse_duration(duration, field="every")
    if seconds < MIN_EVERY:
        raise TriggerError("an interval must be at least 1ms", field="every")
    shift = parse_duration(offset, field="offset", allow_zero=True)
    if shift >= seconds:
        raise TriggerError(
            f"offset {format_duration(shift)} must be less than the interval "
            f"{format_duration(seconds)}",
            field="offset",
        )
    return Every(seconds, shift)


@functools.cache
def _all_zones() -> frozenset[str]:
    return frozenset(available_timezones())


def _zone(name: str) -> ZoneInfo:
    try:
        if not name or name != name.strip():
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        close = difflib.get_close_matches(name, sorted(_all_zones()), n=1, cutoff=0.7)
        hint = f" (did you mean {close[0]!r}?)" if close else " (an IANA name like 'Europe/Berlin')"
        raise TriggerError(f"unknown time zone {name!r}{hint}", field="timezone") from None


@dataclass(frozen=True, slots=True)
class _Compiled:
    zone: ZoneInfo
    #: croniter expression matching the days (at midnight) on which the schedule fires.
    days: str
    #: Sorted seconds since local midnight at which it fires on those days.
    times: tuple[int, ...]


def _bad(expr: str, message: str) -> TriggerError:
    return TriggerError(f"cron expression {expr!r}: {message}", field="cron")


def _fields(expr: str) -> tuple[list[str], tuple[str, ...]]:
    if len(expr) > _MAX_EXPR:
        raise _bad(expr[:40] + "...", f"longer than {_MAX_EXPR} characters")
    if expr.startswith("@"):
        alias = _ALIASES.get(expr.lower())
        if alias is None:
            raise _bad(expr, f"unknown alias (known: {', '.join(_ALIASES)})")
        return alias.split(), _FIELDS_5
    parts = expr.split()
    if len(parts) == 5:
        return parts, _FIELDS_5
    if len(parts) == 6:
        return parts, _FIELDS_6
    got = "a year field is not supported" if len(parts) == 7 else f"got {len(parts)}"
    raise _bad(
        expr,
        "expected 5 fields (minute hour day-of-month month day-of-week), 6 with a leading "
        f"seconds field, or an alias like @hourly; {got}",
    )


def _diagnose(expr: str, parts: list[str], names: tuple[str, ...], error: Exception) -> NoReturn:
    """Raise a TriggerError naming the field croniter refused (it names none)."""
    from croniter import croniter

    for index, (part, name) in enumerate(zip(parts, names, strict=True)):
        probe = ["*"] * len(parts)
        probe[index] = part
        if croniter.is_valid(" ".join(probe), second_at_beginning=True):
            continue
        low, high = _RANGES[name]
        for number in re.findall(r"\d+", part.split("#")[0]):
            if not low <= int(number) <= high:
                raise _bad(expr, f"{name} {number} out of range {low}-{high}")
        raise _bad(expr, f"{name} field {part!r} is not valid ({error})")
    raise _bad(expr, str(error))


@functools.lru_cache(maxsize=1024)
def _compiled(expr: str, timezone: str) -> _Compiled:
    from croniter import CroniterBadDateError, CroniterError, croniter

    zone = _zone(timezone)
    parts, names = _fields(expr)
    for part, name in zip(parts, names, strict=True):
        if _HASHED.search(part):
            raise _bad(
                expr,
                f"{name} field {part!r}: hashed (H) and random (R) values are not "
                "supported (a slot must be the same on every server)",
            )
    text = " ".join(parts)
    try:
        expanded, _ = croniter.expand(text, second_at_beginning=True)
    except (CroniterError, ValueError, TypeError) as exc:
        _diagnose(expr, parts, names, exc)
    minutes, hours = expanded[0], expanded[1]
    seconds = expanded[5] if len(expanded) > 5 else [0]

    def values(found: list[Any], high: int) -> list[int]:
        return list(range(high + 1)) if found == ["*"] else sorted({int(v) for v in found})

    times = tuple(
        h * 3600 + m * 60 + s
        for h, m, s in itertools.product(
            values(hours, 23), values(minutes, 59), values(seconds, 59)
        )
    )
    days = " ".join(["0", "0", *parts[-3:]])
    try:
        croniter(days, dt.datetime(2000, 1, 1), ret_type=dt.datetime).get_next()
    except CroniterBadDateError:
        raise _bad(expr, "never fires (no day matches)") from None
    except (CroniterError, ValueError, TypeError) as exc:
        _diagnose(expr, parts, names, exc)
    return _Compiled(zone, days, times)


# -- instants ----------------------------------------------------------------------------


def _wall_instant(wall: dt.datetime, zone: ZoneInfo) -> float:
    """The instant of naive `wall` in `zone`: its first occurrence if repeated, the end
    of the gap (the transition) if it does not exist."""
    first = wall.replace(tzinfo=zone, fold=0).timestamp()
    if dt.datetime.fromtimestamp(first, zone).replace(tzinfo=None) == wall:
        return first
    # In a gap: fold=0 reads it with the offset before the transition (a later instant),
    # fold=1 with the one after (an earlier instant); the transition lies between.
    second = wall.replace(tzinfo=zone, fold=1).timestamp()
    low, high = math.floor(min(first, second)), math.ceil(max(first, second))
    after = dt.datetime.fromtimestamp(high, zone).utcoffset()
    while high - low > 1:
        mid = (low + high) // 2
        if dt.datetime.fromtimestamp(mid, zone).utcoffset() == after:
            high = mid
        else:
            low = mid
    return float(high)


def _day_instant(day: dt.datetime, zone: ZoneInfo, offset: int) -> float:
    return _wall_instant(day + dt.timedelta(seconds=offset), zone)


@functools.lru_cache(maxsize=8192)
def _simple_day(day: dt.datetime, zone: ZoneInfo) -> float | None:
    """The instant of `day`'s local midnight if the whole day has one UTC offset, else
    None. (Two transitions that cancel within one day would pass: tzdata has none.)"""
    start = day.replace(tzinfo=zone)
    if start.replace(fold=1).utcoffset() != start.utcoffset():
        return None
    base = start.timestamp()
    if dt.datetime.fromtimestamp(base, zone).replace(tzinfo=None) != day:
        return None
    try:
        following = dt.datetime.fromtimestamp(base + 86400, zone).replace(tzinfo=None)
    except (OverflowError, ValueError):  # the calendar's last day
        return None
    if following != day + dt.timedelta(days=1):
        return None
    return base


@functools.lru_cache(maxsize=8192)
def _day_after(days: str, day: dt.datetime) -> dt.datetime | None:
    """The first day after `day` (a local midnight) that the day fields `days` match."""
    from croniter import CroniterBadDateError, croniter

    try:
        found: dt.datetime = croniter(
            days, day + dt.timedelta(seconds=1), ret_type=dt.datetime
        ).get_next()
    except (CroniterBadDateError, OverflowError, ValueError):
        return None
    return found


def _cron_instants(when: Cron, after: float) -> Iterator[float]:
    plan = _compiled(when.expr, when.timezone)
    zone, times = plan.zone, plan.times
    try:
        local = dt.datetime.fromtimestamp(after, zone).replace(tzinfo=None)
    except (OverflowError, ValueError, OSError):
        return
    # Two days back: a zone transition moves wall time by at most a day, and the
    # instants are non-decreasing in wall time, so nothing later is missed.
    first_day = dt.datetime.combine(local.date(), dt.time()) - dt.timedelta(days=2)
    last = after
    day: dt.datetime | None = first_day - dt.timedelta(days=1)
    while True:
        # The matching days and each day's shape are cached: a scheduler plans the same
        # schedules every round, and every plan walks the same few days.
        day = _day_after(plan.days, day)
        if day is None:
            return
        base = _simple_day(day, zone)
        if base is not None:
            start = bisect.bisect_right(times, last - base)
            for offset in times[start:]:
                yield base + offset
            if times[start:]:
                last = base + times[-1]
            continue
        instant = functools.partial(_day_instant, day, zone)
        start = bisect.bisect_right(times, last, key=instant)
        for offset in times[start:]:
            at = instant(offset)
            if at > last:
                last = at
                yield at


def _every_index(when: Every, after: float) -> int:
    """The first k with k * every + offset > after (`after` within EARLIEST..LATEST:
    beyond, a float cannot tell k from k + 1 and the search would not end)."""
    after = min(max(after, EARLIEST), LATEST)
    k = math.floor((after - when.offset) / when.every) + 1
    while k * when.every + when.offset <= after:
        k += 1
    while (k - 1) * when.every + when.offset > after:
        k -= 1
    return k


def iter_slots(when: When, after: float) -> Iterator[float]:
    """Every fire instant after `after`, ascending, without end (lazy: take what you
    need). Raises TriggerError for a `Cron` that is not valid."""
    if isinstance(when, Every):
        if not when.every > 0:
            raise TriggerError("an interval must be more than zero", field="every")
        k = _every_index(when, after)
        while (at := k * when.every + when.offset) <= LATEST:
            yield at
            k += 1
        return
    if after >= LATEST:
        return
    for at in _cron_instants(when, max(after, EARLIEST)):
        if at > LATEST:
            return
        yield at


def slots(when: When, after: float, until: float) -> Iterator[float]:
    """Every fire instant t with `after < t <= until`, ascending, each once.

    Raises:
        TriggerError(field="range"): more than `MAX_SLOTS` instants (checked before the
            first is yielded); TriggerError(field="cron"/"timezone") for a bad `Cron`.
    """
    until = min(until, LATEST)
    if until <= after:
        return iter(())
    if isinstance(when, Every):
        if not when.every > 0:
            raise TriggerError("an interval must be more than zero", field="every")
        first = _every_index(when, after)
        count = _every_index(when, until) - first
        _check_count(count > MAX_SLOTS, when, after, until)
        return (k * when.every + when.offset for k in range(first, first + count))
    found = list(
        itertools.islice(
            itertools.takewhile(lambda t: t <= until, iter_slots(when, after)), MAX_SLOTS + 1
        )
    )
    _check_count(len(found) > MAX_SLOTS, when, after, until)
    return iter(found)


def _check_count(over: bool, when: When, after: float, until: float) -> None:
    if over:
        raise TriggerError(
            f"{describe(when)} fires more than {MAX_SLOTS} times between "
            f"{_iso(after)} and {_iso(until)}: ask for a shorter range",
            field="range",
        )


def _iso(at: float) -> str:
    try:
        return dt.datetime.fromtimestamp(at, dt.UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return repr(at)


def next_slots(when: When, after: float, n: int) -> list[float]:
    """The next `n` fire instants after `after` (fewer if the schedule ends)."""
    return list(itertools.islice(iter_slots(when, after), max(n, 0)))


def describe(when: When) -> str:
    """One line for lists: `cron '*/5 * * * *' Europe/Berlin`, `every 15m (offset 30s)`."""
    if isinstance(when, Cron):
        return f"cron {when.expr!r} {when.timezone}"
    text = f"every {format_duration(when.every)}"
    return text + (f" (offset {format_duration(when.offset)})" if when.offset else "")


def to_json(when: When) -> dict[str, Any]:
    """The stored form: `{"cron": expr, "timezone": tz}` or `{"every": s, "offset": s}`."""
    if isinstance(when, Cron):
        return {"cron": when.expr, "timezone": when.timezone}
    return {"every": when.every, "offset": when.offset}


def from_json(doc: dict[str, Any]) -> When:
    """The `When` stored by `to_json`, validated again.

    Raises:
        TriggerError: not a stored form, or no longer valid (a zone gone from tzdata).
    """
    if not isinstance(doc, dict):
        raise TriggerError("a stored 'when' must be an object", field="when")
    keys = set(doc)
    if keys <= {"cron", "timezone"} and "cron" in keys:
        return cron(doc["cron"], doc.get("timezone", "UTC"))
    if keys <= {"every", "offset"} and "every" in keys:
        return every(_number(doc["every"], "every"), _number(doc.get("offset", 0.0), "offset"))
    raise TriggerError(f"not a stored 'when': keys {sorted(keys)}", field="when")


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TriggerError(f"expected a number of seconds, got {value!r}", field=field)
    return float(value)
