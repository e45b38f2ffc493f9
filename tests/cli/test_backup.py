"""`flowtide db backup|restore` (issue 31): a backup taken while a run goes, restored into
a fresh home, resumes that run to the exact result; the key stays apart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from flowtide.store.sqlite import SQLiteStore

LOOP = """\
metadata: {name: backed_up}
workflow:
  - step: start
    loop: {in: "{{ [1, 2, 3, 4, 5, 6, 7, 8] }}", iterator: n, spec: {mode: sequential}}
    tool:
      kind: python
      input: {n: "{{ n }}"}
      code: |
        import time
        time.sleep(0.5)
        result = n * n
    next: [total]
  - step: total
    tool:
      kind: python
      input: {squares: "{{ start.results }}"}
      code: |
        result = sum(squares)
"""


def _flowtide(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_backup_taken_mid_run_resumes_to_the_exact_result(tmp_path: Path) -> None:
    playbook = tmp_path / "loop.yaml"
    playbook.write_text(LOOP)
    home, fresh = tmp_path / "home", tmp_path / "fresh"
    run = subprocess.Popen(
        [sys.executable, "-m", "flowtide.cli", "run", str(playbook), "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.8)  # a few of the eight 0.5 s iterations
        backup = tmp_path / "flowtide-backup.db"
        made = _flowtide("db", "backup", str(backup), "--home", str(home))
        assert made.returncode == 0, made.stderr
        assert "master key is not in it" in made.stdout
        run.wait(timeout=60)
    finally:
        run.kill()
        run.communicate()
    with SQLiteStore(home / "flowtide.db") as store:
        (row,) = store.list_executions()
        assert row.status == "completed"
    with SQLiteStore(backup) as store:
        (copy,) = store.list_executions()
        assert copy.status == "running", "the backup was not taken mid-run"
    again = _flowtide("db", "backup", str(backup), "--home", str(home))
    assert again.returncode != 0 and "--force" in again.stderr
    restored = _flowtide("db", "restore", str(backup), "--home", str(fresh))
    assert restored.returncode == 0, restored.stderr
    resumed = _flowtide("resume", str(row.execution_id), "--home", str(fresh))
    assert resumed.returncode == 0, resumed.stderr
    status = _flowtide("status", str(row.execution_id), "--home", str(fresh), "--json")
    doc = json.loads(status.stdout)
    assert doc["status"] == "completed", doc
    assert doc["steps"]["total"]["result"] == sum(n * n for n in range(1, 9))


def test_restore_refuses_what_is_not_a_store(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    done = _flowtide("db", "restore", str(junk), "--home", str(tmp_path / "h"))
    assert done.returncode != 0 and "is not a flowtide store" in done.stderr
