"""A worker's report takes the execution's next command back with its answer: the
server claims it for the worker in the slot the report frees (one claim transaction, as
a worker's own claim) instead of publishing it, so a sequential loop runs without a
notification per iteration, and every iteration still runs exactly once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from flowtide.dev.nats import SERVER_USER
from flowtide.wire import COMMAND_STREAM

from .stack import Stack

LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: handoff, path: tests/handoff}
workflow:
  - step: work
    loop:
      in: "{{ range(40) | list }}"
      iterator: i
      spec: {mode: sequential}
    tool:
      kind: python
      input: {i: "{{ i }}"}
      code: |
        result = {"index": i}
"""


def _published(stack: Stack) -> int:
    """How many notifications the command stream has taken so far."""
    from flowtide.natsauth import connect_nats

    async def read() -> int:
        nc = await connect_nats(stack.nats, stack.nats_users[SERVER_USER].auth(), name="test")
        try:
            info = await nc.jetstream().stream_info(COMMAND_STREAM)
            return int(info.state.last_seq)
        finally:
            await nc.close()

    return asyncio.run(read())


def _wait(client: Any, eid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        doc: dict[str, Any] = client.get(f"/api/executions/{eid}").json()
        if doc["status"] != "running":
            return doc
        time.sleep(0.1)
    raise AssertionError(f"{eid} did not finish")


def test_a_sequential_loop_runs_on_handed_over_commands(stack: Stack) -> None:
    before = _published(stack)
    with stack.client() as client:
        eid = client.post("/api/execute", json={"playbook": LOOP}).json()["execution_id"]
        doc = _wait(client, eid)
        assert doc["status"] == "completed", doc
        results = doc["steps"]["work"]["result"]["results"]
        assert [r["index"] for r in results] == list(range(40))
        events = client.get(f"/api/executions/{eid}/events").json()
    claimed = [e for e in events if e["type"] == "command.claimed"]
    completed = [e for e in events if e["type"] == "command.completed"]
    assert len(claimed) == len(completed) == 40, "each iteration claimed and run once"
    # Only the first command went through NATS; the others came back with a report.
    assert _published(stack) - before <= 3
