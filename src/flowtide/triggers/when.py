"""When a schedule fires: a cron expression read in a time zone, or a fixed interval.

Pure: instants are Unix seconds (floats) passed in; nothing reads a clock.

Cron arithmetic is croniter's (5 fields; our 6-field form has the **seconds first**, as
Quartz and Spring write it; `@hourly`-style aliases). Time zones are flowtide's own rule
on top: the expression is iterated over *wall times* (naive local times) and each wall
time becomes an instant with `zoneinfo`:

* a wall time a DST change skips (spring forward) fires once, at the first instant after
  the gap (Europe/Berlin 2026-03-29 02:30 fires at 03:00 CEST, 01:00 UTC);
* a wall time that happens twice (fall back) fires once, at its first occurrence;
* several wall times that land on one instant fire once.
"""

from __future__ import annotations

import datetime
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flowtide.errors import TriggerError

__all__ = [
    "MAX_SLOTS",
    "Cron",
    "Every",
    "When",
    "cron",
    "describe",
    "every",
    "from_json",
    "next_slots",
    "parse_duration",
    "slots",
    "to_json",
]

#: The most slots one `slots` call yields (a backfill or catchup is bounded by its caller).
MAX_SLOTS: Final = 100_000
#: The longest interval or duration a schedule takes.
MAX_DURATION: Final = 366 * 86400.0
_ALIASES: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELD_NAMES: Final = ("minute", "hour", "day of month", "month", "day of week")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UTC: Final = datetime.UTC


@dataclass(frozen=True, slots=True)
class Cron:
    """A cron expression as given, read in an IANA zone."""

    expr: str
    timezone: str = "UTC"


@dataclass(frozen=True, slots=True)
class Every:
    """Instants `k * every + offset` (k an integer, from the Unix epoch, UTC)."""

    every: float
    offset: float = 0.0


When = Cron | Every


def parse_duration(text: str | float | int, *, field: str = "every") -> float:
    """Seconds of `2s`, `15m`, `1h30m`, `500ms`, `1d`, `1w`, or a number of seconds.

    Raises:
        TriggerError: not a duration, not positive, or longer than a year.
    """
    if isinstance(text, bool):
        raise TriggerError(f"{text!r} is not a duration", field=field)
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        raw = text.strip().lower().replace(" ", "")
        try:
            seconds = float(raw)
        except ValueError:
            parts = _DURATION.findall(raw)
            if not raw or "".join(n + u for n, u in parts) != raw:
                raise TriggerError(
                    f"{text!r} is not a duration (like 30s, 15m, 1h30m, 1d)", field=field
                ) from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not seconds > 0 or seconds != seconds:
        raise TriggerError(f"{text!r}: a duration must be more than 0", field=field)
    if seconds > MAX_DURATION:
        raise TriggerError(f"{text!r} is longer than a year", field=field)
    return seconds


def _zone(name: str) -> ZoneInfo:
    try:
        return _zone_cached(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise TriggerError(
            f"unknown time zone {name!r} (an IANA name like Europe/Berlin or UTC)",
            field="timezone",
        ) from None


@lru_cache(maxsize=256)
def _zone_cached(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name or len(name) > 64 or ".." in name:
        raise ValueError(name)
    return ZoneInfo(name)


def _croniter_form(expr: str) -> tuple[str, bool]:
    """The expression as croniter takes it, and whether it has a seconds field."""
    text = " ".join(expr.split())
    if text.lower() in _ALIASES:
        return _ALIASES[text.lower()], False
    if text.startswith("@"):
        raise TriggerError(f"unknown alias {expr!r} (one of {', '.join(_ALIASES)})", field="cron")
    fields = text.split(" ")
    if len(fields) == 5:
        return text, False
    if len(fields) == 6:
        return text, True
    raise TriggerError(
        f"cron expression {expr!r} has {len(fields)} fields: give 5 (minute hour"
        " day-of-month month day-of-week) or 6 with seconds first",
        field="cron",
    )


def _check_fields(expr: str, text: str, seconds: bool) -> None:
    """A message naming the field at fault, when croniter refuses the expression."""
    from croniter import croniter

    names = ("second", *_FIELD_NAMES) if seconds else _FIELD_NAMES
    fields = text.split(" ")
    for i, name in enumerate(names):
        probe = ["*"] * len(names)
        probe[i] = fields[i]
        try:
            croniter(" ".join(probe), second_at_beginning=seconds)
        except Exception:  # noqa: BLE001 - croniter's errors vary by version
            raise TriggerError(
                f"cron expression {expr!r}: {name} field {fields[i]!r} is not valid",
                field="cron",
            ) from None
    raise TriggerError(f"cron expression {expr!r} is not valid", field="cron")


def cron(expr: str, timezone: str = "UTC") -> Cron:
    """A checked `Cron`. Raises TriggerError naming `cron` or `timezone`."""
    from croniter import croniter

    if not isinstance(expr, str) or not expr.strip():
        raise TriggerError("give a cron expression, like '0 2 * * *'", field="cron")
    if len(expr) > 256:
        raise TriggerError("cron expression longer than 256 characters", field="cron")
    _zone(timezone)
    text, seconds = _croniter_form(expr)
    try:
        croniter(text, second_at_beginning=seconds)
    except Exception:  # noqa: BLE001
        _check_fields(expr, text, seconds)
    return Cron(" ".join(expr.split()), timezone)


def every(duration: str | float, offset: str | float = 0) -> Every:
    """A checked `Every`. Raises TriggerError naming `every` or `offset`."""
    seconds = parse_duration(duration, field="every")
    shift = 0.0
    if offset not in (0, "0", "", None):
        shift = parse_duration(offset, field="offset")
    if shift >= seconds:
        raise TriggerError(
            f"offset {offset!r} must be shorter than the interval {duration!r}", field="offset"
        )
    return Every(seconds, shift)


def _wall_times(when: Cron, start: datetime.datetime) -> Iterator[datetime.datetime]:
    from croniter import croniter

    text, seconds = _croniter_form(when.expr)
    it = croniter(text, start, second_at_beginning=seconds)
    while True:
        yield it.get_next(datetime.datetime)


def _cron_slots(when: Cron, after: float, until: float) -> Iterator[float]:
    zone = _zone(when.timezone)
    # Near a DST change start earlier in wall time: a wall time in a gap fires at the
    # gap's end, after the wall times that follow it.
    shifted = _offset(zone, after) != _offset(zone, after - 10800)
    start = datetime.datetime.fromtimestamp(after - (10800 if shifted else 1), zone)
    start = start.replace(tzinfo=None)
    last = None
    # Wall times increase; their instants do too except across a fold (fall back),
    # where a later wall time can map to an earlier instant: near one, look 3 h on.
    margin = 10800.0 if _offset(zone, until) != _offset(zone, until + 10800) else 0.0
    for wall in _wall_times(when, start):
        at = _gap_safe_instant(wall, zone)
        if at > until:
            if at > until + margin:
                return
            continue
        if at <= after or at == last:
            continue
        if last is not None and at < last:
            continue  # the second pass of a repeated hour maps back: already fired
        last = at
        yield at


def _offset(zone: ZoneInfo, at: float) -> datetime.timedelta | None:
    return datetime.datetime.fromtimestamp(at, zone).utcoffset()


def _gap_safe_instant(wall: datetime.datetime, zone: ZoneInfo) -> float:
    """The instant of `wall` in `zone`: itself when it exists (first occurrence when it
    repeats), the end of the gap when DST skips it."""
    aware = wall.replace(tzinfo=zone, fold=0)
    utc = aware.astimezone(_UTC)
    if utc.astimezone(zone).replace(tzinfo=None) == wall:
        return utc.timestamp()
    # `wall` is in a gap: fold=0 reads it with the offset from before the gap, which
    # lands after the gap's end. The gap ends at the transition, within 3 hours before:
    # find it by bisection (to the second).
    hi = utc.timestamp()
    lo = hi - 3 * 3600
    offset_hi = utc.astimezone(zone).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) / 2
        if datetime.datetime.fromtimestamp(mid, zone).utcoffset() == offset_hi:
            hi = mid
        else:
            lo = mid
    return float(int(hi))


def slots(when: When, after: float, until: float) -> Iterator[float]:
    """Every fire instant t with after < t <= until, ascending, each once.

    Raises:
        TriggerError: the range holds more than `MAX_SLOTS` slots (checked as they come).
    """
    if isinstance(when, Every):
        source: Iterator[float] = _every_slots(when, after, until)
    else:
        source = _cron_slots(when, after, until)
    for count, at in enumerate(source, start=1):
        if count > MAX_SLOTS:
            raise TriggerError(
                f"more than {MAX_SLOTS} slots in the range: narrow it", field="range"
            )
        yield at


def _every_slots(when: Every, after: float, until: float) -> Iterator[float]:
    step, shift = when.every, when.offset
    k = (after - shift) // step + 1
    while True:
        at = k * step + shift
        if at <= after:  # float rounding
            k += 1
            continue
        if at > until:
            return
        yield float(at)
        k += 1


def next_slots(when: When, after: float, n: int) -> list[float]:
    """The next `n` fire instants after `after` (within about a year)."""
    return list(itertools.islice(slots(when, after, after + 400 * 86400), n))


def describe(when: When) -> str:
    """One line for lists: `cron '*/5 * * * *' Europe/Berlin`, `every 15m (offset 30s)`."""
    if isinstance(when, Cron):
        zone = "" if when.timezone == "UTC" else f" {when.timezone}"
        return f"cron '{when.expr}'{zone}"
    text = f"every {_human(when.every)}"
    if when.offset:
        text += f" (offset {_human(when.offset)})"
    return text


def _human(seconds: float) -> str:
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    return f"{seconds:g}s"


def to_json(when: When) -> dict[str, Any]:
    """The stored form: {"cron", "timezone"} or {"every", "offset"}."""
    if isinstance(when, Cron):
        return {"cron": when.expr, "timezone": when.timezone}
    return {"every": when.every, "offset": when.offset}


def from_json(doc: dict[str, Any]) -> When:
    """`to_json`'s inverse (checked again). Raises TriggerError."""
    if "cron" in doc:
        return cron(str(doc["cron"]), str(doc.get("timezone") or "UTC"))
    if "every" in doc:
        return every(doc["every"], doc.get("offset") or 0)
    raise TriggerError("a schedule needs cron or every", field="cron")
