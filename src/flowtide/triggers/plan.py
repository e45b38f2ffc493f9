"""What a scheduler does now for one schedule: which slots start a run, which are
skipped or buffered, which running runs are cancelled first. Pure: the caller passes the
time, the schedule's planning watermark, its runs still going and its buffered slots.

Overlap policies have Temporal's meanings, applied slot by slot, oldest first:

| policy | a slot comes while a run of the schedule goes |
|---|---|
| `skip` | recorded as skipped (`overlap`) |
| `buffer_one` | the first such slot is buffered (it starts when the run ends), later ones skipped |
| `buffer_all` | every one is buffered; they start one after another |
| `cancel_other` | the running runs are cancelled, then the slot starts (of several due at once, the latest) |
| `allow` | starts anyway |

Catchup: a slot whose due time is more than the catchup window behind `now` (at least
`ON_TIME`, so a slow round never loses a slot) is skipped as `missed`; of a long
downtime's missed slots the latest `MAX_MISSED_RECORDED` are recorded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from flowtide.errors import TriggerError
from flowtide.triggers.spec import ScheduleSpec
from flowtide.triggers.when import next_slots, slots

__all__ = [
    "ON_TIME",
    "Buffer",
    "Cancel",
    "Decision",
    "Fire",
    "Plan",
    "Skip",
    "backfill",
    "jitter_of",
    "plan",
    "release",
]

#: A slot this late still fires whatever the catchup window (a round may be slow).
ON_TIME: Final = 10.0
#: At most this many missed slots are recorded one by one; beyond, the watermark jumps.
MAX_MISSED_RECORDED: Final = 100


@dataclass(frozen=True, slots=True)
class Fire:
    """Start a run for `slot`, now (its `due` time, jitter included, has come)."""

    slot: float
    due: float


@dataclass(frozen=True, slots=True)
class Skip:
    """`slot` starts nothing: `overlap` (a run still goes) or `missed` (too late)."""

    slot: float
    reason: str


@dataclass(frozen=True, slots=True)
class Buffer:
    """`slot` starts when the schedule's running run ends (`release`)."""

    slot: float


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel these running runs before the `Fire` that follows (cancel_other)."""

    execution_ids: tuple[int, ...]


Decision = Fire | Skip | Buffer | Cancel


@dataclass(frozen=True, slots=True)
class Plan:
    #: In the order to carry them out.
    decisions: list[Decision]
    #: The latest slot decided: the next plan starts after it.
    watermark: float
    #: When to plan again at the latest.
    wake: float


def jitter_of(name: str, slot: float, jitter: float) -> float:
    """The delay of `slot`'s run, in [0, jitter): the same on every server (a hash of the
    schedule's name and the slot), not random."""
    if jitter <= 0:
        return 0.0
    digest = hashlib.blake2b(f"{name}\x00{slot!r}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 * jitter


def _bounded(spec: ScheduleSpec, after: float, until: float) -> tuple[float, float]:
    if spec.start is not None:
        after = max(after, spec.start - 1e-6)
    if spec.end is not None:
        until = min(until, spec.end)
    return after, until


class _Overlap:
    """The overlap policy applied slot by slot, with the state it changes."""

    def __init__(self, spec: ScheduleSpec, running: Sequence[int], buffered: Sequence[float]):
        self.policy = spec.overlap
        self.running = list(running)
        self.fired = 0
        self.buffered = list(buffered)

    def busy(self) -> bool:
        return bool(self.running) or self.fired > 0 or bool(self.buffered)

    def decide(self, slot: float, due: float) -> list[Decision]:
        policy = self.policy
        if policy == "allow" or not self.busy():
            self.fired += 1
            return [Fire(slot, due)]
        if policy == "skip":
            return [Skip(slot, "overlap")]
        if policy == "buffer_one":
            if not self.buffered:
                self.buffered.append(slot)
                return [Buffer(slot)]
            return [Skip(slot, "overlap")]
        if policy == "buffer_all":
            self.buffered.append(slot)
            return [Buffer(slot)]
        # cancel_other
        out: list[Decision] = []
        if self.running:
            out.append(Cancel(tuple(self.running)))
            self.running = []
        self.fired += 1
        out.append(Fire(slot, due))
        return out


def plan(
    spec: ScheduleSpec,
    *,
    after: float,
    now: float,
    running: Sequence[int],
    buffered: Sequence[float],
    limit: int = 1000,
) -> Plan:
    """What to do now with the slots after `after` (see the module docstring)."""
    window = max(spec.catchup, ON_TIME)
    floor = now - window
    decisions: list[Decision] = []
    watermark = after
    lo, hi = _bounded(spec, after, now)
    if lo < floor - 1:
        # Slots older than the window: record the latest few as missed, jump the rest.
        missed = _recent(spec, lo, floor)
        decisions += [Skip(s, "missed") for s in missed[-MAX_MISSED_RECORDED:]]
        lo = watermark = max(lo, floor)
        if missed:
            watermark = max(watermark, missed[-1])
            lo = watermark
    overlap = _Overlap(spec, running, buffered)
    due_now: list[tuple[float, float]] = []
    wake: float | None = None
    count = 0
    for slot in slots(spec.when, lo, hi) if lo < hi else ():
        due = slot + jitter_of(spec.name, slot, spec.jitter)
        if due > now:
            wake = due
            break
        due_now.append((slot, due))
        count += 1
        if count >= limit:
            wake = now
            break
    if spec.overlap == "cancel_other" and len(due_now) > 1:
        # Only the latest of the slots due at once runs: each would cancel the one before.
        decisions += [Skip(s, "overlap") for s, _ in due_now[:-1]]
        due_now = due_now[-1:]
    for slot, due in due_now:
        decisions += overlap.decide(slot, due)
    if due_now:
        watermark = max(watermark, due_now[-1][0])
    for d in decisions:
        if isinstance(d, Skip):
            watermark = max(watermark, d.slot)
    if wake is None:
        wake = _next_due(spec, max(watermark, now))
    return Plan(decisions, watermark, wake)


def _recent(spec: ScheduleSpec, lo: float, floor: float) -> list[float]:
    """The last `MAX_MISSED_RECORDED` slots in (lo, floor], found without walking a long
    downtime slot by slot from its start."""
    span = 3600.0
    while True:
        start = max(lo, floor - span)
        found = list(slots(spec.when, start, floor))
        if len(found) >= MAX_MISSED_RECORDED or start <= lo:
            return found[-MAX_MISSED_RECORDED:]
        span *= 8


def _next_due(spec: ScheduleSpec, after: float) -> float:
    """The due time of the first slot after `after` (now + 60 s when none is near)."""
    upcoming = next_slots(spec.when, after, 1)
    if not upcoming or (spec.end is not None and upcoming[0] > spec.end):
        return after + 60.0
    slot = upcoming[0]
    if spec.start is not None and slot < spec.start:
        later = next_slots(spec.when, spec.start - 1e-6, 1)
        if not later:
            return after + 60.0
        slot = later[0]
    return min(slot + jitter_of(spec.name, slot, spec.jitter), after + 86400.0)


def release(
    spec: ScheduleSpec, *, running: Sequence[int], buffered: Sequence[float]
) -> Fire | None:
    """The oldest buffered slot, to start now that nothing of the schedule runs."""
    if running or not buffered:
        return None
    slot = min(buffered)
    return Fire(slot, slot)


def backfill(
    spec: ScheduleSpec,
    *,
    start: float,
    end: float,
    running: Sequence[int],
    buffered: Sequence[float],
    limit: int = 10_000,
) -> list[Decision]:
    """Every slot in [start, end] by the overlap policy (catchup does not apply).

    Raises:
        TriggerError: more than `limit` slots in the range (field `range`).
    """
    overlap = _Overlap(spec, running, buffered)
    out: list[Decision] = []
    lo, hi = _bounded(spec, start - 1e-6, end)
    found = []
    for slot in slots(spec.when, lo, hi) if lo < hi else ():
        found.append(slot)
        if len(found) > limit:
            raise TriggerError(
                f"more than {limit} slots between the two times: backfill a shorter range",
                name=spec.name,
                field="range",
            )
    for slot in found:
        out += overlap.decide(slot, slot)
    return out
