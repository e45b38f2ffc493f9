"""`flowtide events ID --follow` of an embedded run: the events the running process
writes are printed as they come, and the command ends with the run, or when the run's
process dies (interrupted)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .helpers import Flowtide, wait_until

WAITING = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: waiting, path: tests/cli/waiting}
workload: {marker: M, go: G}
workflow:
  - step: start
    tool:
      kind: python
      input: {marker: "{{ marker }}", go: "{{ go }}"}
      code: |
        import os, time
        open(marker, "w").write(str(execution_id))
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        result = "done"
    next: [finish]
  - step: finish
"""


@pytest.mark.parametrize("end", ["completed", "killed"])
def test_events_follow_an_embedded_run_until_it_ends(
    ft: Flowtide, tmp_path: Path, end: str
) -> None:
    playbook = tmp_path / "waiting.yaml"
    playbook.write_text(WAITING, encoding="utf-8")
    marker, go = tmp_path / "execution-id", tmp_path / "go"
    run_out = (tmp_path / "run.out").open("wb")
    run = ft.popen(
        "run", playbook, "--set", f"marker={marker}", "--set", f"go={go}",
        stdout=run_out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    follower: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: marker.exists() and marker.read_text() != "", timeout=60,
                   what="the python step to start", proc=run)  # fmt: skip
        execution_id = marker.read_text()
        follower = subprocess.Popen(
            ft.command("events", execution_id, "--follow"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ft.cwd, env=ft.env,
        )  # fmt: skip
        assert follower.stdout is not None
        lines: list[str] = []
        for line in follower.stdout:
            lines.append(line)
            if "command.issued" in line and run.poll() is None and not go.exists():
                # Printed while the step waits: the run is still going.
                if end == "completed":
                    go.touch()
                else:
                    run.kill()
        assert follower.wait(timeout=60) == 0, follower.stderr.read() if follower.stderr else ""
        run.wait(timeout=60)
    finally:
        for proc in (follower, run):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        run_out.close()
        if follower is not None:
            for pipe in (follower.stdout, follower.stderr):
                if pipe is not None:
                    pipe.close()

    events = ft.events(execution_id)
    assert len(lines) == len(events)  # each event once, in order
    assert [line.split()[1] for line in lines] == [e["type"] for e in events]
    if end == "completed":
        assert go.exists() and run.returncode == 0
        assert events[-1]["type"] == "playbook.completed"
    else:
        assert not go.exists() and run.returncode != 0
        assert "playbook.completed" not in lines[-1]
        assert ft.executions()[0]["status"] == "interrupted"
