"""Stalled runs swept (issue 31): a running execution with nothing in flight — no command
issued or claimed, nothing to publish, no event for FLOWTIDE_STALLED_AFTER — is re-driven
once and then failed with `error.kind: stalled`, through the engine; a run with work in
flight is left alone, and a failed one is never swept again."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from flowtide.engine import events as ev
from flowtide.kv import connect
from flowtide.loopstate import LoopState
from flowtide.playbook.loader import parse_playbook
from flowtide.server.coordinator import Coordinator
from flowtide.server.stalls import StallWatch
from flowtide.store.postgres import PostgresStore

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

WAITS = """\
workflow:
  - step: start
    tool: {kind: noop}
"""


def test_a_run_with_nothing_in_flight_is_failed_as_stalled_once(pg_database: str) -> None:
    async def main() -> dict[str, Any]:
        kv = await connect("memory://", "flowtide_state", ttl=60)
        store = await asyncio.to_thread(PostgresStore, pg_database, max_size=4)
        try:
            coordinator = Coordinator(store, loopstate=LoopState(kv), local_kv=True)
            playbook = parse_playbook(WAITS, "waits.yaml")
            lost = await coordinator.execute(playbook)
            waiting = await coordinator.execute(playbook)
            # `lost`: its command's message went out and its answer never came back, and
            # the command row says done (what an engine or storage bug leaves behind).
            with psycopg.connect(pg_database, autocommit=True) as conn:
                conn.execute(
                    "UPDATE command SET status = 'completed' WHERE execution_id = %s", (lost,)
                )
                conn.execute("UPDATE outbox SET published = 1 WHERE execution_id IS NOT NULL")
            watch = StallWatch(coordinator, stalled_after=600)
            early = await watch.sweep(time.time())  # not idle long enough yet
            later = time.time() + 1000
            first = await watch.sweep(later)
            again = await watch.sweep(later + 1000)
            rows = {r.execution_id: r for r in store.list_executions(limit=10)}
            events = [(e.type, e.error) for e in store.events(lost)]
            return {
                "lost": lost,
                "waiting": waiting,
                "early": early,
                "first": first,
                "again": again,
                "rows": rows,
                "events": events,
            }
        finally:
            store.close()
            await kv.close()

    got = asyncio.run(main())
    lost, waiting = got["lost"], got["waiting"]
    assert got["early"] == []
    assert got["first"] == [lost]
    assert got["again"] == []  # failed once, never swept again
    assert got["rows"][lost].status == "failed"
    assert got["rows"][waiting].status == "running"  # its command is still issued
    types = [t for t, _ in got["events"]]
    assert types[-3:] == [ev.EXECUTION_STALLED, ev.WORKFLOW_FAILED, ev.PLAYBOOK_FAILED]
    error = got["events"][-1][1]
    assert error["kind"] == "stalled" and "re-drive found nothing" in error["message"]


def test_open_executions_oldest_and_idle_read_at_most_every_refresh(pg_database: str) -> None:
    """The gauges of /metrics: the oldest running execution's creation time, and the runs
    idle past the threshold with nothing in flight (what the stall watch would take);
    read from the database once per refresh period whatever the number of reads."""
    from flowtide.server.metrics import OpenExecutionsReader
    from flowtide.store import pg

    async def main() -> dict[str, Any]:
        kv = await connect("memory://", "flowtide_state", ttl=60)
        store = await asyncio.to_thread(PostgresStore, pg_database, max_size=4)
        try:
            coordinator = Coordinator(store, loopstate=LoopState(kv), local_kv=True)
            playbook = parse_playbook(WAITS, "waits.yaml")
            lost = await coordinator.execute(playbook)
            await coordinator.execute(playbook)  # its command stays issued
            with psycopg.connect(pg_database, autocommit=True) as conn:
                conn.execute(
                    "UPDATE command SET status = 'completed' WHERE execution_id = %s", (lost,)
                )
                created = conn.execute(
                    "SELECT created FROM execution WHERE execution_id = %s", (lost,)
                ).fetchone()
            with store.transaction("test") as conn:
                now = pg.executions.open_executions(conn, time.time() - 600)
                later = pg.executions.open_executions(conn, time.time() + 1000)
                unasked = pg.executions.open_executions(conn, None)
            clock = [0.0]
            reader = OpenExecutionsReader(store, 600, refresh=3.0, clock=lambda: clock[0])
            first = reader.read()
            with psycopg.connect(pg_database, autocommit=True) as conn:
                conn.execute("UPDATE execution SET status = 'completed'")
            cached = reader.read()
            clock[0] = 3.0
            fresh = reader.read()
            return {
                "created": created[0] if created else None,
                "now": now,
                "later": later,
                "unasked": unasked,
                "first": first,
                "cached": cached,
                "fresh": fresh,
            }
        finally:
            store.close()
            await kv.close()

    got = asyncio.run(main())
    assert got["now"] == (got["created"], 0)
    assert got["later"] == (got["created"], 1)  # `lost` only: the other has a command issued
    assert got["unasked"] == (got["created"], 0)
    assert got["first"].oldest_created == got["created"]
    assert got["cached"] == got["first"]  # within the refresh period: no new read
    assert got["fresh"] == (None, 0)
