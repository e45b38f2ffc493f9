"""The benchmark's trace marks: nothing without FLOWTIDE_TRACE; with it, each process
writes its marks as JSON lines to a file of its own, flushed when it exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import time
from flowtide import trace
trace.start("worker")
trace.mark("done", 7)
trace.marks([8, 9], "report", at=123.5)
print(trace.enabled)
"""


def _run(env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_marks_are_written_per_process_only_when_asked(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLOWTIDE_TRACE"}
    assert _run(env) == "False"
    folder = tmp_path / "trace"
    assert _run({**env, "FLOWTIDE_TRACE": str(folder)}) == "True"
    [path] = folder.glob("worker-*.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r[:2] for r in rows] == [["done", 7], ["report", 8], ["report", 9]]
    assert rows[1][2] == rows[2][2] == 123.5 and rows[0][2] > 1e9
