"""Snowflake machine ids leased from the cluster database (flowtide.machines,
store/pg/machines.py), on a real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowtide.errors import StoreError
from flowtide.ids import EPOCH_MS, MachineLeaseExpired, Snowflake, timestamp_ms
from flowtide.machines import MachineLease, holder_name
from flowtide.store import pg
from flowtide.store.postgres import PostgresStore


@pytest.fixture
def store(pg_database: str) -> Iterator[PostgresStore]:
    with PostgresStore(pg_database, max_size=4) as store:
        yield store


def _take_all(store: PostgresStore) -> list[int]:
    with store.transaction("t", "cluster") as conn:
        return [
            lease.machine_id
            for i in range(1024)
            if (lease := pg.machines.acquire(conn, f"h{i}", 60)) is not None
        ]


def test_every_id_once_then_none(store: PostgresStore) -> None:
    taken = _take_all(store)
    assert sorted(taken) == list(range(1024))
    with store.transaction("t", "cluster") as conn:
        assert pg.machines.acquire(conn, "one-too-many", 60) is None
        assert len(pg.machines.holders(conn)) == 1024
    lease = MachineLease(store, "late", Snowflake())
    with pytest.raises(StoreError, match="no free snowflake machine id"):
        lease.acquire()


def test_a_released_id_is_reused_after_its_last_millisecond(store: PostgresStore) -> None:
    _take_all(store)
    last_ms = int(time.time() * 1000) + 60_000  # the old holder may have issued until then
    with store.transaction("t", "cluster") as conn:
        pg.machines.release(conn, 5, "h5", last_ms)
        pg.machines.release(conn, 6, "not-the-holder", last_ms)  # not theirs: no effect
    generator = Snowflake()
    lease = MachineLease(store, "next", generator)
    assert lease.acquire() == 5
    first = generator.next_id()
    assert (first >> 12) & 0x3FF == 5
    # The new holder's clock says now; its ids still start after the old holder's last.
    assert timestamp_ms(first) > last_ms


def test_a_lapsed_lease_is_not_renewed_but_replaced(store: PostgresStore) -> None:
    generator = Snowflake()
    # 2 s, of which the generator may use 1.5 (the margin): room for a loaded machine.
    lease = MachineLease(store, "sleepy", generator, seconds=2.0)
    first = lease.acquire()
    generator.next_id()
    time.sleep(2.2)  # paused past the lease: the database lets it go
    with pytest.raises(MachineLeaseExpired, match=f"machine id {first}"):
        generator.next_id()
    with store.transaction("t", "cluster") as conn:
        assert not pg.machines.renew(conn, first, "sleepy", 2.0, 0)
        other = pg.machines.acquire(conn, "someone-else", 60)
    assert other is not None
    second = lease.renew()  # lost: takes another id and issues again
    assert second not in (other.machine_id,)
    assert (generator.next_id() >> 12) & 0x3FF == second


def test_renewal_keeps_the_id_and_the_generator_going(store: PostgresStore) -> None:
    generator = Snowflake()
    lease = MachineLease(store, holder_name("test"), generator, seconds=2.0)
    machine = lease.acquire()
    last = 0
    for _ in range(3):
        time.sleep(0.3)
        assert lease.renew() == machine
        last = generator.next_id()
        with store.transaction("t", "cluster") as conn:
            (bound,) = conn.execute(
                "SELECT issued_until_ms FROM machine_lease WHERE machine_id = %s", (machine,)
            ).fetchone()
        # Should this process die now, the next holder starts after its whole term.
        assert bound >= time.time() * 1000 + 1000
    lease.release()
    with store.transaction("t", "cluster") as conn:
        (floor,) = conn.execute(
            "SELECT issued_until_ms FROM machine_lease WHERE machine_id = %s", (machine,)
        ).fetchone()
    # Released: the floor is the last millisecond it really used, not the term.
    assert floor == timestamp_ms(last)
    with pytest.raises(MachineLeaseExpired):
        generator.next_id()
    with store.transaction("t", "cluster") as conn:
        assert machine not in pg.machines.holders(conn)


def test_generator_deadline_is_short_of_the_lease() -> None:
    now = [100.0]
    generator = Snowflake(monotonic=lambda: now[0])
    generator.lease(7, valid_for=10.0, floor_ms=EPOCH_MS)
    generator.next_id()
    now[0] = 109.9
    generator.next_id()
    now[0] = 110.1
    with pytest.raises(MachineLeaseExpired):
        generator.next_id()
    with pytest.raises(ValueError):
        generator.lease(1024, valid_for=1.0)


SCRIPT = textwrap.dedent(
    """
    import sys
    from flowtide.ids import Snowflake
    from flowtide.machines import MachineLease, holder_name
    from flowtide.store.postgres import PostgresStore

    dsn, out, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    generator = Snowflake()  # WORKER_ID is the same in every process
    with PostgresStore(dsn, max_size=1) as store:
        lease = MachineLease(store, holder_name("test"), generator)
        lease.acquire()
        sys.stdout.write("ready\\n")
        sys.stdout.flush()
        sys.stdin.readline()  # all four start issuing together
        ids = [generator.next_id() for _ in range(count)]
        lease.release()
    with open(out, "w") as f:
        f.write("\\n".join(map(str, ids)))
    """
)


def test_four_processes_with_one_worker_id_issue_no_duplicate(
    pg_database: str, tmp_path: Path
) -> None:
    # `flowtide server --workers 4` processes share one WORKER_ID: hashed, they would
    # share one machine id and repeat each other's ids within a millisecond.
    with PostgresStore(pg_database, max_size=1):
        pass  # the schema, once, before four processes race to create it
    script = tmp_path / "issue.py"
    script.write_text(SCRIPT)
    env = {"WORKER_ID": "same-for-all"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), pg_database, str(tmp_path / f"ids{n}"), "50000"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for n in range(4)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        assert proc.wait(timeout=120) == 0
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.stdout.close()
    every = [
        int(line) for n in range(4) for line in (tmp_path / f"ids{n}").read_text().splitlines()
    ]
    assert len(every) == 200_000
    assert len(set(every)) == 200_000
    assert len({(i >> 12) & 0x3FF for i in every}) == 4
