"""Chunks of loop iterations against a worker that is malicious or buggy: what it reports
about the commands it holds (odd durations, attempts and ctx values; a report split in
parts while the chunk's last iterations are reported) must neither crash the engine's
apply nor the documents built from the log, nor lose iterations that ran."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flowtide.engine import events as ev
from flowtide.engine.chunks import chunk_size
from flowtide.engine.state import fold
from flowtide.worker._reports import Reporter

from .driver import NOW
from .test_chunks import call, driver, finish, report, stored
from .test_reporter import _Server

ODD_NUMBERS = [10**400, float("inf"), float("nan"), -1, True, "5", None, [3], 1e308]
ODD_IDS = ["10**400", "inf", "nan", "-1", "True", "str", "None", "list", "1e308"]


@pytest.mark.parametrize("took", ODD_NUMBERS, ids=ODD_IDS)
def test_a_call_with_an_odd_duration_neither_crashes_the_apply_nor_the_size(took: Any) -> None:
    d = driver(100, width=2)
    first = d.outstanding[0]
    d.post(call(d, first, took))
    d.post(call(d, first, took))  # twice: a sum of two huge ones stays finite too
    loop = d.state.loops[("each", 1)]
    assert math.isfinite(loop.busy_ms) and loop.busy_ms >= 0
    assert loop.calls in (0, 2)
    assert chunk_size(d.state, d.playbook.steps["each"], loop, 2) >= 1
    # The log folds to the same state.
    again = fold(d.playbook, d.state.execution_id, d.log).loops[("each", 1)]
    assert (again.busy_ms, again.calls) == (loop.busy_ms, loop.calls)


@pytest.mark.parametrize("attempt", ["x", float("inf"), float("nan"), [1], None, 2], ids=repr)
def test_a_call_with_an_odd_attempt_does_not_crash_the_apply(attempt: Any) -> None:
    d = driver(10, width=1)
    event = call(d, d.outstanding[0], 1.0)
    assert event.payload is not None
    event.payload["attempt"] = attempt
    d.post(event)
    rec = d.state.steps["each"]
    assert rec.attempts == 1 and rec.retries == (1 if attempt in (2, float("inf")) else 0)


@pytest.mark.parametrize("ctx", [[1, 2], "ab", 5], ids=repr)
def test_a_chunk_report_with_a_ctx_that_is_no_mapping_counts_without_it(ctx: Any) -> None:
    d = driver(10, width=1, extra=", batch: 5")
    [chunk] = d.outstanding
    report(d, chunk, 0, ctx=ctx)
    loop = d.state.loops[("each", 1)]
    assert loop.success == 1 and d.state.ctx == {}
    assert d.state.commands[chunk.command_id].pending == {1, 2, 3, 4}
    for index in range(1, 5):
        report(d, chunk, index)
    assert chunk.command_id not in d.state.commands and chunk.command_id not in loop.commands
    assert loop.success == 5 and loop.next_index == 10  # the next chunk went out


def test_a_chunk_whose_last_iteration_fails_the_loop_leaves_nothing_in_flight() -> None:
    d = driver(10, width=2, extra=", batch: 5")
    a, _b = d.outstanding
    for index in range(4):
        report(d, a, index)
    error = {"kind": "error", "message": "boom"}
    report(d, a, 4, type=ev.COMMAND_FAILED, action="fail", status="error", error=error)
    loop = d.state.loops[("each", 1)]
    assert a.command_id not in d.state.commands and a.command_id not in loop.commands
    assert d.state.status == "failed"
    assert fold(d.playbook, d.state.execution_id, d.log).commands == d.state.commands


def test_the_timeline_survives_odd_durations_and_attempts_in_the_log(tmp_path: Path) -> None:
    from flowtide.documents.timeline import execution_timeline

    d = driver(4, width=1, extra=", batch: 4")
    [chunk] = d.outstanding
    odd = [10**400, -5, "x", True]
    for index, took in enumerate(odd):
        event = call(d, chunk, 1.0)
        assert event.payload is not None
        event.payload["duration_ms"] = took
        event.payload["attempt"] = ["x", "2", None, 10**400][index]
        d.post(event)
        report(d, chunk, index)
    d.outstanding.remove(chunk)
    d.run()  # the step after the loop
    assert d.state.status == "completed"
    store = stored(d, tmp_path)
    doc = execution_timeline(store, d.playbook, d.state.execution_id, "completed")
    store.close()
    json.dumps(doc, allow_nan=False)  # a JSON document (no Infinity)
    each = next(s for s in doc["steps"] if s["step"] == "each")
    bars = each["commands"]
    assert bars is not None and [b["loop_index"] for b in bars] == [0, 1, 2, 3]
    for bar in bars:
        [t] = bar["tries"]
        assert t["started"] <= t["ended"] and t["attempt"] >= 1


def test_a_report_split_in_parts_keeps_its_place_before_the_chunks_next_report() -> None:
    """A chunk's report of the iterations it finished so far, over the budget, goes in
    parts; the chunk's final report (queued meanwhile, its last iteration breaking the
    loop) must not overtake the parts: the server drops what a chunk reports after an
    iteration that broke its loop, so the iterations of a late part would be lost."""

    def iteration(i: int, size: int, action: str = "continue") -> list[dict[str, Any]]:
        return [
            {"type": "call.done", "payload": {"result": "z" * size, "i": i}},
            {"type": "command.completed", "payload": {"loop_index": i, "action": action}},
        ]

    async def main() -> _Server:
        server = _Server()
        reporter = Reporter("w1", 60.0, max_bytes=8_000)
        runner = asyncio.create_task(reporter.run(server))  # type: ignore[arg-type]
        events = [e for i in range(6) for e in iteration(i, 3_000)]
        part = asyncio.create_task(reporter.send(5, events, 9))
        await asyncio.sleep(0)  # the part is queued first (as the worker sends them)
        await reporter.send(5, iteration(6, 10, "break"), 9, take=True)
        await part
        runner.cancel()
        return server

    server = asyncio.run(main())
    indexes = [
        e["payload"]["loop_index"]
        for b in server.bodies
        for r in b["reports"]
        for e in r["events"]
        if "loop_index" in e["payload"]
    ]
    assert indexes == list(range(7))


def test_fast_chunks_with_huge_reported_durations_still_finish() -> None:
    d = driver(50, width=2)
    while d.outstanding:
        finish(d, d.outstanding[0], ms=10**400)  # type: ignore[arg-type]
    assert d.state.status == "completed"
    assert d.state.steps["each"].result["stats"]["success"] == 50


class _Stale(_Server):
    """Answers every report of execution 5 as stale (409), the others taken."""

    async def post_json(self, path: str, data: bytes, shard: int | None = None) -> Any:
        from flowtide.worker._api import Reply

        doc = json.loads(data)
        self.bodies.append(doc)
        results = [{"code": 409 if int(r["execution_id"]) == 5 else 200} for r in doc["reports"]]
        return Reply(200, json.dumps({"results": results}).encode())


def test_a_report_answered_stale_tells_its_sender() -> None:
    stale: list[int] = []

    async def main() -> None:
        reporter = Reporter("w1", 60.0)
        runner = asyncio.create_task(reporter.run(_Stale()))  # type: ignore[arg-type]
        events = [{"type": "command.completed", "payload": {"loop_index": 0}}]
        await reporter.send(5, events, 9, on_stale=lambda: stale.append(5))
        await reporter.send(6, events, 10, on_stale=lambda: stale.append(6))
        runner.cancel()

    asyncio.run(main())
    assert stale == [5]


def test_a_chunk_runs_no_further_iteration_once_the_server_no_longer_takes_it() -> None:
    """A chunk issued again (its lease ran out while its worker still ran it), or whose
    execution ended: its first worker stops at the next iteration instead of running the
    rest of its up to 1000 iterations beside the worker it was issued to again."""
    from flowtide.engine.events import Command
    from flowtide.runtime.command import run_chunk
    from flowtide.runtime.pipeline import StepRunner

    d = driver(10, width=1, extra=", batch: 5")
    [chunk] = d.outstanding
    posted: list[list[Any]] = []
    ids = iter(range(5_000, 6_000))
    parts = d.state.context_parts()
    rest = run_chunk(
        StepRunner(d.playbook),
        Command(chunk.command_id, 7, "each", loop_instance=1, loop_index=0),
        d.state.context(),
        parts,
        [(i, i) for i in range(5)],
        post=posted.append,
        every=0.0,
        next_id=lambda: next(ids),
        worker_id="w",
        iterator="x",
        size=10,
        env={},
        stopped=lambda: len(posted) >= 2,  # answered stale after the second part
    )
    ran = [
        e.payload["loop_index"]
        for part in [*posted, rest]
        for e in part
        if e.type == ev.COMMAND_COMPLETED and e.payload is not None
    ]
    assert ran == [0, 1]


def _state_of(state: Any) -> dict[str, Any]:
    """What a fold must give back: the observable state, the chunks' pending sets and
    each loop's own bookkeeping."""
    from .driver import snapshot

    doc = snapshot(state)
    doc["chunks"] = {
        cid: (r.attempt, r.count, None if r.pending is None else sorted(r.pending))
        for cid, r in state.commands.items()
    }
    doc["bookkeeping"] = {
        key: (sorted(loop.in_flight), sorted(loop.commands), loop.next_index, loop.calls)
        for key, loop in state.loops.items()
    }
    return doc


@pytest.mark.parametrize("seed", range(40))
def test_any_mix_of_reports_folds_to_the_same_state_and_keeps_the_books(seed: int) -> None:
    """Out of order, repeated and forged loop indexes, odd durations and ctx values,
    breaks, fails and chunks issued again, at random: the log folds to the state the
    events built one by one, and each loop's commands and iterations in flight are
    exactly those of its open commands."""
    import random

    from flowtide.server.leases import reissue_events

    rng = random.Random(seed)
    d = driver(rng.randint(2, 40), width=rng.randint(1, 4), extra=rng.choice(["", ", batch: 3"]))
    for _ in range(300):
        if d.state.terminal or not d.state.commands:
            break
        cid = rng.choice(sorted(d.state.commands))
        rec = d.state.commands[cid]
        command = replace(next(c for c in d.issued if c.command_id == cid), attempt=rec.attempt)
        roll = rng.random()
        if roll < 0.05:
            for event in reissue_events([(cid, NOW)], d.state, d.new_id, NOW):
                d.post(event)
        elif roll < 0.3:
            d.post(call(d, command, rng.choice([0.1, 3.0, 10**400, float("nan"), -1])))
        elif rec.loop_index is None:
            d.post(d.completion(command, {}))
        else:
            choices = sorted(rec.pending) if rec.pending else [rec.loop_index]
            forged = [-1, 10**30, True, 3.0, "2", 0, 5]
            index = rng.choice(choices if rng.random() < 0.8 else forged)
            action = rng.choices(["continue", "break", "fail"], [0.9, 0.05, 0.05])[0]
            answer: dict[str, Any] = {"action": action, "result": str(index)}
            if rng.random() < 0.2:
                answer["ctx"] = rng.choice([{"k": seed}, [1], "s"])
            if action == "fail":
                answer.update(type=ev.COMMAND_FAILED, status="error")
            event = d.completion(replace(command, loop_index=0), answer)
            assert event.payload is not None
            event.payload["loop_index"] = index
            d.post(event)
    assert _state_of(fold(d.playbook, d.state.execution_id, d.log)) == _state_of(d.state)
    if d.state.terminal:
        return
    for (step, instance), loop in d.state.loops.items():
        open_ = {
            cid: r
            for cid, r in d.state.commands.items()
            if (r.step, r.loop_instance) == (step, instance) and not r.cursor
        }
        assert loop.commands == set(open_)
        in_flight: set[int] = set()
        for r in open_.values():
            in_flight |= r.pending if r.pending is not None else {r.loop_index or 0}
        assert loop.in_flight == in_flight


def test_a_cursor_loop_is_never_chunked_however_fast_its_iterations() -> None:
    from .driver import Driver
    from .test_chunks import Batching
    from .test_cursor_loop import Queue, cursor_playbook, worker

    queue = Queue(40, 8)
    d = Driver(cursor_playbook(max_in_flight=4, max_rows=8), respond=worker(queue))
    d.state = Batching(d.playbook, d.state.execution_id)
    d.start()
    while d.outstanding and not d.state.terminal:
        command = d.outstanding[0]
        d.post(call(d, command, 0.001))
        d.answer(command)
    assert d.state.status == "completed"
    issued = [e.payload or {} for e in d.log if e.type == ev.COMMAND_ISSUED]
    assert len(issued) > 40 and not any("loop_count" in p for p in issued)
