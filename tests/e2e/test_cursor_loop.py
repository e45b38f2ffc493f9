"""A cursor loop (`loop.spec.mode: cursor`) against real PostgreSQL, through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: cursor_queue, path: tests/e2e/cursor_queue}}
workload: {{}}
workflow:
  - step: start
    tool: {{kind: noop}}
    next: [process]
  - step: process
    loop:
      cursor:
        kind: postgres
        auth: pg_local
        claim: >-
          UPDATE {queue} SET claimed = true
          WHERE id IN (SELECT id FROM {queue} WHERE NOT claimed ORDER BY id
                       LIMIT {{{{ __frame_max_rows | default(1) | int }}}}
                       FOR UPDATE SKIP LOCKED)
          RETURNING id, payload
      iterator: row
      spec: {{mode: cursor, max_in_flight: 3, frame: {{max_rows: 4, process: row}}}}
    tool:
      kind: postgres
      auth: pg_local
      command: >-
        INSERT INTO {done} (id, payload) VALUES ({{{{ row.id }}}}, '{{{{ row.payload }}}}')
        RETURNING id
    next: [end]
  - step: end
    tool: {{kind: python, code: "result = {{'total': {{{{ process.stats.total }}}}}}"}}
"""


def flowtide(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLOWTIDE_HOME=str(home), FLOWTIDE_NO_PROGRESS="1")
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def sql(pg_server: Any, statement: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(pg_server.dsn) as conn:
        cur = conn.execute(statement.encode())
        return cur.fetchall() if cur.description else []


@pytest.mark.postgres
def test_parallel_cursor_loop_processes_each_row_exactly_once(
    tmp_path: Path, pg_server: Any
) -> None:
    home = tmp_path / ".flowtide"
    body = json.dumps(pg_server.credential())
    proc = flowtide(
        "credential", "set", "pg_local", "--json", body, "--kind", "postgres", home=home
    )
    assert proc.returncode == 0, proc.stderr

    suffix = uuid.uuid4().hex[:8]
    queue, done = f"cursor_queue_{suffix}", f"cursor_done_{suffix}"
    sql(
        pg_server,
        f"CREATE TABLE {queue} (id int PRIMARY KEY, payload text, claimed boolean NOT NULL "
        f"DEFAULT false); CREATE TABLE {done} (id int, payload text)",
    )
    sql(
        pg_server,
        f"INSERT INTO {queue} (id, payload) SELECT g, 'p' || g FROM generate_series(1, 25) g",
    )

    path = tmp_path / "cursor.yaml"
    path.write_text(PLAYBOOK.format(queue=queue, done=done))
    proc = flowtide("run", str(path), "--json", home=home)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    doc = json.loads(proc.stdout)
    assert doc["status"] == "completed"

    result = doc["steps"]["process"]["result"]
    assert result["stats"] == {"total": 25, "success": 25, "failed": 0}
    ids = [r["rows"][0]["id"] for r in result["results"]]
    assert sorted(ids) == list(range(1, 26))
    assert doc["steps"]["end"]["result"] == {"total": 25}

    # every row processed exactly once, and the queue shows all claimed
    processed = sql(pg_server, f"SELECT id, payload FROM {done} ORDER BY id")
    assert processed == [(i, f"p{i}") for i in range(1, 26)]
    assert sql(pg_server, f"SELECT count(*) FROM {queue} WHERE claimed") == [(25,)]

    # the claims are in the log: 4 + 4 + ... + 1 rows, then the empty one
    events = json.loads(flowtide("events", doc["execution_id"], "--json", home=home).stdout)
    claimed = [e for e in events if e["type"] == "loop.claimed"]
    assert sum(len(e["payload"]["rows"]) for e in claimed) == 25
    assert all(len(e["payload"]["rows"]) <= 4 for e in claimed)
    assert claimed[-1]["payload"]["exhausted"] is True
    assert [e["payload"]["exhausted"] for e in claimed[:-1]] == [False] * (len(claimed) - 1)
    # never more than 3 iterations in flight
    in_flight = peak = 0
    for e in events:
        payload = e.get("payload") or {}
        if e["step"] != "process" or "loop_index" not in payload:
            continue
        if e["type"] == "command.issued":
            in_flight += 1
            peak = max(peak, in_flight)
        elif e["type"] in ("command.completed", "command.failed"):
            in_flight -= 1
    assert 1 <= peak <= 3
