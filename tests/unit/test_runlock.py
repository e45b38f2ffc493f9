"""Run locks: one holder per execution; another (here a second set of locks, as another
process would open them) is told who holds it; the lock goes with its holder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flowtide.runlock import ExecutionBusy, RunLocks, run_locks_for
from flowtide.store.sqlite import SQLiteStore


def test_one_holder_per_execution(tmp_path: Path) -> None:
    mine, theirs = RunLocks(tmp_path / "runs"), RunLocks(tmp_path / "runs")
    assert theirs.busy(7) is None  # never run: no file yet
    mine.acquire(7)
    mine.acquire(7)  # held already: a no-op
    assert mine.holds(7) and not theirs.holds(7)
    assert mine.busy(7) is None  # not busy elsewhere for its holder
    assert theirs.busy(7) == os.getpid()
    with pytest.raises(ExecutionBusy, match=f"execution 7 is running in process {os.getpid()}"):
        theirs.acquire(7)
    theirs.acquire(8)  # another execution is another lock
    mine.release(7)
    assert theirs.busy(7) is None
    theirs.acquire(7)
    assert theirs.holds(7) and not mine.holds(7)
    theirs.release_all()
    assert not theirs.holds(7) and not theirs.holds(8) and mine.busy(8) is None


def test_locks_live_next_to_the_sqlite_file(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db" / "runs.db")
    try:
        assert run_locks_for(store, tmp_path / "home").folder == tmp_path / "db" / "runs.db.runs"
    finally:
        store.close()
