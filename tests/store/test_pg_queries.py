"""flowtide.store.pg: the server's statements on a real PostgreSQL, without a server,
NATS or workers. Each function runs on the connection it is given, in the caller's
transaction, and returns named rows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import sql

from flowtide.engine import events as ev
from flowtide.store import pg
from flowtide.store.base import CommandUpdate
from flowtide.store.pg.commands import ExpiredLease, Holder
from flowtide.store.pg.events import ClaimedEvent, LogPosition
from flowtide.store.postgres import PostgresStore

from .conformance import T0, event, make_execution

EXECUTION = 11


@pytest.fixture
def store(pg_database: str) -> Iterator[PostgresStore]:
    with PostgresStore(pg_database, max_size=4) as store:
        make_execution(store, EXECUTION)
        store.update_execution(EXECUTION, status="running", updated=T0)
        yield store


def issued(command_id: int, execution_id: int = EXECUTION, **fields: Any) -> CommandUpdate:
    fields.setdefault("step", "load")
    fields.setdefault("time", T0)
    fields.setdefault("attempt", 1)
    fields.setdefault("payload", {"issued_event_id": 500 + command_id})
    return CommandUpdate(
        command_id=command_id, execution_id=execution_id, status="issued", **fields
    )


# -- executions -------------------------------------------------------------------------


def test_lock_reads_the_status_under_the_row_lock(store: PostgresStore) -> None:
    with store.transaction("t") as conn:
        assert pg.executions.lock(conn, EXECUTION).result() == "running"
        assert pg.executions.lock(conn, 999).result() is None
        assert pg.executions.exists(conn, EXECUTION)
        assert not pg.executions.exists(conn, 999)
        source = pg.executions.playbook_source(conn, EXECUTION)
        assert source is not None and source.text.startswith("apiVersion")
        assert source.file is None


def test_cancel_requests_and_children(store: PostgresStore) -> None:
    make_execution(store, 12, parent_execution_id=EXECUTION)
    store.update_execution(12, status="running", updated=T0)
    make_execution(store, 13, parent_execution_id=EXECUTION)
    store.update_execution(13, status="completed", updated=T0)
    with store.transaction("t") as conn:
        assert pg.executions.read_cancel_state(conn, EXECUTION) == ("running", None)
        assert pg.executions.open_children(conn, EXECUTION, {"completed", "failed"}) == [12]
        assert pg.executions.parent_of(conn, 12) == EXECUTION
        assert pg.executions.parent_of(conn, EXECUTION) is None
        pg.executions.request_stop(conn, EXECUTION, 5.0)
        pg.executions.request_stop(conn, EXECUTION, 6.0)  # keeps the first request's time
        state = pg.executions.share_lock(conn, EXECUTION)
        assert state is not None and state.cancel_requested == 5.0
        pg.executions.request_cancel(conn, EXECUTION, 7.0)
        assert pg.executions.read_cancel_state(conn, EXECUTION) == ("running", 7.0)
        assert pg.executions.count_by_status(conn) == {"running": 2, "completed": 1}
        outcome = pg.executions.outcome(conn, 13)
        assert outcome is not None and outcome.status == "completed"


# -- events ---------------------------------------------------------------------------


def test_since_reads_the_log_in_insertion_order_with_seqs(store: PostgresStore) -> None:
    # Event ids are not in arrival order (workers make their own): seq is.
    store.append([event(EXECUTION, 30), event(EXECUTION, 10), event(EXECUTION, 20)])
    with store.transaction("t") as conn:
        logged = pg.events.since(conn, EXECUTION, 0, store.sealer).result()
        assert [e.event.event_id for e in logged] == [30, 10, 20]
        seqs = [e.seq for e in logged]
        assert seqs == sorted(seqs)
        later = pg.events.since(conn, EXECUTION, seqs[0], store.sealer).result()
        assert [e.event.event_id for e in later] == [10, 20]
        assert pg.events.last_seq(conn, EXECUTION).result() == seqs[-1]
        assert pg.events.last_seq(conn, 999).result() == 0
        assert pg.events.known_ids(conn, EXECUTION, [10, 11, 30]).result() == {10, 30}


def test_pending_statements_share_one_pipeline(store: PostgresStore) -> None:
    store.append([event(EXECUTION, 1), event(EXECUTION, 2)])
    with store.transaction("t") as conn:
        with conn.pipeline():
            lock = pg.executions.lock(conn, EXECUTION)
            since = pg.events.since(conn, EXECUTION, 0, store.sealer)
            known = pg.events.known_ids(conn, EXECUTION, [2, 3])
            assert lock.result() == "running"
            assert len(since.result()) == 2
            assert known.result() == {2}


def test_the_stream_reads_settled_events_in_commit_order(store: PostgresStore) -> None:
    store.append([event(EXECUTION, 5), event(EXECUTION, 6)])
    store.append([event(EXECUTION, 4)])
    with store.transaction("t") as conn:
        pg.events.read_snapshot(conn)
        rows = pg.events.settled_after(conn, EXECUTION, pg.events.START, 10, store.sealer)
        assert [e.event_id for e, _ in rows] == [5, 6, 4]
        assert all(isinstance(p, LogPosition) for _, p in rows)
        first = pg.events.position(conn, EXECUTION, 5)
        assert first == rows[0][1]
        assert pg.events.position(conn, EXECUTION, 999) is None
        after = pg.events.settled_after(conn, EXECUTION, first, 1, store.sealer)
        assert [e.event_id for e, _ in after] == [6]
        assert pg.events.any_after(conn, EXECUTION, rows[1][1])
        assert not pg.events.any_after(conn, EXECUTION, rows[2][1])


def test_ctx_writes_are_the_events_that_may_set_variables(store: PostgresStore) -> None:
    store.append(
        [
            event(EXECUTION, 1, ev.CTX_UPDATED, payload={"source": "api", "set": {"a": 1}}),
            event(EXECUTION, 2, ev.STEP_EXIT, step="s", payload={"result": 1}),
            event(EXECUTION, 3, ev.STEP_EXIT, step="s", payload={"set": {"b": 2}}),
            event(EXECUTION, 4, ev.COMMAND_COMPLETED, payload={"ctx": {"c": 3}}),
            event(EXECUTION, 5, ev.CTX_UPDATED, payload={"unset": ["a"]}),
        ]
    )
    with store.transaction("t") as conn:
        writes = pg.events.ctx_writes(conn, EXECUTION, store.sealer)
    assert [w.event_id for w in writes] == [1, 3, 4, 5]
    assert writes[1].step == "s" and writes[1].payload == {"set": {"b": 2}}


def test_claimed_events_and_issue_times(store: PostgresStore) -> None:
    store.append([event(EXECUTION, 500, ev.COMMAND_ISSUED, time=42.0)])
    claimed = ClaimedEvent(EXECUTION, 501, "load", 2, 500, 1, "w1", 43.0)
    with store.transaction("t") as conn:
        pg.events.insert_claimed(conn, [claimed])
        assert pg.events.issue_times(conn, [EXECUTION], [500]).result() == {500: 42.0}
    [row] = store.events(EXECUTION, after_event_id=500)
    assert (row.type, row.status, row.payload, row.worker_id) == (
        ev.COMMAND_CLAIMED,
        "claimed",
        {"attempt": 2},
        "w1",
    )
    assert row.parent_event_id == 500 and row.command_id == 1


# -- commands ---------------------------------------------------------------------------


def test_claims_and_leases(store: PostgresStore) -> None:
    store.append([], commands=[issued(1), issued(2), issued(3, loop_index=4)])
    with store.transaction("t") as conn:
        rows = pg.commands.lock_for_claim(conn, [3, 1, 1, 77])
        assert sorted(rows) == [1, 3]
        assert rows[3].issued_event_id == 503 and rows[3].loop_index == 4
        assert rows[1].status == "issued" and rows[1].execution_status == "running"
        pg.commands.claim(conn, [1, 2], "w1", now=10.0, lease_until=40.0)
        pg.commands.renew_leases(conn, [2], 45.0, 11.0)
        assert pg.commands.lock_reported(conn, [1, 3]).result() == {
            1: Holder("claimed", "w1", 1, EXECUTION, "load"),
            3: Holder("issued", None, 1, EXECUTION, "load"),
        }
        assert pg.commands.holds_live_claim(conn, EXECUTION, 1, "w1", 39.0)
        assert not pg.commands.holds_live_claim(conn, EXECUTION, 1, "w1", 41.0)
        assert not pg.commands.holds_live_claim(conn, EXECUTION, 1, "w2", 0.0)
        assert pg.commands.extend_leases(conn, "w1", 60.0, [1]) == 1
        assert pg.commands.extend_leases(conn, "w1", 60.0, []) == 0
        assert pg.commands.executions_with_expired_leases(conn, 44.0, 10) == []
        assert pg.commands.extend_leases(conn, "w1", 30.0, None) == 2
        assert pg.commands.executions_with_expired_leases(conn, 50.0, 10) == [EXECUTION]
        assert pg.commands.end_leases(conn, "w1", [2, 3]) == [EXECUTION]
        expired = pg.commands.lock_expired(conn, EXECUTION, 50.0)
        assert sorted(expired) == [ExpiredLease(1, 30.0), ExpiredLease(2, 0.0)]
        assert pg.commands.held_by_any(conn, EXECUTION, ["w9", "w1"])
        assert not pg.commands.held_by_any(conn, EXECUTION, ["w9"])
        pg.commands.close_open(conn, EXECUTION, 60.0)
    assert {c.status for c in store.pending_commands(EXECUTION)} == set()


def test_issue_writes_outbox_rows_in_order_and_reads_the_last_seq(store: PostgresStore) -> None:
    store.append([event(EXECUTION, 1)], commands=[issued(8), issued(9)])
    with store.transaction("t") as conn:
        with conn.pipeline():
            got = pg.commands.issue(
                conn,
                EXECUTION,
                pool="gpu",
                subject="flowtide.commands.gpu.11",
                command_ids=[9, 8],
                payloads=['{"n":9}', '{"n":8}'],
                created=1.0,
                locked_until=6.0,
                attempts=1,
            )
            last = pg.events.last_seq(conn, EXECUTION)
        result = got.result()
        assert result.last_seq == last.result() > 0
        assert result.outbox_ids[9] < result.outbox_ids[8]
        rows = pg.commands.lock_for_claim(conn, [8, 9])
        assert {r.pool for r in rows.values()} == {"gpu"}
        # Written locked: the relay leaves them to the writer until then.
        assert pg.outbox.claim(conn, now=5.0, lease=10.0, limit=10) == []
        claimed = pg.outbox.claim(conn, now=7.0, lease=10.0, limit=10)
    assert [(r.command_id, json.loads(r.payload), r.attempts) for r in claimed] == [
        (9, {"n": 9}, 2),
        (8, {"n": 8}, 2),
    ]


# -- outbox -----------------------------------------------------------------------------


def test_outbox_rows_through_their_life(store: PostgresStore) -> None:
    store.append([], commands=[issued(1)])
    with store.transaction("t") as conn:
        pg.commands.issue(
            conn,
            EXECUTION,
            pool="default",
            subject="s",
            command_ids=[1],
            payloads=["{}"],
            created=1.0,
            locked_until=None,
            attempts=0,
        ).result()
        assert pg.outbox.backlog(conn) == (1, 1.0)
        [row] = pg.outbox.claim(conn, now=2.0, lease=10.0, limit=5)
        assert row.attempts == 1
        assert pg.outbox.claim(conn, now=3.0, lease=10.0, limit=5) == []  # locked
        assert pg.outbox.mark_failed(conn, [row.id], "boom") == 1
        [again] = pg.outbox.claim(conn, now=3.0, lease=10.0, limit=5)
        assert again.attempts == 2
        assert pg.outbox.mark_published(conn, [row.id], 4.0) == 1
        assert pg.outbox.mark_published(conn, [row.id], 5.0) == 0
        assert pg.outbox.backlog(conn) == (0, None)
        # Unclaimed since before then: its notification goes out again.
        assert pg.outbox.renotify(conn, now=T0 + 200, before=T0 - 1) == 0
        assert pg.outbox.renotify(conn, now=T0 + 200, before=T0 + 100) == 1
        assert pg.outbox.backlog(conn) == (1, T0 + 200)
        assert pg.outbox.prune(conn, published_before=4.5) == 1
        assert pg.outbox.prune(conn, published_before=4.5) == 0


# -- workers ----------------------------------------------------------------------------


def test_worker_registration_and_takeover(store: PostgresStore) -> None:
    def register(subject: str | None, now: float, lost_before: float) -> Any:
        with store.transaction("t", "cluster") as conn:
            return pg.workers.register(
                conn,
                worker_id="w1",
                pool="default",
                hostname="h",
                pid=1,
                concurrency=4,
                subject=subject,
                now=now,
                lost_before=lost_before,
            )

    first = register("token-a", 10.0, 0.0)
    assert first is not None and first.subject == "token-a" and first.status == "ready"
    # A live worker of another credential keeps its id; a lost one gives it up.
    assert register("token-b", 11.0, 5.0) is None
    taken = register("token-b", 50.0, 20.0)
    assert taken is not None and taken.subject == "token-b"
    with store.transaction("t", "cluster") as conn:
        assert pg.workers.heartbeat(conn, "w1", 3, 60.0)
        assert not pg.workers.heartbeat(conn, "nobody", 3, 60.0)
        row = pg.workers.get(conn, "w1")
        assert row is not None and (row.running, row.heartbeat) == (3, 60.0)
        assert pg.workers.ids_of(conn, "token-b") == ["w1"]
        assert pg.workers.deregister(conn, "w1", 61.0)
        assert [w.status for w in pg.workers.list_all(conn)] == ["stopped"]
        assert pg.workers.get(conn, "nobody") is None


def _rows_read(plan: dict[str, Any]) -> int:
    """The most rows any node of an EXPLAIN ANALYZE plan produced or filtered out."""
    here = int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
    return max([here, *(_rows_read(p) for p in plan.get("Plans", []))])


def test_event_lookups_probe_the_key_even_under_a_generic_plan(store: PostgresStore) -> None:
    """known_ids and issue_times run on every step and claim, prepared by psycopg after
    their fifth run. Under a generic plan (what PostgreSQL may switch a prepared
    statement to) they must still look each id up, not read the execution's whole log
    (which grows by the iteration)."""
    # Never analyzed (as a new database's log is until autovacuum gets to it): the
    # planner's default estimates.
    with store.transaction("t") as conn:
        conn.execute(
            "INSERT INTO event (execution_id, event_id, type, time)"
            " SELECT 1000 + mod(g, 4), 100000 + g, 'x', 0 FROM generate_series(1, 30000) g"
        )
        conn.execute(
            "INSERT INTO event (execution_id, event_id, type, time)"
            " SELECT %s, g, 'x', 0 FROM generate_series(1, 20000) g",
            (EXECUTION,),
        )
    ids = [7, 19_999, 40_000]
    with store.transaction("t") as conn:
        assert pg.events.known_ids(conn, EXECUTION, ids).result() == {7, 19_999}
        assert set(pg.events.issue_times(conn, [EXECUTION], ids).result()) == {7, 19_999}
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(
            "PREPARE probes(bigint[], bigint[]) AS "
            + pg.events._PROBES.replace("%s", "$1", 1).replace("%s", "$2", 1)
        )
        doc = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probes({}, {})").format(
                sql.Literal([EXECUTION]), sql.Literal(ids)
            )
        ).fetchone()
        conn.execute("DEALLOCATE probes")
    assert doc is not None
    plan = doc[0][0]["Plan"]
    assert _rows_read(plan) <= len(ids), json.dumps(plan, indent=1)


# -- notifications ----------------------------------------------------------------------


def test_owed_deliveries_are_leased_by_one_relay_at_a_time(store: PostgresStore) -> None:
    from flowtide.store.notifications import PendingNotification

    owed = [
        PendingNotification(EXECUTION, 700, "failed", {"kind": "slack", "n": n}, {"n": n}, T0)
        for n in range(3)
    ]
    with store.transaction("t") as conn:
        pg.notifications.enqueue(conn, owed)
    # A relay holds one row in an open transaction: another skips it, never waits for it.
    with store.transaction("holder") as held:
        held.execute("SELECT id FROM notification ORDER BY id LIMIT 1 FOR UPDATE")
        taken = store.lease_notifications(now=T0 + 1, lease=60, limit=10)
        assert [r.target["n"] for r in taken] == [1, 2]
    assert [r.target["n"] for r in store.lease_notifications(now=T0 + 1, lease=60, limit=10)] == [0]
    # Leased rows are nobody else's until the lease runs out.
    assert store.lease_notifications(now=T0 + 30, lease=60, limit=10) == []
    again = store.lease_notifications(now=T0 + 62, lease=60, limit=10)
    assert len(again) == 3 and again[0].doc == {"n": 0} and again[0].attempts == 0
    note: ev.NotificationPayload = {"on": "failed", "target": "slack", "to": "x", "attempt": 1}
    store.settle_notification(
        again[0].id,
        event(EXECUTION, 701, ev.NOTIFICATION_FAILED, payload={**note, "retry_at": T0 + 99}),
        retry_at=T0 + 99,
    )
    store.settle_notification(
        again[1].id, event(EXECUTION, 702, ev.NOTIFICATION_SENT, payload=note), retry_at=None
    )
    assert store.pending_notifications([EXECUTION]) == 2
    (retried,) = store.lease_notifications(now=T0 + 99, lease=60, limit=10)
    assert retried.attempts == 1 and retried.target["n"] == 0
    assert [e.type for e in store.events(EXECUTION)] == [
        ev.NOTIFICATION_FAILED,
        ev.NOTIFICATION_SENT,
    ]
