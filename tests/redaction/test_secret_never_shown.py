"""A known secret, set as a credential and used by postgres, http and spark steps, never
appears in plaintext where flowtide stores or shows things — yet the later step that
reads it gets it intact.

The secret is the password of a real PostgreSQL role (a postgres step SELECTs it back
from a table, and a spark step reads that table over JDBC with it) and the bearer token
of a loopback HTTP server that echoes the Authorization header back. A last python step
reads all three and returns only their SHA-256 digests, which must match the secret's.

Both deployments are checked: embedded (`flowtide run`, SQLite) and distributed
(`flowtide server` on PostgreSQL, workers, NATS). Scanned: the raw rows of the event
store (every table), the CLI's output, the API's responses (documents, events, the SSE
stream, variables, status, lists, metrics), the server's and workers' logs, and
everything that went through NATS during the runs (command stream, KV bucket, replies),
recorded by a subscription to every subject.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from cryptography.fernet import Fernet

from distributed.stack import Stack, flowtide_env
from kv.natsserver import NatsServer

from .echo import EchoAuth

pytestmark = [pytest.mark.postgres, pytest.mark.nats, pytest.mark.spark, pytest.mark.slow]

SECRET = "rdx-" + secrets.token_hex(12)

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: secret_never_shown, path: tests/redaction/secret_never_shown}
workload: {echo: "http://127.0.0.1:9/echo"}
workflow:
  - step: start
    tool: {kind: postgres, auth: pg_secret, command: "SELECT pw FROM public.vault_copy"}
    next: [call_api]
  - step: call_api
    loop: {in: [1, 2], iterator: i, spec: {mode: parallel, max_in_flight: 2}}
    tool: {kind: http, method: GET, url: "{{ echo }}?i={{ i }}", auth: api_secret}
    next: [read_jdbc]
  - step: read_jdbc
    tool:
      kind: spark
      inputs:
        src: {format: jdbc, auth: pg_secret, query: "SELECT pw FROM public.vault_copy"}
      sql: SELECT pw FROM src
    next: [check]
  - step: check
    tool:
      kind: python
      input:
        from_pg: "{{ start.rows[0].pw }}"
        from_http: "{{ call_api.results[1].data.authorization }}"
        from_spark: "{{ read_jdbc.preview[0].pw }}"
      code: |
        import hashlib
        def digest(value):
            return hashlib.sha256(value.encode()).hexdigest()
        result = {"pg": digest(from_pg), "http": digest(from_http), "spark": digest(from_spark)}
"""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


EXPECTED = {"pg": _sha(SECRET), "http": _sha(f"Bearer {SECRET}"), "spark": _sha(SECRET)}


@pytest.fixture(scope="module")
def pg_secret(pg_server: Any) -> dict[str, Any]:
    """A role whose password is the secret, owning a database that holds a copy of it."""
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE redact_user LOGIN PASSWORD '{SECRET}'")
        conn.execute("CREATE DATABASE redact_data OWNER redact_user TEMPLATE template0")
    body = {
        "host": pg_server.host,
        "port": pg_server.port,
        "user": "redact_user",
        "password": SECRET,
        "database": "redact_data",
    }
    dsn = f"postgresql://redact_user:{SECRET}@{pg_server.host}:{pg_server.port}/redact_data"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.vault_copy (pw text)")
        conn.execute("INSERT INTO public.vault_copy VALUES (%s)", (SECRET,))
    try:
        yield body
    finally:
        pg_server.drop_database("redact_data")
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute("DROP ROLE redact_user")


class Wiretap:
    """Records every message published on a NATS server (subject and data), from a
    subscription to `>` in a thread of its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.messages: list[tuple[str, bytes]] = []
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Wiretap:
        self._thread.start()
        assert self._ready.wait(20), "wiretap did not connect"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=20)
        self._loop.close()

    def _run(self) -> None:
        self._loop.run_until_complete(self._listen())

    async def _listen(self) -> None:
        import nats

        self._stop = asyncio.Event()
        nc = await nats.connect(self.url)

        async def record(msg: Any) -> None:
            self.messages.append((msg.subject, bytes(msg.data)))

        await nc.subscribe(">", cb=record)
        await nc.flush()
        self._ready.set()
        await self._stop.wait()
        await nc.drain()

    def text(self) -> str:
        return "\n".join(f"{s} {d.decode('utf-8', 'replace')}" for s, d in self.messages)


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    with NatsServer.start(tmp_path_factory.mktemp("nats")) as server:
        yield server


def _assert_hidden(where: str, text: str) -> None:
    assert SECRET not in text, f"the secret is in {where}"


def _playbook(tmp_path: Path) -> Path:
    path = tmp_path / "secret_never_shown.yaml"
    path.write_text(PLAYBOOK, encoding="utf-8")
    return path


def test_embedded(tmp_path: Path, pg_secret: dict[str, Any], echo: str, nats: NatsServer) -> None:
    import subprocess
    import sys

    home = tmp_path / "home"
    env = {**flowtide_env(home), "FLOWTIDE_KV": nats.url}

    def flowtide(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flowtide.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=600,
        )

    for name, kind, body in (
        ("pg_secret", "postgres", pg_secret),
        ("api_secret", "http", {"type": "bearer", "token": SECRET}),
    ):
        proc = flowtide("credential", "set", name, "--json", json.dumps(body), "--kind", kind)
        assert proc.returncode == 0, proc.stderr
    EchoAuth.seen = []
    with Wiretap(nats.url) as tap:
        run = flowtide("run", str(_playbook(tmp_path)), "--json", "--set", f"echo={echo}")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(run.stdout)
    eid = doc["execution_id"]

    # The later step read every value intact (and the request carried the token).
    assert doc["steps"]["check"]["result"] == EXPECTED
    assert EchoAuth.seen == [f"Bearer {SECRET}"] * 2
    # What is shown of the steps that touched it is masked.
    assert doc["steps"]["start"]["result"]["rows"] == [{"pw": "***"}]
    calls = doc["steps"]["call_api"]["result"]["results"]
    assert [c["data"] for c in calls] == [{"authorization": "Bearer ***"}] * 2
    assert doc["steps"]["read_jdbc"]["result"]["preview"] == [{"pw": "***"}]

    shown = [
        run,
        flowtide("status", eid, "--json"),
        flowtide("status", eid),
        flowtide("events", eid, "--json"),
        flowtide("events", eid),
        flowtide("list", "--json"),
    ]
    for proc in shown:
        assert proc.returncode == 0, proc.stderr
        _assert_hidden(f"`flowtide {' '.join(proc.args[3:5])}`", proc.stdout + proc.stderr)
    types = [e["type"] for e in json.loads(shown[3].stdout)]
    assert types.count("secrets.added") == 1  # the first command says it, the rest add nothing

    # The event store at rest: every row of every table, and the files' raw bytes (the
    # WAL included).
    with sqlite3.connect(home / "flowtide.db") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        rows = [repr(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in tables]
    assert "event" in tables
    _assert_hidden("the SQLite store", "\n".join(rows))
    for path in home.glob("flowtide.db*"):  # the file, its WAL, the run locks
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            assert SECRET.encode() not in file.read_bytes(), file
    _assert_hidden("NATS (KV and everything else)", tap.text())
    assert any(s.startswith("$KV.") for s, _ in tap.messages)  # the tap saw the loop state


@pytest.fixture
def stack(
    pg_server: Any, nats: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("redact-stack")
    db = pg_server.create_database("redact_stack")
    stack = Stack(
        db=db, nats=nats.url, root=root, kv=nats.url, master_key=Fernet.generate_key().decode()
    )
    try:
        stack.start_server()
        stack.start_worker()
        stack.start_worker()
        yield stack
    finally:
        stack.stop()
        pg_server.drop_database("redact_stack")


def _sse(client: httpx.Client, eid: str) -> str:
    with client.stream("GET", f"/api/executions/{eid}/events/stream", timeout=60) as r:
        assert r.status_code == 200
        return "".join(r.iter_text())


def test_distributed(
    tmp_path: Path, stack: Stack, nats: NatsServer, pg_secret: dict[str, Any], echo: str
) -> None:
    responses: list[str] = []
    with stack.client(timeout=30) as client:

        def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
            r = client.request(method, url, **kwargs)
            responses.append(r.text)
            return r

        for name, kind, body in (
            ("pg_secret", "postgres", pg_secret),
            ("api_secret", "http", {"type": "bearer", "token": SECRET}),
        ):
            r = call("POST", "/api/credentials", json={"name": name, "kind": kind, "data": body})
            assert r.status_code == 201, r.text
            assert r.json()["warnings"] == []
        # A weak one is named with its field, never its value.
        weak = {"user": "demo", "password": "demo"}
        r = call("POST", "/api/credentials", json={"name": "weak_pg", "data": weak})
        assert r.status_code == 201 and len(r.json()["warnings"]) == 1
        assert "credential 'weak_pg'" in r.json()["warnings"][0]
        assert "'password'" in r.json()["warnings"][0]

        EchoAuth.seen = []
        with Wiretap(nats.url) as tap:
            run = stack.run("run", _playbook(tmp_path), "--json", "--set", f"echo={echo}")
            assert run.returncode == 0, run.stdout + run.stderr + stack.log("worker0")
            doc = json.loads(run.stdout)
            eid = doc["execution_id"]
            for args in (("status", eid, "--json"), ("events", eid, "--json"), ("list",)):
                shown = stack.run(*args)
                assert shown.returncode == 0, shown.stderr
                _assert_hidden(f"`flowtide {args[0]} --server`", shown.stdout + shown.stderr)

        assert doc["steps"]["check"]["result"] == EXPECTED
        assert EchoAuth.seen == [f"Bearer {SECRET}"] * 2
        assert doc["steps"]["start"]["result"]["rows"] == [{"pw": "***"}]
        _assert_hidden("`flowtide run --server`", run.stdout + run.stderr)

        assert call("GET", f"/api/executions/{eid}").json()["steps"]["check"]["result"] == (
            EXPECTED
        )
        events = call("GET", f"/api/executions/{eid}/events").json()
        assert "secrets.added" in [e["type"] for e in events]
        responses.append(_sse(client, eid))
        for url in (
            f"/api/executions/{eid}/status",
            f"/api/vars/{eid}",
            "/api/executions",
            "/metrics",
        ):
            assert call("GET", url).status_code == 200, url
        # Workers running a `playbook` step read a child's result intact from the
        # internal endpoint, the one reply that holds the data as it is: nobody else may
        # (not even an admin), nor a worker that holds no command of its parent.
        for role in ("admin", "worker"):
            r = client.get(f"/api/internal/executions/{eid}/result", headers=stack.headers(role))
            assert r.status_code == 403 and SECRET not in r.text, (role, r.text)

    for text in responses:
        _assert_hidden("an API response", text)
    _assert_hidden("NATS (command stream, KV and everything else)", tap.text())
    assert any(s.startswith("flowtide.commands.") for s, _ in tap.messages)
    assert any(s.startswith("$KV.") for s, _ in tap.messages)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(stack.root.glob("*.log")))
    _assert_hidden("the server's and workers' logs", logs)

    # The database at rest: every row of every table of the stack's database.
    with psycopg.connect(stack.db) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        ]
        dump = "\n".join(
            str(conn.execute(f'SELECT t::text FROM public."{t}" t').fetchall()) for t in tables
        )
    assert {"event", "execution", "command", "outbox"} <= set(tables)
    _assert_hidden("the server's PostgreSQL database", dump)
    # Sealed, not dropped: the rows that held it are there, unreadable without the key.
    with psycopg.connect(stack.db) as conn:
        sealed = conn.execute(
            "SELECT count(*) FROM event WHERE execution_id = %s AND payload LIKE %s",
            (int(eid), '{"$sealed":%'),
        ).fetchone()
    assert sealed is not None and sealed[0] >= 3
    # What the embedded test checked on the CLI holds here too: env of this process
    # never carried it.
    assert SECRET not in json.dumps(flowtide_env(stack.root))
