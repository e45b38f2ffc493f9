"""What a scheduler does now for one schedule: pure, time passed in (Temporal's
semantics for overlap, catch-up and jitter).

`plan` looks at the slots after the caller's watermark up to `now`, oldest first:

* a slot whose due time (`slot + jitter_of(...)`) is still ahead is not decided yet:
  planning stops there and `wake` is that due time;
* a slot older than the catch-up window is missed: `now - slot > max(catchup,
  CATCHUP_GRACE) + jitter`. Missed slots are not fired; consecutive ones are reported as
  one `Skip(reason="missed", count=n)` carrying the last of them, so a long downtime of a
  fast schedule costs one decision, not millions. `CATCHUP_GRACE` is the scheduler's own
  lateness (a busy loop, a restart): with `catchup: 0` a slot still fires if it is less
  than a minute late;
* every other slot fires, by the overlap policy, given the runs of this schedule still
  going (`running`) and the slots waiting for them (`buffered`). Planning updates its own
  view as it decides: a `Fire` makes a run running, a `Buffer` fills the buffer.

Overlap policies (`ScheduleSpec.overlap`):

* `skip`: fire if nothing runs, else skip the slot;
* `buffer_one`: fire if nothing runs and nothing waits; else keep one slot waiting, skip
  the rest;
* `buffer_all`: fire if nothing runs and nothing waits; else every slot waits (up to
  `MAX_BUFFERED`, then skipped);
* `cancel_other`: cancel the running runs, then fire. Of several slots due in one plan
  only the last fires (the earlier would be cancelled by it at once): they are skipped;
* `allow`: fire every slot.

When nothing of the schedule runs and a slot waits, the oldest waiting slot fires first
(`release`; `plan` does it too, so a missed release heals). A `Fire` whose slot is one of
`buffered` takes it off the buffer.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from flowtide.errors import TriggerError
from flowtide.triggers.spec import ScheduleSpec
from flowtide.triggers.when import Every, iter_slots

#: A slot this late still fires whatever the catch-up window: the scheduler's own delay
#: (its rounds are at most 2 s apart; a slot later than this means it was not running).
CATCHUP_GRACE = 10.0

#: Most slots waiting for a running one under `buffer_all` (Temporal's limit too).
MAX_BUFFERED = 1000

#: The longest a caller waits before planning a schedule again.
WAKE_MAX = 3600.0

#: Missed slots counted one by one at most; past it the rest are dropped uncounted.
MAX_MISSED_SCAN = 1_000_000


@dataclass(frozen=True, slots=True)
class Fire:
    """Start a run for `slot` at (or after) `due`."""

    slot: float
    due: float


@dataclass(frozen=True, slots=True)
class Skip:
    """`slot` does not fire: `overlap` (a run still going, the buffer full, or superseded
    under `cancel_other`) or `missed` (outside the catch-up window; `count` consecutive
    missed slots ending with `slot`)."""

    slot: float
    reason: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class Buffer:
    """Keep `slot` waiting; it fires when the running one ends (`release`)."""

    slot: float


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel these running runs (`cancel_other`) before the `Fire` that follows."""

    execution_ids: tuple[int, ...]


Decision = Fire | Skip | Buffer | Cancel


@dataclass(frozen=True, slots=True)
class Plan:
    """Decisions to carry out in order; `watermark`: the latest slot decided (store it,
    plan next from it); `wake`: plan again at this instant at the latest."""

    decisions: list[Decision]
    watermark: float
    wake: float


def jitter_of(name: str, slot: float, jitter: float) -> float:
    """How long after `slot` schedule `name` starts it: in [0, jitter), the same on every
    server (a hash of the name and the slot, not a random draw)."""
    if not jitter > 0:
        return 0.0
    digest = hashlib.blake2b(f"{name}\x00{slot!r}".encode(), digest_size=8).digest()
    fraction = (int.from_bytes(digest, "big") >> 11) / float(1 << 53)
    return min(fraction * jitter, math.nextafter(jitter, 0.0))


def _due(spec: ScheduleSpec, slot: float) -> float:
    return slot + jitter_of(spec.name, slot, spec.jitter)


class _View:
    """The schedule's runs and waiting slots as decisions are made."""

    def __init__(self, running: Sequence[int], buffered: Sequence[float]) -> None:
        self.running = tuple(running)
        self.busy = bool(self.running)
        self.buffered = list(buffered)

    def release(self, spec: ScheduleSpec) -> Fire | None:
        if self.busy or not self.buffered:
            return None
        slot = self.buffered.pop(0)
        self.busy = True
        return Fire(slot, _due(spec, slot))

    def decide(self, spec: ScheduleSpec, slots: Sequence[float]) -> list[Decision]:
        out: list[Decision] = []
        policy = spec.overlap
        if policy == "cancel_other":
            if not slots:
                return out
            out.extend(Skip(slot, "overlap") for slot in slots[:-1])
            if self.running:
                out.append(Cancel(self.running))
            self.running, self.busy = (), True
            out.append(Fire(slots[-1], _due(spec, slots[-1])))
            return out
        for slot in slots:
            idle = not self.busy and not self.buffered
            if policy == "allow" or (idle and policy in ("skip", "buffer_one", "buffer_all")):
                out.append(Fire(slot, _due(spec, slot)))
                self.busy = True
            elif policy == "buffer_one" and not self.buffered:
                out.append(Buffer(slot))
                self.buffered.append(slot)
            elif policy == "buffer_all" and len(self.buffered) < MAX_BUFFERED:
                out.append(Buffer(slot))
                self.buffered.append(slot)
            else:
                out.append(Skip(slot, "overlap"))
        return out


def _missed(spec: ScheduleSpec, low: float, cut: float) -> tuple[int, float | None]:
    """How many slots lie in (low, cut) and the last of them (counted up to
    MAX_MISSED_SCAN; an `Every` exactly)."""
    when = spec.when
    if cut <= low:
        return 0, None
    if isinstance(when, Every):
        first = math.floor((low - when.offset) / when.every) + 1
        last = math.ceil((cut - when.offset) / when.every) - 1
        while first * when.every + when.offset <= low:
            first += 1
        while last * when.every + when.offset >= cut:
            last -= 1
        if last < first:
            return 0, None
        return last - first + 1, last * when.every + when.offset
    count, final = 0, None
    for slot in itertools.islice(iter_slots(when, low), MAX_MISSED_SCAN):
        if slot >= cut:
            break
        count, final = count + 1, slot
    return count, final


def plan(
    spec: ScheduleSpec,
    *,
    after: float,
    now: float,
    running: Sequence[int],
    buffered: Sequence[float],
    limit: int = 1000,
) -> Plan:
    """What to do now for `spec`: the slots after `after` (the stored watermark; a new
    schedule's creation time) up to `now`, within `spec.start`/`spec.end`.

    Args:
        running: execution ids of this schedule's runs not yet ended.
        buffered: slots waiting for them, oldest first.
        limit: most slots fired, buffered or skipped for overlap in one call; past it
            `watermark` is the last one and `wake` is `now` (plan again at once).

    A paused schedule decides nothing and moves its watermark to `now`: slots that pass
    while it is paused never fire.
    """
    if spec.paused:
        return Plan([], max(after, now), now + WAKE_MAX)
    view = _View(running, buffered)
    decisions: list[Decision] = []
    low = after
    if spec.start is not None:
        low = max(low, math.nextafter(spec.start, -math.inf))
    high = now if spec.end is None else min(now, spec.end)
    watermark = after

    cut = now - max(spec.catchup, CATCHUP_GRACE) - spec.jitter
    count, last_missed = _missed(spec, low, min(cut, math.nextafter(high, math.inf)))
    if count and last_missed is not None:
        decisions.append(Skip(last_missed, "missed", count))
        low = watermark = max(watermark, last_missed)
        if count >= MAX_MISSED_SCAN and not isinstance(spec.when, Every):
            # Too many to count: the rest of the missed ones are dropped uncounted.
            low = watermark = max(watermark, math.nextafter(cut, -math.inf))

    released = view.release(spec)
    if released is not None:
        decisions.append(released)

    due_slots: list[float] = []
    wake: float | None = None
    beyond: float | None = None
    for slot in iter_slots(spec.when, low):
        if slot > high:
            beyond = slot
            break
        if len(due_slots) >= max(limit, 1):
            wake = now
            break
        due = _due(spec, slot)
        if due > now:
            wake = due
            break
        due_slots.append(slot)
    if due_slots:
        watermark = max(watermark, due_slots[-1])
    decisions.extend(view.decide(spec, due_slots))

    if wake is None:
        # Every slot up to `high` is decided: the next one is `beyond`, unless it is
        # past the schedule's end (or the calendar's).
        if beyond is None or (spec.end is not None and beyond > spec.end):
            wake = math.inf
        else:
            wake = _due(spec, beyond)
    return Plan(decisions, watermark, min(wake, now + WAKE_MAX))


def release(
    spec: ScheduleSpec, *, running: Sequence[int], buffered: Sequence[float]
) -> Fire | None:
    """The oldest waiting slot, to fire now that nothing of the schedule runs (call it
    when a run of the schedule ends); None if something runs or nothing waits."""
    return _View(running, buffered).release(spec)


def backfill(
    spec: ScheduleSpec,
    *,
    start: float,
    end: float,
    running: Sequence[int],
    buffered: Sequence[float],
    limit: int = 10_000,
) -> list[Decision]:
    """Every slot in [start, end] by the overlap policy, as if each were due now (the
    catch-up window, `spec.start`/`spec.end` and pausing do not apply: an operator asked
    for these slots).

    Raises:
        TriggerError(field="range"): `end` before `start`, or more than `limit` slots.
    """
    if end < start:
        raise TriggerError(
            "the backfill range ends before it starts", name=spec.name, field="range"
        )
    found = list(
        itertools.islice(
            itertools.takewhile(
                lambda slot: slot <= end, iter_slots(spec.when, math.nextafter(start, -math.inf))
            ),
            limit + 1,
        )
    )
    if len(found) > limit:
        raise TriggerError(
            f"more than {limit} slots between the two times: backfill a shorter range",
            name=spec.name,
            field="range",
        )
    return _View(running, buffered).decide(spec, found)
