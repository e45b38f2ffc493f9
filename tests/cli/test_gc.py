"""`flowtide gc` (issue 31, retention): executions that ended before the cutoff go with
their events, commands, summaries, deliveries and data folders; open runs, parents of
open children, recent runs and trigger firings stay; the SQLite file shrinks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from flowtide.engine.events import Event
from flowtide.store.sqlite import SQLiteStore
from flowtide.store.triggers import Firing

DAY = 86400.0
PLAYBOOK = "workflow:\n  - step: start\n    tool: {kind: noop}\n"


def _execution(
    store: SQLiteStore,
    execution_id: int,
    status: str,
    at: float,
    *,
    parent: int | None = None,
    firing: Firing | None = None,
) -> None:
    store.create_execution(
        execution_id,
        playbook_path="tests/gc",
        playbook_version=None,
        playbook_file=None,
        playbook_text=PLAYBOOK,
        workload={},
        parent_execution_id=parent,
        created=at,
        firing=firing,
    )
    # Some weight: the file must shrink by what goes.
    store.append(
        [
            Event(
                event_id=execution_id * 100 + i,
                execution_id=execution_id,
                type="step.exit",
                step="start",
                status="completed",
                payload={"result": {"blob": "x" * 2000, "i": i}},
                time=at,
            )
            for i in range(20)
        ]
    )
    store.update_execution(execution_id, status=status, updated=at)


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    now = time.time()
    old, recent = now - 40 * DAY, now - 1 * DAY
    with SQLiteStore(home / "flowtide.db") as store:
        for i in range(30):
            _execution(store, 1000 + i, "completed", old)
        for i in range(5):
            _execution(store, 2000 + i, "failed", old)
        _execution(store, 3000, "running", old)  # open: never collected
        _execution(store, 4000, "completed", old)  # a parent...
        _execution(store, 4001, "running", old, parent=4000)  # ...whose child is open
        _execution(store, 5000, "completed", recent)
        slot = Firing(trigger_id=77, kind="schedule", name="nightly", key="k1", slot=old)
        _execution(store, 6000, "completed", old, firing=slot)
    for eid in (1000, 3000, 5000):
        folder = home / "data" / str(eid)
        folder.mkdir(parents=True)
        (folder / "part-0.parquet").write_bytes(b"p" * 4096)
    return home


def _gc(home: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "flowtide.cli", "gc", "--home", str(home), "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def _ids(home: Path) -> set[int]:
    with SQLiteStore(home / "flowtide.db") as store:
        return {r.execution_id for r in store.list_executions(limit=1000)}


def test_gc_removes_what_ended_long_ago_and_keeps_the_rest(tmp_path: Path) -> None:
    home = _home(tmp_path)
    before = _ids(home)
    dry = _gc(home, "--older-than", "30d", "--dry-run")
    assert dry["executions"] == 36 and dry["rows"]["event"] == 36 * 20
    assert dry["folders"] == 1 and _ids(home) == before  # nothing went
    only_failed = _gc(home, "--older-than", "30d", "--status", "failed")
    assert only_failed["executions"] == 5
    size = (home / "flowtide.db").stat().st_size
    done = _gc(home, "--older-than", "30d")
    assert done["executions"] == 31 and done["folders"] == 1
    left = _ids(home)
    assert left == {3000, 4000, 4001, 5000}, left
    assert not (home / "data" / "1000").exists()
    assert (home / "data" / "3000").exists() and (home / "data" / "5000").exists()
    assert done["store_bytes_after"] < done["store_bytes_before"]
    assert (home / "flowtide.db").stat().st_size < size / 2
    with SQLiteStore(home / "flowtide.db") as store:
        assert store.events(1000) == []
        # The slot that started 6000 is still known: it never fires twice.
        (firing,) = store.firings(77, limit=10)
        assert firing.key == "k1"


def test_gc_refuses_a_status_that_is_not_an_end(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowtide.cli",
            "gc",
            "--home",
            str(tmp_path),
            "--older-than",
            "30d",
            "--status",
            "running",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "only ended runs go" in done.stderr
