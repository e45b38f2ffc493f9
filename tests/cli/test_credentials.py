"""`flowtide credential set/list/delete`, and that a credential's secret never leaks."""

from __future__ import annotations

import json
import stat
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.fernet import Fernet

from .helpers import PLAYBOOKS, Flowtide, describe

PASSWORD = "pw-Zq7-hunter2-never-print-me"
TOKEN = "tok-9f2c1b-also-very-secret"


def stored_bytes(home: Path) -> bytes:
    """Every byte flowtide keeps under its home, except the master key itself."""
    return b"".join(
        p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file() and p.name != "master.key"
    )


def test_credential_set_list_delete(ft: Flowtide, tmp_path: Path) -> None:
    body = json.dumps({"host": "db.local", "user": "app", "password": PASSWORD})
    out = ft.ok("credential", "set", "warehouse_db", "--json", body, "--kind", "postgres")
    assert "warehouse_db" in out.stdout and PASSWORD not in out.stdout + out.stderr

    body_file = tmp_path / "api.json"
    body_file.write_text(json.dumps({"type": "bearer", "token": TOKEN}), encoding="utf-8")
    ft.ok("credential", "set", "echo_api", "--json", f"@{body_file}", "--kind", "http")

    key = ft.home / "master.key"
    assert key.is_file()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600

    listing = ft("credential", "list", "--json")
    assert listing.returncode == 0, describe(listing)
    rows = json.loads(listing.stdout)
    assert {(r["name"], r["kind"]) for r in rows} == {
        ("warehouse_db", "postgres"),
        ("echo_api", "http"),
    }
    text = ft.ok("credential", "list").stdout
    assert "warehouse_db" in text and "echo_api" in text
    for output in (listing.stdout, text):
        assert PASSWORD not in output and TOKEN not in output

    # encrypted at rest: neither secret is in the SQLite file (nor its WAL)
    data = stored_bytes(ft.home)
    assert b"warehouse_db" in data  # the alias is there: we are reading the right file
    assert PASSWORD.encode() not in data and TOKEN.encode() not in data

    # replacing keeps one entry
    ft.ok("credential", "set", "warehouse_db", "--json", body, "--kind", "postgres")
    assert len(ft.json("credential", "list")) == 2

    ft.ok("credential", "delete", "warehouse_db")
    assert [r["name"] for r in ft.json("credential", "list")] == ["echo_api"]
    again = ft("credential", "delete", "warehouse_db")
    assert again.returncode == 2 and "warehouse_db" in again.stderr, describe(again)

    bad = ft("credential", "set", "broken", "--json", "{not json")
    assert bad.returncode == 2, describe(bad)
    assert [r["name"] for r in ft.json("credential", "list")] == ["echo_api"]


def test_credential_body_from_a_missing_file_is_invalid(ft: Flowtide, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-body.json"
    proc = ft("credential", "set", "ghost", "--json", f"@{missing}")
    assert "Traceback" not in proc.stderr and str(missing) in proc.stderr
    assert proc.returncode == 2, describe(proc)


def test_password_never_appears_in_run_status_or_events(ft: Flowtide) -> None:
    body = json.dumps({"host": "db.local", "user": "app", "password": PASSWORD})
    ft.ok("credential", "set", "warehouse_db", "--json", body, "--kind", "postgres")

    # The python steps only name the alias: one prints it, the next fails with a message
    # that names it. Nothing secret is in either.
    proc = ft("run", PLAYBOOKS / "secret_alias.yaml", "--json")
    assert proc.returncode == 1, describe(proc)
    doc = json.loads(proc.stdout)
    assert doc["error"]["step"] == "connect"
    assert "could not reach the database behind credential warehouse_db" in doc["error"]["message"]
    eid = doc["execution_id"]

    events = ft("events", eid, "--json")
    status_json = ft("status", eid, "--json")
    status_text = ft("status", eid)
    events_text = ft("events", eid)
    outputs = [proc, events, status_json, status_text, events_text]
    assert [p.returncode for p in outputs] == [1, 0, 0, 0, 0]
    for p in outputs:
        assert PASSWORD not in p.stdout and PASSWORD not in p.stderr
    # the printed alias did reach the event log: the check above looked at real output
    assert "connecting with credential warehouse_db" in events.stdout
    assert PASSWORD.encode() not in stored_bytes(ft.home)


class _EchoAuth(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        header = self.headers.get("Authorization", "")
        type(self).seen.append(header)
        body = json.dumps({"authorization": header}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def echo_server() -> Iterator[str]:
    """A loopback HTTP server that echoes the Authorization header it received."""
    _EchoAuth.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoAuth)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/echo"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_secret_echoed_back_by_a_server_is_redacted(ft: Flowtide, echo_server: str) -> None:
    ft.ok("credential", "set", "echo_api", "--json", json.dumps({"type": "bearer", "token": TOKEN}))
    proc = ft("run", PLAYBOOKS / "http_auth.yaml", "--json", "--set", f"url={echo_server}")
    assert proc.returncode == 0, describe(proc)
    # the request really carried the token ...
    assert _EchoAuth.seen == [f"Bearer {TOKEN}"]
    doc = json.loads(proc.stdout)
    # ... but the recorded result has it scrubbed
    assert doc["result"]["data"] == {"authorization": "Bearer ***"}
    eid = doc["execution_id"]
    for p in (proc, ft("events", eid, "--json"), ft("status", eid, "--json")):
        assert TOKEN not in p.stdout and TOKEN not in p.stderr
    assert TOKEN.encode() not in stored_bytes(ft.home)


def _vault(home: Path, db: str | None = None) -> Any:
    from flowtide.credentials import CredentialVault
    from flowtide.store.postgres import PostgresStore
    from flowtide.store.sqlite import SQLiteStore

    store = PostgresStore(db) if db else SQLiteStore(home / "flowtide.db")
    return store, CredentialVault(store, home)


def test_rotate_key_reseals_every_credential_and_retires_the_old_key(
    ft: Flowtide, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cryptography.fernet import InvalidToken

    monkeypatch.delenv("FLOWTIDE_MASTER_KEY", raising=False)
    body = {"host": "db.local", "user": "app", "password": PASSWORD}
    ft.ok("credential", "set", "warehouse_db", "--json", json.dumps(body))
    ft.ok("credential", "set", "echo_api", "--json", json.dumps({"token": TOKEN}))
    key_file = ft.home / "master.key"
    old = key_file.read_bytes().strip()

    out = ft.ok("credential", "rotate-key")
    assert "2 sealed values re-encrypted" in out.stdout and "--retire" in out.stdout
    new, kept = key_file.read_bytes().split()
    assert kept == old and new != old and new not in out.stdout.encode()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    store, vault = _vault(ft.home)
    try:
        # Every value is sealed with the new key already; the old one only decrypts.
        _, ciphertext = store.get_credential("warehouse_db")
        assert json.loads(Fernet(new).decrypt(bytes(ciphertext))) == body
        assert vault.resolve("echo_api") == {"token": TOKEN}
    finally:
        store.close()

    retired = ft.ok("credential", "rotate-key", "--retire")
    assert "1 key(s)" in retired.stdout
    assert key_file.read_bytes().strip() == new
    store, vault = _vault(ft.home)
    try:
        assert vault.resolve("warehouse_db") == body
        # The old key opens nothing any more.
        _, ciphertext = store.get_credential("warehouse_db")
        with pytest.raises(InvalidToken):
            Fernet(old).decrypt(bytes(ciphertext))
    finally:
        store.close()


def test_rotate_key_from_the_environment_writes_the_new_keys_to_a_file(
    ft: Flowtide, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = Fernet.generate_key().decode()
    env = {**ft.env, "FLOWTIDE_MASTER_KEY": old}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ft.command(*args), env=env, cwd=ft.cwd, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    body = {"token": TOKEN}
    cli("credential", "set", "api", "--json", json.dumps(body))
    rotated = cli("credential", "rotate-key")
    new_file = ft.home / "master.key.new"
    keys = new_file.read_text().split()
    assert keys[1] == old and keys[0] not in rotated.stdout
    assert "FLOWTIDE_MASTER_KEY" in rotated.stdout
    assert stat.S_IMODE(new_file.stat().st_mode) == 0o600
    env["FLOWTIDE_MASTER_KEY"] = ",".join(keys)
    cli("credential", "rotate-key", "--retire")
    assert new_file.read_text().split() == keys[:1]
    monkeypatch.setenv("FLOWTIDE_MASTER_KEY", keys[0])
    store, vault = _vault(ft.home)
    try:
        assert vault.resolve("api") == body
    finally:
        store.close()


def test_rotate_key_covers_the_keychain_and_sealed_events_on_postgres(
    ft: Flowtide, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from flowtide.engine.events import Event

    monkeypatch.setenv("FLOWTIDE_MASTER_KEY", Fernet.generate_key().decode())
    store, vault = _vault(ft.home, pg_database)
    try:
        vault.set("pg_cred", {"password": PASSWORD})
        store.register_playbook("p/kc", "metadata: {path: p/kc}", source_file=None, created=0.0)
        sealed = vault._cipher().encrypt(b'{"token": "kc-secret"}')
        store.put_keychain(
            "p/kc",
            1,
            "tok",
            scope="global",
            execution_id=None,
            kind="bearer",
            ciphertext=sealed,
            expires=None,
            now=time.time(),
        )
        # An event holding a secret is sealed at rest (flowtide.sealing).
        store.create_execution(
            7,
            playbook_path="p/kc",
            playbook_version=1,
            playbook_file=None,
            playbook_text="metadata: {path: p/kc}",
            workload={},
            created=time.time(),
        )
        event = Event(
            event_id=70,
            execution_id=7,
            type="call.done",
            step="s",
            payload={"result": {"echo": PASSWORD}},
            time=time.time(),
        )
        store.append([event], secrets={7: {PASSWORD}})
        with psycopg.connect(pg_database) as conn:
            raw = conn.execute("SELECT payload FROM event WHERE event_id = 70").fetchone()[0]
        assert raw.startswith('{"$sealed":"') and PASSWORD not in raw

        new_file = ft.home / "next.key"
        done = vault.rotate_key(new_file)
        # As every process would be told: the new keys (new first, old after).
        monkeypatch.setenv("FLOWTIDE_MASTER_KEY", ",".join(new_file.read_text().split()))
        retired = vault.rotate_key(new_file, retire=True)
        assert done.resealed == retired.resealed == 3
        fresh = Fernet(new_file.read_bytes().strip())
        row = store.get_keychain("p/kc", 1, "tok", scope="global", execution_id=None, now=0)
        assert fresh.decrypt(bytes(row.ciphertext)) == b'{"token": "kc-secret"}'
        monkeypatch.setenv("FLOWTIDE_MASTER_KEY", new_file.read_text().strip())
        other, reader = _vault(ft.home, pg_database)
        try:
            assert reader.resolve("pg_cred") == {"password": PASSWORD}
            (got,) = other.events(7)
            assert got.payload == {"result": {"echo": PASSWORD}}
        finally:
            other.close()
    finally:
        store.close()
