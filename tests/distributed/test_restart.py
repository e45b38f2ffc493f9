"""The server is killed (SIGKILL) in the middle of a run and started again: the execution
completes with every iteration recorded exactly once.

While it is down, workers keep running what they claimed and retry their reports and
claims; the restarted process rebuilds its state from the event log (and from the KV's
loop state when the KV is NATS), and its relay publishes outbox rows the dead one left.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .stack import Stack
from .test_faults import _events, _wait

_names = itertools.count()

LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: restart_loop, path: tests/dist/restart_loop}
workload: {count: 400, pause: 0.02}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'go': True}"}
    next: [{step: work}]
  - step: work
    loop:
      in: "{{ range(count) | list }}"
      iterator: item
      spec: {mode: parallel, max_in_flight: 16}
    tool:
      kind: python
      input: {index: "{{ item }}", pause: "{{ pause }}"}
      code: |
        import time
        time.sleep(pause)
        result = {"index": index, "square": index * index}
    next: [{step: total}]
  - step: total
    tool:
      kind: python
      input: {rows: "{{ work.results }}"}
      code: "result = {'n': len(rows), 'sum': sum(r['square'] for r in rows)}"
"""


@pytest.fixture(scope="module", params=["memory", "nats"])
def restart_stack(  # type: ignore[no-untyped-def]
    request, pg_server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    from natsserver import NatsServer

    root = tmp_path_factory.mktemp(f"restart-{request.param}")
    name = f"restart_{next(_names)}"
    db = pg_server.create_database(name)
    nats = NatsServer.start_secured(root / "nats")
    kv = "memory://" if request.param == "memory" else nats.url
    stack = Stack(db=db, nats=nats.url, root=root, kv=kv, nats_users=nats.users)
    try:
        stack.start_server()
        stack.start_worker()
        stack.start_worker()
        yield stack
    finally:
        stack.stop()
        nats.stop()
        pg_server.drop_database(name)


def _completed_indexes(events: list[dict[str, Any]]) -> list[int]:
    return sorted(
        e["payload"]["loop_index"]
        for e in events
        if e["type"] == "command.completed" and e["step"] == "work"
    )


def _diagnose(stack: Stack, eid: str) -> str:
    """What a stuck run looks like: command rows by status, outbox backlog, log tails."""
    import psycopg

    with psycopg.connect(stack.db) as conn:
        commands = conn.execute(
            "SELECT status, worker_id, attempt, lease_until - extract(epoch FROM now())"
            " FROM command WHERE execution_id = %s AND status NOT IN ('completed')",
            (int(eid),),
        ).fetchall()
        outbox = conn.execute(
            "SELECT count(*) FROM outbox WHERE published IS NULL AND execution_id = %s",
            (int(eid),),
        ).fetchone()
        tail = conn.execute(
            "SELECT type, step, worker_id FROM event WHERE execution_id = %s"
            " ORDER BY seq DESC LIMIT 15",
            (int(eid),),
        ).fetchall()
    return (
        f"execution {eid} stuck; open commands {commands}; unpublished outbox {outbox}; "
        f"last events {tail}\nserver log:\n{stack.log('server')}\nworker0 log:\n"
        f"{stack.log('worker0')[-1500:]}"
    )


@pytest.mark.timeout(300)
def test_server_killed_and_restarted_mid_loop(restart_stack: Stack, tmp_path: Path) -> None:
    stack = restart_stack
    playbook = tmp_path / "loop.yaml"
    playbook.write_text(LOOP)
    # The command line follows the run through the restart.
    follower = subprocess.Popen(
        [sys.executable, "-m", "flowtide.cli", "run", str(playbook), "--json"]
        + ["--server", stack.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stack.env,
    )
    try:
        with stack.client(timeout=30) as client:
            eid = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if eid is None:
                    items = client.get("/api/executions", params={"status": "running"}).json()
                    mine = [i for i in items["items"] if i["playbook"] == "tests/dist/restart_loop"]
                    eid = mine[0]["execution_id"] if mine else None
                elif len(_completed_indexes(_events(client, eid))) >= 80:
                    break
                time.sleep(0.05)
            assert eid is not None
            stack.kill_server()
            # Down long enough for workers to finish what they hold and fail to report it.
            time.sleep(2.0)
            stack.start_server()
            try:
                doc = _wait(client, eid, timeout=150)
            except AssertionError:
                raise AssertionError(_diagnose(stack, eid)) from None
            assert doc["status"] == "completed", (doc, stack.log("server"))
            assert doc["result"] == {"n": 400, "sum": sum(i * i for i in range(400))}
            assert _completed_indexes(_events(client, eid)) == list(range(400))
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    followed = json.loads(out)
    assert followed["execution_id"] == eid and followed["result"] == doc["result"]
