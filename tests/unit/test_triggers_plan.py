"""What a scheduler does now (flowtide.triggers.plan), driven by a fake clock: overlap
policies with runs longer than the interval, the catch-up window, jitter, bounds,
backfills."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowtide.errors import TriggerError
from flowtide.triggers.plan import (
    CATCHUP_GRACE,
    MAX_BUFFERED,
    WAKE_MAX,
    Buffer,
    Cancel,
    Fire,
    Plan,
    Skip,
    backfill,
    jitter_of,
    plan,
    release,
)
from flowtide.triggers.spec import ScheduleSpec
from flowtide.triggers.when import cron, every, slots

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()


def schedule(**kwargs: Any) -> ScheduleSpec:
    kwargs.setdefault("when", every("10s"))
    return ScheduleSpec(name="s", playbook="p", **kwargs)


@dataclass
class Scheduler:
    """A caller that carries plans out against a fake clock: runs last `duration`."""

    spec: ScheduleSpec
    duration: float
    watermark: float = T0
    running: dict[int, float] = field(default_factory=dict)  # id -> end
    buffered: list[float] = field(default_factory=list)
    started: list[tuple[float, float]] = field(default_factory=list)  # (slot, at)
    skipped: list[tuple[float, str]] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    next_id: int = 1
    limit: int = 1000
    most_running: int = 0

    def start(self, slot: float, now: float) -> None:
        if slot in self.buffered:
            self.buffered.remove(slot)
        self.running[self.next_id] = now + self.duration
        self.next_id += 1
        self.started.append((slot, now))
        self.most_running = max(self.most_running, len(self.running))

    def tick(self, now: float) -> Plan:
        for run, end in sorted(self.running.items()):
            if end <= now:
                del self.running[run]
                fired = release(self.spec, running=list(self.running), buffered=self.buffered)
                if fired is not None:
                    self.start(fired.slot, now)
        result = plan(
            self.spec,
            after=self.watermark,
            now=now,
            running=list(self.running),
            buffered=self.buffered,
            limit=self.limit,
        )
        for d in result.decisions:
            if isinstance(d, Fire):
                assert d.due <= now
                self.start(d.slot, now)
            elif isinstance(d, Skip):
                self.skipped.append((d.slot, d.reason))
            elif isinstance(d, Buffer):
                self.buffered.append(d.slot)
            elif isinstance(d, Cancel):
                for run in d.execution_ids:
                    del self.running[run]
                    self.cancelled.append(run)
        self.watermark = result.watermark
        return result

    def run(self, seconds: float, step: float = 1.0) -> None:
        now = T0
        while now < T0 + seconds:
            now += step
            self.tick(now)


def slots_of(pairs: list[tuple[float, Any]]) -> list[float]:
    return [p[0] - T0 for p in pairs]


# -- overlap policies: every 10 s, each run takes 25 s -----------------------------------


def test_allow_fires_every_slot() -> None:
    s = Scheduler(schedule(overlap="allow"), duration=25)
    s.run(60)
    assert slots_of(s.started) == [10, 20, 30, 40, 50, 60]
    assert s.skipped == []


def test_skip_drops_slots_while_a_run_goes() -> None:
    s = Scheduler(schedule(overlap="skip"), duration=25)
    s.run(75)
    # 10 runs until 35: 20 and 30 skipped; 40 runs until 65; 50, 60 skipped; 70 fires
    assert slots_of(s.started) == [10, 40, 70]
    assert slots_of(s.skipped) == [20, 30, 50, 60]
    assert {reason for _, reason in s.skipped} == {"overlap"}


def test_buffer_one_keeps_one_slot_for_when_the_run_ends() -> None:
    s = Scheduler(schedule(overlap="buffer_one"), duration=25)
    s.run(75)
    # 10 runs 10..35; 20 waits, 30 is skipped; at 35 slot 20 starts (until 60); 40 waits,
    # 50 is skipped; at 60 slot 40 starts (released first), then 60 waits, 70 is skipped.
    assert [(slot - T0, at - T0) for slot, at in s.started] == [(10, 10), (20, 35), (40, 60)]
    assert slots_of(s.skipped) == [30, 50, 70]
    assert slots_of([(b, 0) for b in s.buffered]) == [60]


def test_buffer_all_keeps_every_slot_and_runs_them_in_order() -> None:
    s = Scheduler(schedule(overlap="buffer_all"), duration=25)
    s.run(80)
    assert [(slot - T0, at - T0) for slot, at in s.started] == [(10, 10), (20, 35), (30, 60)]
    assert s.skipped == []
    assert slots_of([(b, 0) for b in s.buffered]) == [40, 50, 60, 70, 80]


def test_buffer_all_is_bounded() -> None:
    spec = schedule(overlap="buffer_all")
    full = [T0 - i for i in range(MAX_BUFFERED, 0, -1)]
    result = plan(spec, after=T0, now=T0 + 10, running=[7], buffered=full)
    assert result.decisions == [Skip(T0 + 10, "overlap")]


def test_cancel_other_cancels_the_running_run_then_fires() -> None:
    s = Scheduler(schedule(overlap="cancel_other"), duration=25)
    s.run(40)
    assert slots_of(s.started) == [10, 20, 30, 40]
    assert s.cancelled == [1, 2, 3]
    result = plan(
        schedule(overlap="cancel_other"), after=T0, now=T0 + 10, running=[4, 5], buffered=[]
    )
    assert result.decisions == [Cancel((4, 5)), Fire(T0 + 10, T0 + 10)]
    idle = plan(schedule(overlap="cancel_other"), after=T0, now=T0 + 10, running=[], buffered=[])
    assert idle.decisions == [Fire(T0 + 10, T0 + 10)]


def test_several_due_slots_in_one_plan_follow_the_policy() -> None:
    after, now = T0, T0 + 30  # slots 10, 20, 30 all due at once (a catch-up)
    expected = {
        "allow": [Fire(T0 + 10, T0 + 10), Fire(T0 + 20, T0 + 20), Fire(T0 + 30, T0 + 30)],
        "skip": [Fire(T0 + 10, T0 + 10), Skip(T0 + 20, "overlap"), Skip(T0 + 30, "overlap")],
        "buffer_one": [Fire(T0 + 10, T0 + 10), Buffer(T0 + 20), Skip(T0 + 30, "overlap")],
        "buffer_all": [Fire(T0 + 10, T0 + 10), Buffer(T0 + 20), Buffer(T0 + 30)],
        "cancel_other": [
            Skip(T0 + 10, "overlap"),
            Skip(T0 + 20, "overlap"),
            Fire(T0 + 30, T0 + 30),
        ],
    }
    for policy, decisions in expected.items():
        result = plan(schedule(overlap=policy), after=after, now=now, running=[], buffered=[])
        assert result.decisions == decisions, policy
        assert result.watermark == T0 + 30
        assert result.wake == T0 + 40


def test_a_waiting_slot_is_released_first_when_nothing_runs() -> None:
    spec = schedule(overlap="buffer_one")
    assert release(spec, running=[3], buffered=[T0 + 5]) is None
    assert release(spec, running=[], buffered=[]) is None
    assert release(spec, running=[], buffered=[T0 + 5, T0 + 6]) == Fire(T0 + 5, T0 + 5)
    # plan heals a missed release: the waiting slot fires, the new one waits
    result = plan(spec, after=T0 + 5, now=T0 + 10, running=[], buffered=[T0 + 5])
    assert result.decisions == [Fire(T0 + 5, T0 + 5), Buffer(T0 + 10)]


# -- catch-up ----------------------------------------------------------------------------


def test_after_downtime_slots_inside_the_window_fire_oldest_first() -> None:
    spec = schedule(when=every("1m"), overlap="allow", catchup=300.0)
    now = T0 + 3600  # down for an hour
    result = plan(spec, after=T0, now=now, running=[], buffered=[])
    missed, *fired = result.decisions
    # slots 60..3240 (54) are more than 5 min late; 3300..3600 (6) fire
    assert missed == Skip(T0 + 3240, "missed", 54)
    assert fired == [Fire(T0 + t, T0 + t) for t in range(3300, 3601, 60)]
    assert result.watermark == now
    assert result.wake == now + 60


def test_catchup_zero_fires_only_what_is_at_most_a_grace_late() -> None:
    spec = schedule(when=every("10s"), overlap="allow", catchup=0.0)
    result = plan(spec, after=T0, now=T0 + 200, running=[], buffered=[])
    fired = [d.slot - T0 for d in result.decisions if isinstance(d, Fire)]
    assert fired == [190, 200]  # now - slot <= 10
    assert CATCHUP_GRACE == 10
    skip = result.decisions[0]
    assert isinstance(skip, Skip) and skip.count == 18 and skip.reason == "missed"


def test_a_long_downtime_of_a_fast_cron_is_one_decision_and_fast() -> None:
    # catchup 5 s is under the grace: slots up to 10 s late still count as on time
    spec = schedule(when=cron("* * * * * *", "Europe/Berlin"), catchup=5.0)
    start = time.perf_counter()
    result = plan(spec, after=T0, now=T0 + 86400, running=[], buffered=[])
    assert time.perf_counter() - start < 1.0
    assert result.decisions[0] == Skip(T0 + 86400 - 11, "missed", 86400 - 11)
    assert result.decisions[1] == Fire(T0 + 86400 - 10, T0 + 86400 - 10)
    assert result.decisions[2:] == [Skip(T0 + 86400 - t, "overlap") for t in range(9, -1, -1)]


def test_the_watermark_continues_where_the_last_plan_stopped() -> None:
    spec = schedule(when=every("1s"), overlap="allow", catchup=86400.0)
    first = plan(spec, after=T0, now=T0 + 2500, running=[], buffered=[], limit=1000)
    assert len(first.decisions) == 1000
    assert first.watermark == T0 + 1000 and first.wake == T0 + 2500
    second = plan(spec, after=first.watermark, now=T0 + 2500, running=[], buffered=[], limit=1000)
    assert second.decisions[0] == Fire(T0 + 1001, T0 + 1001)
    third = plan(spec, after=second.watermark, now=T0 + 2500, running=[], buffered=[], limit=1000)
    assert len(third.decisions) == 500 and third.wake == T0 + 2501
    assert plan(spec, after=third.watermark, now=T0 + 2500, running=[], buffered=[]).decisions == []


def test_nothing_due_sleeps_until_the_next_slot() -> None:
    spec = schedule(when=cron("0 2 * * *", "Europe/Berlin"))
    result = plan(spec, after=T0, now=T0 + 60, running=[], buffered=[])
    assert result.decisions == [] and result.watermark == T0
    assert result.wake == T0 + 3600  # 02:00 CET
    # a slot further away than WAKE_MAX: plan again within WAKE_MAX anyway
    yearly = plan(
        replace(spec, when=cron("@yearly")), after=T0, now=T0 + 60, running=[], buffered=[]
    )
    assert yearly.decisions == [] and yearly.wake == T0 + 60 + WAKE_MAX


# -- jitter ------------------------------------------------------------------------------


def test_jitter_is_deterministic_within_bounds_and_spread() -> None:
    values = [jitter_of("s", T0 + i, 30.0) for i in range(2000)]
    assert all(0 <= v < 30.0 for v in values)
    assert values == [jitter_of("s", T0 + i, 30.0) for i in range(2000)]
    assert values != [jitter_of("other", T0 + i, 30.0) for i in range(2000)]
    assert min(values) < 1 and max(values) > 29  # spread over the range
    assert jitter_of("s", T0, 0.0) == 0.0
    assert all(jitter_of("s", T0 + i, 1e-300) < 1e-300 for i in range(100))


def test_a_jittered_slot_fires_at_its_due_time_not_before() -> None:
    spec = schedule(when=every("1h"), jitter=600.0)
    slot = T0 + 3600
    due = slot + jitter_of("s", slot, 600.0)
    assert due > slot
    early = plan(spec, after=T0, now=slot, running=[], buffered=[])
    assert early.decisions == [] and early.wake == due and early.watermark == T0
    on_time = plan(spec, after=T0, now=due, running=[], buffered=[])
    assert on_time.decisions == [Fire(slot, due)] and on_time.watermark == slot


# -- bounds, pause -----------------------------------------------------------------------


def test_start_and_end_bound_the_slots() -> None:
    spec = schedule(overlap="allow", start=T0 + 30, end=T0 + 60)
    result = plan(spec, after=T0, now=T0 + 100, running=[], buffered=[])
    assert [d.slot - T0 for d in result.decisions if isinstance(d, Fire)] == [30, 40, 50, 60]
    assert result.wake == T0 + 100 + WAKE_MAX  # no slot after the end
    before = plan(spec, after=T0, now=T0 + 5, running=[], buffered=[])
    assert before.decisions == [] and before.wake == T0 + 30


def test_a_paused_schedule_decides_nothing_and_drops_its_slots() -> None:
    spec = schedule(paused=True)
    result = plan(spec, after=T0, now=T0 + 100, running=[], buffered=[T0])
    assert result == Plan([], T0 + 100, T0 + 100 + WAKE_MAX)
    resumed = plan(
        replace(spec, paused=False), after=result.watermark, now=T0 + 105, running=[], buffered=[T0]
    )
    assert resumed.decisions == [Fire(T0, T0)]  # the waiting one; no slot from the pause


# -- backfill ----------------------------------------------------------------------------


def test_backfill_takes_every_slot_of_the_range_by_the_policy() -> None:
    spec = schedule(overlap="allow", catchup=0.0, start=T0 + 1000, paused=True)
    decisions = backfill(spec, start=T0, end=T0 + 100, running=[], buffered=[])
    assert [d.slot - T0 for d in decisions if isinstance(d, Fire)] == list(range(0, 101, 10))
    skip = backfill(replace(spec, overlap="skip"), start=T0, end=T0 + 30, running=[1], buffered=[])
    assert skip == [Skip(T0 + t, "overlap") for t in (0, 10, 20, 30)]
    buffered = backfill(
        replace(spec, overlap="buffer_all"), start=T0, end=T0 + 20, running=[], buffered=[]
    )
    assert buffered == [Fire(T0, T0), Buffer(T0 + 10), Buffer(T0 + 20)]


def test_backfill_refuses_more_than_its_limit() -> None:
    spec = schedule(when=every("1s"), overlap="allow")
    assert (
        len(backfill(spec, start=T0 + 1, end=T0 + 100, running=[], buffered=[], limit=100)) == 100
    )
    with pytest.raises(TriggerError, match="more than 100 slots") as err:
        backfill(spec, start=T0, end=T0 + 100, running=[], buffered=[], limit=100)
    assert err.value.field == "range" and err.value.name == "s"
    with pytest.raises(TriggerError) as err:
        backfill(spec, start=T0 + 10, end=T0, running=[], buffered=[])
    assert err.value.field == "range"
    start = time.perf_counter()
    with pytest.raises(TriggerError):
        backfill(spec, start=T0, end=T0 + 10 * 86400 * 365, running=[], buffered=[])
    assert time.perf_counter() - start < 0.5


# -- invariant: whatever the ticks, each slot is decided once -----------------------------


@settings(max_examples=80, deadline=None)
@given(
    policy=st.sampled_from(["skip", "buffer_one", "buffer_all", "cancel_other", "allow"]),
    gaps=st.lists(st.floats(min_value=0.1, max_value=400.0), min_size=1, max_size=30),
    duration=st.sampled_from([5.0, 25.0, 200.0]),
    catchup=st.sampled_from([0.0, 30.0, 3600.0]),
    jitter=st.sampled_from([0.0, 7.0]),
    limit=st.sampled_from([1, 3, 1000]),
)
def test_every_slot_is_decided_exactly_once_whatever_the_ticks(
    policy: str, gaps: list[float], duration: float, catchup: float, jitter: float, limit: int
) -> None:
    spec = schedule(overlap=policy, catchup=catchup, jitter=jitter)
    s = Scheduler(spec, duration=duration, limit=limit)
    decided: list[float] = []
    missed = 0
    now = T0
    for gap in gaps:
        now += gap
        buffered_before = list(s.buffered)
        result = s.tick(now)
        for d in result.decisions:
            if isinstance(d, Skip) and d.reason == "missed":
                missed += d.count
            elif isinstance(d, Fire) and d.slot in buffered_before:
                continue  # a release: decided when it was buffered
            elif isinstance(d, Fire | Skip | Buffer):
                decided.append(d.slot)
            if isinstance(d, Fire | Skip | Buffer):
                assert d.slot <= now
    assert len(decided) == len(set(decided))
    assert all(T0 < slot <= now for slot in decided)
    expected = [t for t in slots(spec.when, T0, s.watermark)]
    assert len(decided) + missed == len(expected)
    assert set(decided) <= set(expected)
    # nothing due is left behind unless the last plan stopped at its limit
    pending = [
        t for t in slots(spec.when, s.watermark, now) if t + jitter_of("s", t, jitter) <= now
    ]
    assert not pending or limit < 1000
    # a run is never started twice for a slot, buffered slots wait in order, and only
    # `allow` ever runs two at once
    started = [slot for slot, _ in s.started]
    assert len(started) == len(set(started))
    assert s.buffered == sorted(s.buffered)
    assert len(s.buffered) <= (1 if policy == "buffer_one" else MAX_BUFFERED)
    if policy != "allow":
        assert s.most_running <= 1
