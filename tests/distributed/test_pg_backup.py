"""A PostgreSQL backup restores (README "Operating flowtide", Backups): `pg_dump -Fc` of
the database taken while a loop runs, the stack stopped, `pg_restore` into an empty
database of the same name on a fresh PostgreSQL server, with a fresh nats-server (its
JetStream commands and the loop state in its KV are gone): the servers started on it
finish the run to the exact result, each iteration counted once."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowtide.dev.postgres import find_pg_bin

from .stack import Stack
from .test_faults import _events, _wait

pytestmark = pytest.mark.skipif(find_pg_bin() is None, reason="PostgreSQL server not installed")

DATABASE = "backed_up"
SIZE = 10

LOOP = f"""
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: pg_backup_loop, path: tests/dist/pg_backup_loop}}
workflow:
  - step: start
    loop:
      in: "{{{{ range({SIZE}) | list }}}}"
      iterator: n
      spec: {{mode: sequential}}
    tool:
      kind: python
      input: {{n: "{{{{ n }}}}"}}
      code: |
        import time
        time.sleep(0.3)
        result = n * n
    next: [{{step: total}}]
  - step: total
    tool:
      kind: python
      input: {{squares: "{{{{ start.results }}}}"}}
      code: "result = sum(squares)"
"""


def _pg_tool(name: str, *args: str) -> None:
    bindir = find_pg_bin()
    assert bindir is not None
    # initdb may be a link on PATH into the versioned directory that has pg_dump too.
    program = (bindir / "initdb").resolve().parent / name
    done = subprocess.run(
        [str(program), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def _status(dsn: str, eid: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT status FROM execution WHERE execution_id = %s", (int(eid),)
        ).fetchone()
    assert row is not None
    return str(row[0])


def _completed(client: Any, eid: str) -> list[int]:
    return sorted(
        e["payload"]["loop_index"]
        for e in _events(client, eid)
        if e["type"] == "command.completed" and e["step"] == "start"
    )


@pytest.fixture
def first(pg_server: Any, tmp_path: Path) -> Iterator[tuple[Stack, Any]]:
    from natsserver import NatsServer

    db = pg_server.create_database(DATABASE)
    nats = NatsServer.start_secured(tmp_path / "nats-1")
    stack = Stack(db=db, nats=nats.url, root=tmp_path, kv=nats.url, nats_users=nats.users)
    try:
        yield stack, nats
    finally:
        stack.stop()
        nats.stop()
        pg_server.drop_database(DATABASE)


@pytest.mark.timeout(180)
def test_pg_dump_mid_run_restored_on_fresh_servers_finishes_exactly(
    first: tuple[Stack, Any], tmp_path: Path
) -> None:
    from natsserver import NatsServer

    from pgserver import PgServer

    stack, nats = first
    # The fresh server for the restore gets ready meanwhile (initdb takes a while).
    pool = ThreadPoolExecutor(max_workers=1)
    fresh = pool.submit(PgServer.start)
    pool.shutdown(wait=False)
    stack.lease = 2.0
    stack.start_server()
    stack.start_worker()
    with stack.client() as client:
        r = client.post("/api/execute", json={"playbook": LOOP})
        assert r.status_code == 201, r.text
        eid = str(r.json()["execution_id"])
        deadline = time.monotonic() + 30
        while len(_completed(client, eid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_completed(client, eid)) >= 3
        dump = tmp_path / "backed_up.dump"
        _pg_tool("pg_dump", "-Fc", "-f", str(dump), stack.db)
    # The stack goes away (as with a lost machine: no goodbye), and its nats-server with
    # the commands in its stream and the loop state in its KV.
    for proc in [*stack.workers, stack.server]:
        assert proc is not None
        proc.kill()
        proc.wait()
    nats.stop()

    fresh_pg = fresh.result(timeout=120)
    fresh_nats = NatsServer.start_secured(tmp_path / "nats-2")
    try:
        db = fresh_pg.create_database(DATABASE)
        _pg_tool("pg_restore", "--no-owner", "-d", db, str(dump))
        assert _status(db, eid) == "running", "the dump was not taken mid-run"
        again = Stack(
            db=db,
            nats=fresh_nats.url,
            root=tmp_path / "again",
            kv=fresh_nats.url,
            nats_users=fresh_nats.users,
            tokens=stack.tokens,  # restored with the database
            lease=2.0,
        )
        again.root.mkdir()
        try:
            again.start_server()
            again.start_worker()
            with again.client() as client:
                doc = _wait(client, eid, timeout=60)
                assert doc["status"] == "completed", doc
                indexes = _completed(client, eid)
                total = next(
                    e
                    for e in _events(client, eid)
                    if e["type"] == "command.completed" and e["step"] == "total"
                )
            assert indexes == list(range(SIZE)), "an iteration counted twice or not at all"
            assert total["payload"]["result"] == sum(n * n for n in range(SIZE)), total
        finally:
            again.stop()
    finally:
        fresh_nats.stop()
        fresh_pg.stop()
