"""The worker's report batches stay under a byte budget (the server caps request bodies),
each report is still sent whole and answered in order, and in a cluster of several
shards a request carries one shard's reports and a shard that is down holds back only
its own."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from flowtide.worker._api import Reply as _Reply
from flowtide.worker._reports import Reporter as _Reporter


class _Server:
    """Takes every report of a request; records each request's body."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def post_json(self, path: str, data: bytes, shard: int | None = None) -> _Reply:
        doc = json.loads(data)
        self.bodies.append(doc)
        results = [{"code": 200} for _ in doc["reports"]]
        return _Reply(200, json.dumps({"results": results}).encode())


def test_batches_are_cut_at_the_byte_budget_and_keep_every_report() -> None:
    async def main() -> _Server:
        server = _Server()
        reporter = _Reporter("w1", 60.0, max_bytes=10_000)
        runner = asyncio.create_task(reporter.run(server))  # type: ignore[arg-type]
        big = [{"type": "call.done", "payload": {"result": "x" * 4_000}}]
        await asyncio.gather(*(reporter.send(n, big) for n in range(1, 8)))
        runner.cancel()
        return server

    server = asyncio.run(main())
    sizes = [len(json.dumps(b)) for b in server.bodies]
    sent = [int(r["execution_id"]) for b in server.bodies for r in b["reports"]]
    assert sorted(sent) == list(range(1, 8))
    assert len(server.bodies) >= 3 and max(sizes) < 10_000 + 500, sizes
    assert all(b["worker_id"] == "w1" for b in server.bodies)


def test_a_report_over_the_budget_goes_alone() -> None:
    async def main() -> _Server:
        server = _Server()
        reporter = _Reporter("w1", 60.0, max_bytes=1_000)
        runner = asyncio.create_task(reporter.run(server))  # type: ignore[arg-type]
        huge = [{"type": "call.done", "payload": {"result": "y" * 5_000}}]
        await asyncio.gather(reporter.send(1, huge), reporter.send(2, huge))
        runner.cancel()
        return server

    server = asyncio.run(main())
    assert [len(b["reports"]) for b in server.bodies] == [1, 1]


def test_a_chunks_report_over_the_budget_goes_in_parts_at_iteration_boundaries() -> None:
    """A chunk of iterations with large results: parts under the budget, in order, each
    iteration whole, `take` on the last part only."""

    def iteration(i: int) -> list[dict[str, Any]]:
        return [
            {"type": "call.done", "payload": {"result": "z" * 3_000, "i": i}},
            {"type": "command.completed", "payload": {"loop_index": i}},
        ]

    async def main() -> _Server:
        server = _Server()
        reporter = _Reporter("w1", 60.0, max_bytes=8_000)
        runner = asyncio.create_task(reporter.run(server))  # type: ignore[arg-type]
        events = [e for i in range(9) for e in iteration(i)]
        await reporter.send(5, events, take=True)
        runner.cancel()
        return server

    server = asyncio.run(main())
    reports = [r for b in server.bodies for r in b["reports"]]
    assert len(reports) >= 4 and all(len(json.dumps(r)) < 8_000 for r in reports)
    indexes = [
        e["payload"]["loop_index"]
        for r in reports
        for e in r["events"]
        if "loop_index" in e["payload"]
    ]
    assert indexes == list(range(9))
    assert all(r["events"][-1]["type"] == "command.completed" for r in reports)
    assert [bool(r.get("take")) for r in reports] == [False] * (len(reports) - 1) + [True]


class _ShardDown(_Server):
    """Shard 1 answers 503 until `up` is set; records (shard, execution ids) per request."""

    def __init__(self) -> None:
        super().__init__()
        self.up = asyncio.Event()
        self.calls: list[tuple[int | None, list[int]]] = []

    async def post_json(self, path: str, data: bytes, shard: int | None = None) -> _Reply:
        ids = [int(r["execution_id"]) for r in json.loads(data)["reports"]]
        self.calls.append((shard, ids))
        if shard == 1 and not self.up.is_set():
            return _Reply(503, b'{"error": {"status": 503, "message": "shard 1: down"}}')
        return await super().post_json(path, data, shard)


def test_reports_go_per_shard_and_a_shard_that_is_down_holds_back_only_its_own() -> None:
    from flowtide.sharding import shard_for

    ids = list(range(1, 41))
    on = {k: [i for i in ids if shard_for(i, 2) == k] for k in (0, 1)}
    assert on[0] and on[1]

    async def main() -> _ShardDown:
        server = _ShardDown()
        reporter = _Reporter("w1", 60.0)
        reporter.shards = 2
        runner = asyncio.create_task(reporter.run(server))  # type: ignore[arg-type]
        report = [{"type": "command.completed"}]
        down = [asyncio.create_task(reporter.send(i, report)) for i in on[1]]
        await asyncio.sleep(0.05)
        # Shard 1 refuses and backs off; shard 0's reports are all taken meanwhile.
        await asyncio.wait_for(asyncio.gather(*(reporter.send(i, report) for i in on[0])), 2.0)
        assert not any(t.done() for t in down)
        server.up.set()
        await asyncio.wait_for(asyncio.gather(*down), 10.0)
        runner.cancel()
        return server

    server = asyncio.run(main())
    for shard, sent in server.calls:
        assert {shard_for(i, 2) for i in sent} == {shard}, "one shard per request"
    taken = sorted(int(r["execution_id"]) for b in server.bodies for r in b["reports"])
    assert taken == ids


class _ShardHangs(_Server):
    """Shard 1 answers nothing until `answer` is set (a database the pool waits for, a
    server that froze); shard 0 answers at once."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()
        self.hanging = 0

    async def post_json(self, path: str, data: bytes, shard: int | None = None) -> _Reply:
        if shard == 1:
            self.hanging += 1
            await self.answer.wait()
        return await super().post_json(path, data, shard)


def test_a_shard_that_answers_slowly_holds_back_only_its_own_reports() -> None:
    """Shard 1's request hangs: shard 0's reports go and are taken meanwhile (they once
    waited behind it, the one request the worker had in flight), and shard 1 never has
    two requests at once."""
    from flowtide.sharding import shard_for

    ids = list(range(1, 41))
    on = {k: [i for i in ids if shard_for(i, 2) == k] for k in (0, 1)}

    async def main() -> _ShardHangs:
        server = _ShardHangs()
        reporter = _Reporter("w1", 60.0)
        reporter.shards = 2
        runner = asyncio.create_task(reporter.run(server))  # type: ignore[arg-type]
        report = [{"type": "command.completed"}]
        slow = [asyncio.create_task(reporter.send(i, report)) for i in on[1][:3]]
        await asyncio.sleep(0.05)
        slow += [asyncio.create_task(reporter.send(i, report)) for i in on[1][3:]]
        await asyncio.wait_for(asyncio.gather(*(reporter.send(i, report) for i in on[0])), 2.0)
        assert not any(t.done() for t in slow)
        assert server.hanging == 1, "one request of the slow shard in flight"
        server.answer.set()
        await asyncio.wait_for(asyncio.gather(*slow), 5.0)
        runner.cancel()
        return server

    server = asyncio.run(main())
    taken = sorted(int(r["execution_id"]) for b in server.bodies for r in b["reports"])
    assert taken == ids
