"""`flowtide ui`'s event stream over SQLite: every event once, from a position, through a
backlog denser than its look-back window, then `end`."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from flowtide.engine.events import Event
from flowtide.store.base import ExecutionUpdate
from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.reads import follow_events

EID = 7
#: Snowflake ids: 2,000 events within the same millisecond (a fast loop's burst), far
#: more than one read's batch inside the look-back window.
BASE = 1_000_000 << 22


def _collect(store: SQLiteStore, after: int | None) -> str:
    async def run() -> str:
        out = []
        async for chunk in follow_events(store, EID, after, frozenset()):
            out.append(chunk)
        return "".join(out)

    return asyncio.run(asyncio.wait_for(run(), 30))


def test_a_dense_backlog_streams_whole_from_any_position(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "f.db")
    try:
        store.create_execution(
            EID,
            playbook_path=None,
            playbook_version=None,
            playbook_file=None,
            playbook_text="workflow: [{step: start}]\n",
            workload={},
            parent_execution_id=None,
            parent_command_id=None,
            created=1.0,
        )
        ids = [BASE + i for i in range(2000)]
        events = [Event(i, EID, "loop.item", "each", "ok", {"index": n}) for n, i in enumerate(ids)]
        store.append(events, execution_updates=[ExecutionUpdate(EID, "completed", 2.0)])
        whole = _collect(store, None)
        assert [int(i) for i in re.findall(r"^id: (\d+)$", whole, re.M)] == ids
        assert whole.rstrip().endswith('"status":"completed","error":null}')
        tail = _collect(store, ids[100])
        assert [int(i) for i in re.findall(r"^id: (\d+)$", tail, re.M)] == ids[101:]
    finally:
        store.close()
