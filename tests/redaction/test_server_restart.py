"""The secret set outlives the server process that learnt it.

A step touches a secret (a bearer token the loopback server echoes back) on a stack whose
server is then killed (SIGKILL) and started again. The next step — a python step whose
own tools touch nothing — returns the echoed token: its report reaches the new process,
which knows the secret only from the log (a sealed `secrets.added` it catches up on), and
must store that result sealed all the same.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.fernet import Fernet

from distributed.stack import Stack
from flowtide.credentials import MasterKey
from flowtide.sealing import Sealer
from kv.natsserver import NatsServer

pytestmark = [pytest.mark.postgres, pytest.mark.nats]

TOKEN = "rst-" + secrets.token_hex(12)

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: restart_secret, path: tests/redaction/restart_secret}
workload: {echo: "http://127.0.0.1:9/echo", flag: "/nonexistent"}
workflow:
  - step: start
    tool: {kind: http, url: "{{ echo }}", auth: api_token}
    next: [echo_back]
  - step: echo_back
    tool:
      kind: python
      input: {seen: "{{ start.data.authorization }}", flag: "{{ flag }}"}
      code: |
        import os, time
        deadline = time.time() + 90
        while not os.path.exists(flag) and time.time() < deadline:
            time.sleep(0.05)
        if not os.path.exists(flag):
            raise RuntimeError(f"never saw {flag}")
        result = {"echo": seen}
"""


@pytest.fixture
def stack(pg_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("restart-secret")
    db = pg_server.create_database("restart_secret")
    nats = NatsServer.start(root / "nats")
    stack = Stack(db=db, nats=nats.url, root=root, master_key=Fernet.generate_key().decode())
    try:
        stack.start_server()
        stack.start_worker()
        yield stack
    finally:
        stack.stop()
        nats.stop()
        pg_server.drop_database("restart_secret")


def test_a_restarted_server_seals_with_the_set_in_the_log(stack: Stack, echo: str) -> None:
    # The python step may run as the steps' own user (nobody): a folder it can read
    # (tmp_path's parents are 0700; the step then waited out its 90 s, unseen).
    folder = Path(tempfile.mkdtemp(prefix="flowtide-restart-"))
    folder.chmod(0o755)
    try:
        _run(stack, echo, folder / "go")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(stack: Stack, echo: str, flag: Path) -> None:
    body = {"name": "api_token", "kind": "http", "data": {"type": "bearer", "token": TOKEN}}
    with stack.client(timeout=30) as client:
        assert client.post("/api/credentials", json=body).status_code == 201
        r = client.post(
            "/api/execute",
            json={"playbook": PLAYBOOK, "payload": {"echo": echo, "flag": str(flag)}},
        )
        assert r.status_code == 201, r.text
        eid = r.json()["execution_id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            doc = client.get(f"/api/executions/{eid}").json()
            if doc["steps"]["echo_back"]["status"] == "running":
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"echo_back never started: {doc}")

    stack.kill_server()
    stack.start_server()
    flag.touch()  # the worker's report of echo_back now goes to the new process

    with stack.client(timeout=30) as client:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            doc = client.get(f"/api/executions/{eid}").json()
            if doc["status"] != "running":
                break
            time.sleep(0.2)
    assert doc["status"] == "completed", doc
    assert doc["steps"]["echo_back"]["result"] == {"echo": "Bearer ***"}

    with psycopg.connect(stack.db) as conn:
        rows = conn.execute(
            "SELECT type, payload FROM event WHERE execution_id = %s AND step = 'echo_back'"
            " AND type = 'command.completed'",
            (int(eid),),
        ).fetchall()  # the report the restarted process took
        dump = json.dumps(
            conn.execute(
                "SELECT e::text FROM event e WHERE execution_id = %s", (int(eid),)
            ).fetchall()
        )
        result = conn.execute(
            "SELECT result FROM execution WHERE execution_id = %s", (int(eid),)
        ).fetchone()
    assert rows and all(payload.startswith('{"$sealed":') for _, payload in rows)
    assert result is not None and result[0].startswith('{"$sealed":')
    assert TOKEN not in dump and TOKEN not in result[0]
    # Sealed, not altered: the server's key opens the intact value.
    assert stack.master_key is not None
    sealer = Sealer(key=_EnvKey(stack.master_key))
    intact = json.loads(sealer.unseal(rows[-1][1], "the report"))
    assert intact["result"] == {"echo": f"Bearer {TOKEN}"}


class _EnvKey(MasterKey):
    """The stack's master key, without touching this process's environment."""

    def __init__(self, key: str) -> None:
        super().__init__(None)
        self._key = key.encode()

    def keys(self) -> tuple[str, list[bytes]]:
        return "the stack's key", [self._key]

    def _stamp(self) -> int | None:
        return None
