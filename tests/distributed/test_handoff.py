"""A worker's report takes the execution's next command back with its answer: the
step that takes the report claims it for the worker in the slot the report frees (in the
step's own transaction) instead of publishing it, so a sequential loop runs without a
notification per iteration, and every iteration still runs exactly once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

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
      # One command per iteration: what this test is about is each one handed over.
      spec: {mode: sequential, batch: 1}
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
    # In the log, each command's claim follows its issue and precedes its outcome.
    order = {(e["type"], e["command_id"]): n for n, e in enumerate(events)}
    for e in claimed:
        issued = next(
            n
            for (kind, cid), n in order.items()
            if kind == "command.issued" and cid == e["command_id"]
        )
        assert issued < order[("command.claimed", e["command_id"])]
        assert (
            order[("command.claimed", e["command_id"])]
            < order[("command.completed", e["command_id"])]
        )
    # Every command still has its outbox row, none left unpublished; the claims' rows
    # are the workers' that ran them.
    with psycopg.connect(stack.db) as conn:
        rows = conn.execute(
            "SELECT count(*), count(published) FROM outbox WHERE execution_id = %s", (int(eid),)
        ).fetchone()
    assert rows == (40, 40), rows
    runners = {e["command_id"]: e["worker_id"] for e in completed}
    assert all(runners[e["command_id"]] == e["worker_id"] for e in claimed)
    # Only the first command went through NATS; the others came back with a report.
    assert _published(stack) - before <= 3
