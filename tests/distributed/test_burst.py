"""A burst of executions: the server keeps answering while it works through them.

Steps hold a pooled connection across awaits; before their number was bounded, a burst
could leave every thread waiting in getconn() for a connection held by a step that needed
a thread to finish, and the whole API stalled until the pool's 30 s timeout.
"""

from __future__ import annotations

import concurrent.futures
import time

import httpx

from .stack import Stack
from .test_faults import ONE_STEP


def test_a_burst_of_400_executions_completes_and_the_api_keeps_answering(stack: Stack) -> None:
    def execute(_: int) -> str:
        r = httpx.post(
            f"{stack.url}/api/execute",
            json={"playbook": ONE_STEP},
            headers=stack.headers(),
            timeout=10,
        )
        assert r.status_code == 201, r.text
        return str(r.json()["execution_id"])

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        executions = list(pool.map(execute, range(400)))
    assert len(set(executions)) == 400
    # No request may wait 10 s (the stall lasted until the pool's 30 s timeout).
    deadline = time.monotonic() + 100
    with stack.client(timeout=10) as client:
        for eid in executions:
            while True:
                status = client.get(f"/api/executions/{eid}/status").json()["status"]
                if status != "running":
                    break
                assert time.monotonic() < deadline, f"execution {eid} still running"
                time.sleep(0.05)
            assert status == "completed", eid
