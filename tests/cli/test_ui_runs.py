"""Runs started, resumed and cancelled from `flowtide ui`, next to `flowtide run`
processes on the same store: the UI runs what it starts in its own process, resumes a
run whose process died, and never touches a run another live process holds (its run
lock): it says which process to stop instead. Also the live event stream over SQLite."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from .helpers import Flowtide, local_ui, wait_until

SLOW = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: ui_slow, path: tests/ui/slow}
workload: {n: 30, pause: 0.1}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'numbers': list(range(n))}", input: {n: "{{ n }}"}}
    next: [each]
  - step: each
    loop: {in: "{{ start.numbers }}", iterator: item, spec: {mode: parallel, max_in_flight: 2}}
    tool:
      kind: python
      input: {i: "{{ item }}", pause: "{{ pause }}"}
      code: |
        import time
        time.sleep(pause)
        result = {"i": i}
    next: [end]
  - step: end
"""


def _status(api: httpx.Client, eid: str) -> str:
    return str(api.get(f"/api/executions/{eid}/summary").json()["status"])


def _wait_status(api: httpx.Client, eid: str, status: str, timeout: float = 30) -> None:
    wait_until(lambda: _status(api, eid) == status, timeout=timeout, what=f"{eid} {status}")


def _start_cli_run(
    ft: Flowtide, tmp_path: Path, name: str, **workload: Any
) -> tuple[subprocess.Popen[bytes], str]:
    """A `flowtide run` of SLOW in the background, once its execution is in the store."""
    playbook = tmp_path / "slow.yaml"
    playbook.write_text(SLOW)
    before = {r["execution_id"] for r in ft.executions()}
    with open(tmp_path / f"{name}.out", "wb") as log:  # the child keeps its own copy
        proc = ft.popen("run", playbook, "--payload", json.dumps(workload), stdout=log, stderr=log)
    ids: list[str] = []

    def started() -> bool:
        ids[:] = [r["execution_id"] for r in ft.executions() if r["execution_id"] not in before]
        return bool(ids)

    wait_until(started, timeout=30, what="the run's execution", proc=proc)
    return proc, ids[0]


def test_the_ui_runs_resumes_and_cancels_but_leaves_other_processes_runs_alone(
    ft: Flowtide, tmp_path: Path
) -> None:
    # Runs (killed at the end) for longer than the test takes on a loaded machine.
    busy, busy_id = _start_cli_run(ft, tmp_path, "busy", n=100_000, pause=0.05)
    orphan, orphan_id = _start_cli_run(ft, tmp_path, "orphan", n=1000, pause=0.05)
    # Long enough (15 s) to be still running when killed, and once resumed, on a loaded
    # machine (started last: killed a second after its execution is in the store).
    dead, dead_id = _start_cli_run(ft, tmp_path, "dead", n=60, pause=0.5)
    try:
        # Two runs lose their process (as a closed terminal or a crash would).
        time.sleep(1.0)
        for proc in (dead, orphan):
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        with local_ui(ft, tmp_path / "ui.out") as ui:
            api = ui.api
            # A run another live process holds: named, not touched.
            for action in ("resume", "cancel"):
                r = api.post(f"/api/executions/{busy_id}/{action}", json={})
                assert r.status_code == 409, r.text
                assert f"process {busy.pid}" in r.json()["error"]["message"]
            assert _status(api, busy_id) == "running"
            # The runs whose process died are `interrupted` in every document (no
            # process runs them; nothing is written to say so), the live one running.
            listed = {i["execution_id"]: i for i in api.get("/api/executions").json()["items"]}
            assert listed[busy_id]["status"] == "running"
            for gone in (dead_id, orphan_id):
                assert listed[gone]["status"] == "interrupted"
                assert _status(api, gone) == "interrupted"
                assert api.get(f"/api/executions/{gone}").json()["status"] == "interrupted"
                step = api.get(f"/api/executions/{gone}/steps/each").json()
                assert step["status"] == "interrupted" and step["loop"]["in_flight"] == 0
            stopped = api.get("/api/executions", params={"status": "interrupted"}).json()
            assert {i["execution_id"] for i in stopped["items"]} == {dead_id, orphan_id}
            duration = listed[dead_id]["duration"]
            assert api.get(f"/api/executions/{dead_id}").json()["status"] == "interrupted"
            again_listed = api.get("/api/executions", params={"status": "interrupted"}).json()
            assert {i["execution_id"]: i["duration"] for i in again_listed["items"]}[
                dead_id
            ] == duration  # stopped, not counting

            # A run whose process died: resumed here, it finishes here.
            r = api.post(f"/api/executions/{dead_id}/resume", json={})
            assert r.status_code == 200, r.text
            assert api.get(f"/api/executions/{dead_id}/summary").json()["run_here"] is True
            again = api.post(f"/api/executions/{dead_id}/resume", json={})
            assert again.status_code == 409 and "running here already" in again.text
            # ... and no other process may take it meanwhile.
            cli = ft("resume", dead_id)
            assert cli.returncode == 2 and f"running in process {ui.proc.pid}" in cli.stderr
            _wait_status(api, dead_id, "completed")
            # An ended run's log is closed: cancel refuses it and writes nothing.
            every = {"limit": 10_000}
            log = api.get(f"/api/executions/{dead_id}/events", params=every).json()
            r = api.post(f"/api/executions/{dead_id}/cancel", json={})
            assert r.status_code == 409 and "already completed" in r.text
            assert api.get(f"/api/executions/{dead_id}/events", params=every).json() == log
            loop = api.get(f"/api/executions/{dead_id}/steps/each").json()["loop"]
            assert loop["done"] == 60 and loop["failed"] == 0

            # A run nobody runs any more: closed as cancelled, nothing run.
            r = api.post(f"/api/executions/{orphan_id}/cancel", json={"reason": "abandoned"})
            assert r.status_code == 200, r.text
            assert _status(api, orphan_id) == "cancelled"

            # A run started here: listed with its progress, cancelled here.
            r = api.post("/api/execute", json={"catalog_id": "nope"})
            assert r.status_code == 404
            r = api.post(
                "/api/execute", json={"playbook": SLOW, "payload": {"n": 1000, "pause": 0.05}}
            )
            assert r.status_code == 201, r.text
            mine = r.json()["execution_id"]
            wait_until(
                lambda: (
                    api.get("/api/executions/" + mine + "/summary").json()["progress"][
                        "iterations_done"
                    ]
                    > 2
                ),
                timeout=30,
                what="iterations",
            )
            item = next(
                i for i in api.get("/api/executions").json()["items"] if i["execution_id"] == mine
            )
            assert item["progress"]["iterations"] == 1000
            assert 0 < item["progress"]["iterations_done"] < 1000
            r = api.post(f"/api/executions/{mine}/cancel", json={"reason": "enough"})
            assert r.status_code == 200, r.text
            _wait_status(api, mine, "cancelled")

            # Re-run: the same playbook and workload, as a new execution run here.
            r = api.post(f"/api/executions/{dead_id}/rerun", json={})
            assert r.status_code == 201, r.text
            rerun = r.json()["execution_id"]
            _wait_status(api, rerun, "completed")
            assert api.get(f"/api/executions/{rerun}/steps/each").json()["loop"]["total"] == 60

            # The live stream of an ended run: every event once, then `end`.
            with api.stream("GET", f"/api/executions/{rerun}/events/stream") as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                text = "".join(stream.iter_text())
            ids = re.findall(r"^id: (\d+)$", text, re.M)
            logged = api.get(f"/api/executions/{rerun}/events", params={"limit": 10_000}).json()
            assert sorted(ids) == sorted(e["event_id"] for e in logged)
            assert text.rstrip().endswith('"status":"completed","error":null}')
            tail = api.get(
                f"/api/executions/{rerun}/events/stream", headers={"last-event-id": ids[-3]}
            )
            assert re.findall(r"^id: (\d+)$", tail.text, re.M) == ids[-2:]
        assert busy.poll() is None  # the UI never stopped the other process's run
    finally:
        for proc in (busy, dead, orphan):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
