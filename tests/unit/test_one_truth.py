"""One truth per run (issue 31): a parallel branch still running when another branch
fails its execution ended with it — cancelled, with an end time — in the summary, the
step documents and the timeline, not `running` forever beside a failed execution."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.local import create_local_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

HOST = "127.0.0.1:9"

BRANCHES = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: branches, path: tests/branches}
workflow:
  - step: start
    next:
      spec: {mode: inclusive}
      arcs: [{step: fails}, {step: sleeps}]
  - step: fails
    tool:
      kind: python
      code: |
        import time
        time.sleep(0.3)
        raise RuntimeError("this branch fails the run")
  - step: sleeps
    tool:
      kind: python
      code: |
        import time
        time.sleep(30)
        result = "never"
"""


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    store = SQLiteStore(tmp_path / "flowtide.db")
    app = create_local_app(store, secret="tok", hosts=[HOST], home=tmp_path, prewarm=0)
    with TestClient(app, base_url=f"http://{HOST}") as c:
        c.headers["authorization"] = "Bearer tok"
        r = c.post("/api/catalog/register", json={"content": BRANCHES})
        assert r.status_code in (200, 201), r.text
        yield c
    store.close()


def _ended(client: TestClient, execution_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        doc: dict[str, Any] = client.get(f"/api/executions/{execution_id}").json()
        if doc["status"] not in ("running", "pending", "cancelling"):
            return doc
        time.sleep(0.05)
    raise AssertionError(f"execution {execution_id} did not end")


def test_a_branch_running_when_the_run_failed_is_ended_with_it(client: TestClient) -> None:
    execution_id = client.post("/api/execute", json={"path": "tests/branches"}).json()[
        "execution_id"
    ]
    doc = _ended(client, execution_id)
    assert doc["status"] == "failed"
    summary = client.get(f"/api/executions/{execution_id}/summary").json()
    sleeps = summary["steps"]["sleeps"]
    assert sleeps["status"] == "cancelled", sleeps
    assert sleeps["ended"] is not None and sleeps["duration"] is not None
    assert summary["steps"]["fails"]["status"] == "failed"
    step = client.get(f"/api/executions/{execution_id}/steps/sleeps").json()
    assert step["status"] == "cancelled" and step["ended"] is not None, step
    timeline = client.get(f"/api/executions/{execution_id}/timeline").json()
    lanes = {s["step"]: s for s in timeline["steps"]}
    for bar in lanes["sleeps"]["runs"] + (lanes["sleeps"]["commands"] or []):
        assert bar["ended"] is not None and bar["status"] == "cancelled", bar
