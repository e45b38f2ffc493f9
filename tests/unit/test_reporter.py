"""The worker's report batches stay under a byte budget (the server caps request bodies),
and each report is still sent whole and answered in order."""

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

    async def post_json(self, path: str, data: bytes) -> _Reply:
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
