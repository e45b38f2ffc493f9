"""Chunks of loop iterations (issue 34): one command carries several iterations when the
runtime batches (`ExecutionState.batching`), each iteration still reported with its own
`command.completed`, the chunk counting once against `max_in_flight`. The test plays the
worker (tests/unit/driver.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flowtide.engine import events as ev
from flowtide.engine.chunks import MAX_CHUNK, TARGET_MS, chunk_size
from flowtide.engine.events import Command, Event
from flowtide.engine.state import ExecutionState, LoopRecord, fold
from flowtide.playbook.loader import parse_playbook
from flowtide.server.leases import reissue_events

from .driver import NOW, Driver

LOOP = """
workload: {n: %d}
workflow:
  - step: start
    tool: {kind: noop}
    next: [each]
  - step: each
    loop:
      in: "{{ range(n) | list }}"
      iterator: x
      spec: {mode: %s, max_in_flight: %d%s}
    tool: {kind: noop}
    next: [after]
  - step: after
    tool: {kind: noop}
"""


class Batching(ExecutionState):
    batching = True


def driver(n: int, mode: str = "parallel", width: int = 2, extra: str = "") -> Driver:
    d = Driver(LOOP % (n, mode, width, extra))
    d.state = Batching(d.playbook, d.state.execution_id)
    d.start()
    d.answer(d.outstanding[0])  # start
    return d


def count_of(d: Driver, command: Command) -> int:
    issued = next(
        e for e in d.log if e.type == ev.COMMAND_ISSUED and e.command_id == command.command_id
    )
    assert issued.payload is not None
    return int(issued.payload.get("loop_count", 1))


def call(d: Driver, command: Command, ms: float) -> Event:
    """A `call.done` of one iteration that took `ms`."""
    return Event(
        event_id=d.new_id(),
        execution_id=d.state.execution_id,
        type=ev.CALL_DONE,
        step=command.step,
        status="ok",
        payload={"task": "each", "attempt": 1, "duration_ms": ms},
        command_id=command.command_id,
        time=NOW,
    )


def stored(d: Driver, tmp_path: Path) -> Any:
    """A SQLite store holding `d`'s log, its events a millisecond apart in log order."""
    from flowtide.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "flowtide.db")
    store.create_execution(
        d.state.execution_id,
        playbook_path="t/chunks",
        playbook_version=None,
        playbook_file=None,
        playbook_text=d.playbook.text or "",
        workload={},
        created=NOW,
    )
    store.append([replace(e, time=NOW + i / 1000) for i, e in enumerate(d.log)])
    return store


def report(d: Driver, command: Command, index: int, **answer: Any) -> list[Event]:
    """One iteration of a chunk reported (its own `command.completed`)."""
    answer.setdefault("result", {"x": index})
    return d.post(d.completion(replace(command, loop_index=index), answer))


def finish(d: Driver, command: Command, ms: float = 0.2) -> None:
    d.outstanding.remove(command)
    start = command.loop_index or 0
    for index in range(start, start + count_of(d, command)):
        d.post(call(d, command, ms))
        report(d, command, index)


def test_without_batching_or_timings_iterations_go_one_by_one() -> None:
    plain = Driver(LOOP % (10, "parallel", 2, "")).start()
    plain.answer(plain.outstanding[0])
    assert [count_of(plain, c) for c in plain.outstanding] == [1, 1]
    # A batching runtime, but nothing known of the iterations yet: one each too.
    d = driver(10)
    assert [count_of(d, c) for c in d.outstanding] == [1, 1]


def test_fast_iterations_grow_the_chunks_and_results_stay_in_order() -> None:
    d = driver(1000, width=4)
    while d.outstanding:
        finish(d, d.outstanding[0], ms=0.5)
    counts = [count_of(d, c) for c in d.issued if c.step == "each"]
    assert counts[:4] == [1, 1, 1, 1]
    assert max(counts) > 1 and sum(counts) == 1000
    # Never more than the loop's remaining iterations shared over its slots.
    assert max(counts) <= -(-1000 // 4)
    assert d.max_outstanding["each"] <= 4
    rec = d.state.steps["each"]
    assert rec.result["results"] == [{"x": i} for i in range(1000)]
    assert rec.result["stats"] == {"total": 1000, "success": 1000, "failed": 0}
    assert d.state.status == "completed"
    assert d.count(ev.COMMAND_COMPLETED, "each") == d.count(ev.LOOP_ITEM, "each") == 1000
    again = fold(d.playbook, d.state.execution_id, d.log)
    assert again.steps["each"].result == rec.result


def test_slow_iterations_are_never_chunked() -> None:
    # A 3-iteration loop of 10-second steps must not wait behind itself.
    d = driver(8, width=8)
    first = list(d.outstanding)
    for c in first[:2]:
        finish(d, c, ms=10_000.0)
    assert all(count_of(d, c) == 1 for c in d.issued if c.step == "each")


def test_the_size_follows_the_observed_time_per_iteration() -> None:
    playbook = parse_playbook(LOOP % (100_000, "parallel", 16, ""))
    state = Batching(playbook, 1)
    step = playbook.steps["each"]
    loop = LoopRecord("each", 1, "x", list(range(100_000)), 16)
    assert chunk_size(state, step, loop, 0) == 1
    loop.busy_ms, loop.calls = 10.0 * 0.25, 10  # 0.25 ms each
    assert chunk_size(state, step, loop, 0) == int(TARGET_MS / 0.25)
    loop.busy_ms = 10 * 0.0001  # faster than anything: capped
    assert chunk_size(state, step, loop, 0) == MAX_CHUNK
    assert chunk_size(state, step, loop, 100_000 - 40) == 3  # 40 left over 16 slots
    assert chunk_size(state, step, loop, 100_000 - 1) == 1
    assert chunk_size(ExecutionState(playbook, 1), step, loop, 0) == 1  # no batching


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_spec_batch_fixes_the_size(mode: str) -> None:
    d = driver(10, mode=mode, width=2, extra=", batch: 4")
    assert [count_of(d, c) for c in d.outstanding] == ([4, 4] if mode == "parallel" else [4])
    while d.outstanding:
        finish(d, d.outstanding[0])
    assert [count_of(d, c) for c in d.issued if c.step == "each"] == [4, 4, 2]
    assert d.state.steps["each"].result["results"] == [{"x": i} for i in range(10)]
    # `batch: 1` turns chunks off, however fast the iterations are.
    one = driver(5, extra=", batch: 1")
    while one.outstanding:
        finish(one, one.outstanding[0], ms=0.01)
    assert all(count_of(one, c) == 1 for c in one.issued if c.step == "each")


def test_a_chunk_counts_once_and_closes_with_its_last_iteration() -> None:
    d = driver(10, width=1, extra=", batch: 5")
    [chunk] = d.outstanding
    loop = d.state.loops[("each", 1)]
    assert loop.in_flight == {0, 1, 2, 3, 4} and loop.commands == {chunk.command_id}
    report(d, chunk, 3)  # out of order
    report(d, chunk, 0)
    assert chunk.command_id in d.state.commands and loop.in_flight == {1, 2, 4}
    # The same iteration again, and one that is not the chunk's: neither counts.
    assert report(d, chunk, 3)[1:] == []
    assert report(d, chunk, 7)[1:] == []
    assert loop.success == 2
    report(d, chunk, 1)
    report(d, chunk, 2)
    recorded = report(d, chunk, 4)
    assert chunk.command_id not in d.state.commands
    # The chunk closed: the next one is issued in the same pass.
    [issued] = [e for e in recorded if e.type == ev.COMMAND_ISSUED]
    assert issued.payload is not None and issued.payload["loop_index"] == 5
    assert issued.payload["loop_count"] == 5


def test_break_in_a_chunk_drops_the_iterations_it_did_not_run() -> None:
    d = driver(20, width=2, extra=", batch: 5")
    a, b = d.outstanding
    report(d, a, 0)
    report(d, a, 1, action="break")
    loop = d.state.loops[("each", 1)]
    assert loop.broken and a.command_id not in d.state.commands
    assert loop.in_flight == {5, 6, 7, 8, 9}  # b's run on
    for index in range(5, 10):
        report(d, b, index)
    assert d.state.steps["each"].status == "completed"
    assert [r["x"] for r in d.state.steps["each"].result["results"]] == [0, 1, 5, 6, 7, 8, 9]


def test_a_chunk_issued_again_runs_only_what_it_had_not_reported() -> None:
    d = driver(10, width=1, extra=", batch: 5")
    [chunk] = d.outstanding
    report(d, chunk, 0)
    report(d, chunk, 2)
    [again] = reissue_events([(chunk.command_id, NOW)], d.state, d.new_id, NOW)
    assert again.payload is not None and again.payload["loop_count"] == 5
    d.post(again)
    record = d.state.commands[chunk.command_id]
    assert record.attempt == 2 and record.pending == {1, 3, 4}
    for index in (1, 3, 4):
        report(d, replace(chunk, attempt=2), index)
    assert chunk.command_id not in d.state.commands
    assert d.state.loops[("each", 1)].success == 5
    # A fold of the log gives the same pending sets and results.
    again_state = fold(d.playbook, d.state.execution_id, d.log)
    assert again_state.loops[("each", 1)].results == d.state.loops[("each", 1)].results


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{mode: parallel, batch: 0}", "must be an integer >= 1"),
        ("{mode: parallel, batch: many}", "must be an integer >= 1"),
        ("{mode: parallel, batch: 1001}", "at most 1000 iterations per command"),
        ("{mode: spark, batch: 10}", "applies to 'mode: parallel' and 'sequential'"),
    ],
)
def test_a_wrong_batch_is_refused_naming_the_field(spec: str, message: str) -> None:
    from flowtide.errors import PlaybookError

    text = LOOP.replace("spec: {mode: %s, max_in_flight: %d%s}", f"spec: {spec}") % 3
    with pytest.raises(PlaybookError) as caught:
        parse_playbook(text)
    assert message in str(caught.value) and "loop.spec.batch" in str(caught.value)


@pytest.mark.parametrize("index", [True, "1", 1.0, None, -1, 10**20])
def test_a_report_naming_no_iteration_of_its_chunk_counts_for_nothing(index: Any) -> None:
    d = driver(10, width=1, extra=", batch: 5")
    [chunk] = d.outstanding
    event = d.completion(chunk, {"result": "forged"})
    assert event.payload is not None
    event.payload["loop_index"] = index
    assert d.post(event)[1:] == []
    loop = d.state.loops[("each", 1)]
    assert loop.success == 0 and loop.in_flight == {0, 1, 2, 3, 4}
    assert d.state.commands[chunk.command_id].pending == {0, 1, 2, 3, 4}


def test_the_timeline_draws_each_iteration_of_a_chunk(tmp_path: Path) -> None:
    from flowtide.documents.timeline import execution_timeline

    d = driver(12, width=2, extra=", batch: 4")
    while d.outstanding:
        finish(d, d.outstanding[0])
    assert d.state.status == "completed"
    store = stored(d, tmp_path)
    doc = execution_timeline(store, d.playbook, d.state.execution_id, "completed")
    each = next(s for s in doc["steps"] if s["step"] == "each")
    assert each["total_commands"] == 12
    bars = each["commands"]
    assert bars is not None and [b["loop_index"] for b in bars] == list(range(12))
    assert all(b["status"] == "completed" and len(b["tries"]) == 1 for b in bars)
    assert all(b["started"] is not None and b["started"] <= b["ended"] for b in bars)
    # Each iteration starts where the one before it in its chunk ended, or later.
    assert bars[1]["started"] >= bars[0]["ended"]
    store.close()


def test_embedded_chunks_run_in_order_and_each_call_is_timed_from_its_start(
    tmp_path: Path,
) -> None:
    """The embedded runtime runs a chunk's iterations one after another in one thread;
    each `call.done` carries the time its call started (it carried its end), so an
    iteration's call lies between the chunk's start and the iteration's completion."""
    import asyncio

    from flowtide.runtime.local import LocalRuntime
    from flowtide.store.sqlite import SQLiteStore

    text = LOOP.replace("tool: {kind: noop}\n    next: [after]", SLEEPY) % (
        8,
        "parallel",
        2,
        ", batch: 4",
    )

    async def go() -> list[Event]:
        store = SQLiteStore(tmp_path / "flowtide.db")
        async with LocalRuntime(store, data_dir=tmp_path / "data") as rt:
            eid = await rt.start(parse_playbook(text))
            state = await rt.wait(eid, timeout=60)
            assert state.status == "completed", state.error
            assert state.steps["each"].result["results"] == list(range(8))
            return store.events(eid)

    events = [e for e in asyncio.run(go()) if e.step == "each"]
    issued = [e for e in events if e.type == ev.COMMAND_ISSUED]
    assert [(e.payload or {}).get("loop_count") for e in issued] == [4, 4]
    for chunk in issued:
        mine = [e for e in events if e.command_id == chunk.command_id]
        started = next(e.time for e in mine if e.type == ev.COMMAND_STARTED)
        calls = [e for e in mine if e.type == ev.CALL_DONE]
        ends = [e for e in mine if e.type == ev.COMMAND_COMPLETED]
        assert [(e.payload or {}).get("loop_index") for e in ends] == sorted(
            (e.payload or {}).get("loop_index") for e in ends
        )
        for call_event, end in zip(calls, ends, strict=True):
            took = (call_event.payload or {})["duration_ms"] / 1000
            assert took >= 0.02
            assert started - 0.001 <= call_event.time <= end.time - took + 0.005
            started = end.time


SLEEPY = """tool:
      kind: python
      input: {x: "{{ x }}"}
      code: |
        import time
        time.sleep(0.02)
        result = x
    next: [after]"""


def test_the_timeline_shows_the_iteration_a_chunk_runs_and_closes_it_with_the_run(
    tmp_path: Path,
) -> None:
    from flowtide.documents.timeline import execution_timeline

    d = driver(8, width=1, extra=", batch: 4")
    [chunk] = d.outstanding
    started = Event(
        event_id=d.new_id(),
        execution_id=d.state.execution_id,
        type=ev.COMMAND_STARTED,
        step="each",
        status="running",
        payload={"attempt": 1, "loop_instance": 1, "loop_index": 0},
        command_id=chunk.command_id,
        time=NOW,
    )
    d.post(started)
    for index in (0, 1):
        d.post(call(d, chunk, 1.0))
        report(d, chunk, index)
    store = stored(d, tmp_path)
    for status, shown in (("running", "running"), ("cancelled", "cancelled")):
        doc = execution_timeline(store, d.playbook, d.state.execution_id, status)
        bars = next(s for s in doc["steps"] if s["step"] == "each")["commands"]
        assert bars is not None
        assert [(b["loop_index"], b["status"]) for b in bars] == [
            (0, "completed"),
            (1, "completed"),
            (2, shown),
        ]
        assert bars[2]["started"] == bars[1]["ended"]
        assert (bars[2]["ended"] is None) == (status == "running")
    store.close()
