"""Embedded runtime: cancelling an execution cancels its sub-playbook executions."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from flowtide.playbook.loader import parse_playbook
from flowtide.runtime.local import LocalRuntime
from flowtide.store.sqlite import SQLiteStore
from subplaybooks import PARENT, SLOW_CHILD


def test_cancel_goes_down_to_sub_playbooks(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "flowtide.db")
    store.register_playbook("tests/slow_child", SLOW_CHILD, source_file=None, created=time.time())

    async def main() -> tuple[str, str, float]:
        async with LocalRuntime(store, data_dir=tmp_path / "data") as rt:
            parent = await rt.start(parse_playbook(PARENT, None))
            deadline = time.monotonic() + 60
            children: list[int] = []
            while not children and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                children = [
                    r.execution_id
                    for r in store.list_executions(limit=50)
                    if r.parent_execution_id == parent
                ]
            assert children, "the sub-playbook never started"
            await asyncio.sleep(0.3)  # a few iterations in
            t = time.monotonic()
            await rt.cancel(parent, "enough")
            parent_state = await rt.wait(parent, timeout=30)
            child_state = await rt.wait(children[0], timeout=30)
            return parent_state.status, child_state.status, time.monotonic() - t

    try:
        parent_status, child_status, took = asyncio.run(main())
    finally:
        store.close()
    assert parent_status == "cancelled"
    assert child_status == "cancelled"
    # The child's 200 iterations at 50 ms would take 10 s; it stopped at the cancel.
    assert took < 5.0


SLEEPERS = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: sleepers, path: tests/sleepers}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'n': 4}"}
    next: [sleep]
  - step: sleep
    loop:
      in: "{{ range(start.n) | list }}"
      iterator: item
      spec: {mode: parallel, max_in_flight: 4}
    tool: {kind: python, code: "import time\\ntime.sleep(3600)"}
"""


def test_cancel_kills_sleeping_python_steps_in_child_processes(tmp_path: Path) -> None:
    from flowtide.documents.execution import intact as execution_document
    from flowtide.tools.python_pool import Isolation
    from flowtide.tools.registry import get_tool
    from pyuser import PYTHON_USER

    tool = get_tool("python")
    previous = tool.isolation
    tool.configure(Isolation(mode="process", user=PYTHON_USER))
    store = SQLiteStore(tmp_path / "flowtide.db")

    async def main() -> tuple[dict[str, object], float]:
        async with LocalRuntime(store, data_dir=tmp_path / "data") as rt:
            eid = await rt.start(parse_playbook(SLEEPERS, None))
            deadline = time.monotonic() + 30
            while tool.pool().counts()["busy"] < 4:
                assert time.monotonic() < deadline, "the sleepers never started"
                await asyncio.sleep(0.05)
            t = time.monotonic()
            await rt.cancel(eid, "enough")
            state = await rt.wait(eid, timeout=30)
            while tool.pool().counts()["busy"]:
                assert time.monotonic() - t < 5, "children still busy after the cancel"
                await asyncio.sleep(0.05)
            return execution_document(state), time.monotonic() - t

    try:
        doc, took = asyncio.run(main())
    finally:
        store.close()
        tool.configure(previous)
    assert took < 5.0
    assert doc["status"] == "cancelled"
    assert doc["result"] is None  # README: a cancelled execution has no result
    steps = doc["steps"]
    assert isinstance(steps, dict)
    assert steps["start"]["status"] == "completed" and steps["start"]["result"] == {"n": 4}
    assert steps["sleep"]["status"] == "cancelled"
