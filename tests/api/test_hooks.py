"""Webhooks on the embedded app (`flowtide ui`'s, in process): a signed delivery starts
one run whose workload is the body; a bad, missing or stale signature and an unknown name
are the same 401 and start nothing; a delivery id starts one run however often it comes;
over the rate, 429 with Retry-After; a body over the cap, 413; the secret is never shown,
never stored in the clear, never in an event."""

from __future__ import annotations

import json
import sqlite3
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowtide.store.sqlite import SQLiteStore
from flowtide.triggers.hooks import sign
from flowtide.ui.local import create_local_app
from flowtide.web.hooks import HookDesk

with warnings.catch_warnings():
    # starlette's TestClient would rather have httpx2; httpx is what the project uses.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

SECRET = b"s3cr3t-hook-key-5c1f0e"
HOST = "127.0.0.1:9"

ECHO = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: hook_echo, path: tests/hooks/echo}
workload: {body: null, delivery: null, headers: {}}
workflow:
  - step: start
    tool:
      kind: python
      code: "result = {'got': body, 'delivery': delivery, 'headers': headers}"
      input: {body: "{{ body }}", delivery: "{{ delivery }}", headers: "{{ headers }}"}
"""


class Clock:
    def __init__(self) -> None:
        self.wall = time.time()
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(tmp_path: Path, clock: Clock) -> Iterator[tuple[TestClient, SQLiteStore]]:
    store = SQLiteStore(tmp_path / "flowtide.db")
    app = create_local_app(store, secret="tok", hosts=[HOST], home=tmp_path, prewarm=0)
    app.state.hooks = HookDesk(clock=lambda: clock.wall, monotonic=lambda: clock.mono)
    client = TestClient(app, base_url=f"http://{HOST}")
    with client:
        client.headers["authorization"] = "Bearer tok"
        r = client.post("/api/catalog/register", json={"content": ECHO})
        assert r.status_code in (200, 201), r.text
        r = client.post(
            "/api/hooks",
            json={"name": "gh", "playbook": "tests/hooks/echo", "secret": SECRET.decode()},
        )
        assert r.status_code == 201, r.text
        yield client, store
    store.close()


def _deliver(
    client: TestClient,
    body: bytes,
    *,
    name: str = "gh",
    secret: bytes = SECRET,
    headers: dict[str, str] | None = None,
    timestamp: int | None = None,
    signature: str | None = "auto",
) -> Any:
    sent = {"content-type": "application/json", **(headers or {})}
    if signature == "auto":
        signature = sign(secret, body, timestamp)
    if signature is not None:
        sent["X-Flowtide-Signature"] = signature
    if timestamp is not None:
        sent["X-Flowtide-Timestamp"] = str(timestamp)
    # Public: no token (the client's default header is dropped).
    return client.post(f"/api/hooks/{name}", content=body, headers={**sent, "authorization": ""})


def _executions(client: TestClient) -> list[dict[str, Any]]:
    return list(client.get("/api/executions", params={"limit": 100}).json()["items"])


def _wait(client: TestClient, eid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        doc = client.get(f"/api/executions/{eid}").json()
        if doc["status"] in ("completed", "failed", "cancelled"):
            return dict(doc)
        time.sleep(0.05)
    raise AssertionError(f"execution {eid} did not end")


def test_a_signed_delivery_runs_the_playbook_with_the_body(
    app: tuple[TestClient, SQLiteStore],
) -> None:
    client, _ = app
    body = json.dumps({"action": "opened", "number": 7}).encode()
    r = _deliver(client, body, headers={"X-GitHub-Event": "pull_request"})
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "running"
    doc = _wait(client, r.json()["execution_id"])
    assert doc["status"] == "completed", doc
    assert doc["result"]["got"] == {"action": "opened", "number": 7}
    assert doc["result"]["headers"]["x-github-event"] == "pull_request"
    assert "x-flowtide-signature" not in doc["result"]["headers"]
    assert doc["trigger"]["kind"] == "hook" and doc["trigger"]["name"] == "gh"


def test_a_timestamped_delivery_and_github_headers(
    app: tuple[TestClient, SQLiteStore], clock: Clock
) -> None:
    client, _ = app
    body = b'{"zen": "ok"}'
    stamp = int(clock.wall) - 60
    r = _deliver(client, body, timestamp=stamp)
    assert r.status_code == 202, r.text
    # GitHub's header names (and a delivery id) work too.
    r = client.post(
        "/api/hooks/gh",
        content=body,
        headers={
            "content-type": "application/json",
            "X-Hub-Signature-256": sign(SECRET, body),
            "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            "authorization": "",
        },
    )
    assert r.status_code == 202, r.text
    assert r.json()["delivery"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958"


def test_unsigned_badly_signed_stale_or_unknown_is_401_and_starts_nothing(
    app: tuple[TestClient, SQLiteStore], clock: Clock
) -> None:
    client, _ = app
    body = b'{"x": 1}'
    refused = [
        _deliver(client, body, signature=None),
        _deliver(client, body, secret=b"another secret"),
        _deliver(client, body, signature="sha256=" + "0" * 64),
        _deliver(client, body, signature="md5=abc"),
        # Signed for another body.
        _deliver(client, body, signature=sign(SECRET, b'{"x": 2}')),
        # Signed, but outside the replay window (either way), or the timestamp dropped.
        _deliver(client, body, timestamp=int(clock.wall) - 301),
        _deliver(client, body, timestamp=int(clock.wall) + 301),
        _deliver(client, body, signature=sign(SECRET, body, int(clock.wall))),
    ]
    for r in refused:
        assert r.status_code == 401, r.text
        assert "www-authenticate" not in r.headers
    assert "stale timestamp" in refused[5].json()["error"]["message"]
    # An unknown name answers as a bad signature does: names cannot be probed.
    unknown = _deliver(client, body, name="nope")
    bad = _deliver(client, body, secret=b"another secret")
    assert unknown.status_code == bad.status_code == 401
    assert unknown.json() == bad.json()
    assert _deliver(client, body, name="nope", signature=None).json() == refused[0].json()
    assert _executions(client) == []
    # The hook's page lists the refusals, with why.
    page = client.get("/api/hooks/gh").json()
    whys = [r["why"] for r in page["refused"]]
    assert len(whys) == len(refused) + 1  # the unknown name keeps nothing
    assert any("no signature" in w for w in whys) and any("stale" in w for w in whys)
    assert page["deliveries"] == []


def test_a_delivery_id_starts_one_run(app: tuple[TestClient, SQLiteStore]) -> None:
    client, _ = app
    body = b'{"n": 1}'
    first = _deliver(client, body, headers={"X-Flowtide-Delivery": "d-1"})
    again = _deliver(client, body, headers={"X-Flowtide-Delivery": "d-1"})
    assert first.status_code == 202, first.text
    assert again.status_code == 200, again.text
    assert again.json()["execution_id"] == first.json()["execution_id"]
    assert again.json()["status"] == "duplicate"
    assert len(_executions(client)) == 1
    # Without an id, every delivery is a run.
    assert _deliver(client, body).status_code == 202
    assert _deliver(client, body).status_code == 202
    assert len(_executions(client)) == 3
    # Past the dedup window, the id is a new delivery (once, however often sent). The
    # firings are stamped by the store's clock: a short window, really waited.
    desk = client.app.state.hooks  # type: ignore[attr-defined]
    desk.dedup_window, desk.clock = 0.3, time.time
    time.sleep(0.4)
    later = _deliver(client, body, headers={"X-Flowtide-Delivery": "d-1"})
    assert later.status_code == 202, later.text
    assert later.json()["execution_id"] != first.json()["execution_id"]
    assert _deliver(client, body, headers={"X-Flowtide-Delivery": "d-1"}).status_code == 200
    assert len(_executions(client)) == 4
    page = client.get("/api/hooks/gh").json()
    assert {d["delivery"] for d in page["deliveries"]} >= {"d-1", "d-1#2"}
    for eid in {e["execution_id"] for e in _executions(client)}:
        _wait(client, eid)


def test_over_the_rate_is_429_with_retry_after(
    app: tuple[TestClient, SQLiteStore], clock: Clock
) -> None:
    client, _ = app
    r = client.post(
        "/api/hooks",
        json={
            "name": "slow",
            "playbook": "tests/hooks/echo",
            "secret": SECRET.decode(),
            "rate": "2/s",
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["rate"] == 2.0
    codes = [_deliver(client, b"{}", name="slow").status_code for _ in range(3)]
    assert codes == [202, 202, 429]
    over = _deliver(client, b"{}", name="slow")
    assert over.status_code == 429
    assert over.headers["retry-after"] == "1"
    clock.advance(0.5)  # one more token
    assert _deliver(client, b"{}", name="slow").status_code == 202
    assert _deliver(client, b"{}", name="slow").status_code == 429
    assert len(_executions(client)) == 3
    for e in _executions(client):
        _wait(client, e["execution_id"])


def test_a_body_over_the_cap_is_413(app: tuple[TestClient, SQLiteStore]) -> None:
    client, _ = app
    body = b'{"blob": "' + b"x" * (17 * 1024 * 1024) + b'"}'
    r = _deliver(client, body)
    assert r.status_code == 413, r.text[:300]
    assert _executions(client) == []


def test_form_and_text_bodies_and_a_workload_template(
    app: tuple[TestClient, SQLiteStore],
) -> None:
    client, _ = app
    r = _deliver(
        client,
        b"a=1&b=two&b=three",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 202, r.text
    assert _wait(client, r.json()["execution_id"])["result"]["got"] == {
        "a": "1",
        "b": ["two", "three"],
    }
    r = _deliver(client, b"plain words", headers={"content-type": "text/plain"})
    assert _wait(client, r.json()["execution_id"])["result"]["got"] == "plain words"
    r = client.post(
        "/api/hooks",
        json={
            "name": "mapped",
            "playbook": "tests/hooks/echo",
            "secret": SECRET.decode(),
            "workload": {"body": "{{ hook.body.repo }}", "delivery": "{{ hook.delivery }}"},
        },
    )
    assert r.status_code == 201, r.text
    r = _deliver(
        client, b'{"repo": "flowtide"}', name="mapped", headers={"X-Flowtide-Delivery": "m-1"}
    )
    doc = _wait(client, r.json()["execution_id"])
    assert doc["result"]["got"] == "flowtide" and doc["result"]["delivery"] == "m-1"
    assert _deliver(client, b"{not json", name="mapped").status_code == 400


def test_the_secret_is_never_shown_nor_stored_in_the_clear(
    app: tuple[TestClient, SQLiteStore], tmp_path: Path
) -> None:
    client, store = app
    r = _deliver(client, b'{"k": 1}', headers={"X-Flowtide-Delivery": "s-1"})
    eid = r.json()["execution_id"]
    _wait(client, eid)
    shown = [
        client.get("/api/hooks").text,
        client.get("/api/hooks/gh").text,
        client.get(f"/api/executions/{eid}").text,
        client.get(f"/api/executions/{eid}/events").text,
    ]
    for text in shown:
        assert SECRET.decode() not in text
    item = client.get("/api/hooks/gh").json()
    assert "secret" not in item
    # At rest: no table holds the secret's bytes (it is a Fernet token of the master key).
    db = sqlite3.connect(tmp_path / "flowtide.db")
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in db.execute(f"SELECT * FROM {table}"):  # noqa: S608 - test's own names
                for value in row:
                    raw = value if isinstance(value, bytes) else str(value).encode()
                    assert SECRET not in raw, table
        sealed = db.execute("SELECT secret FROM trigger_def WHERE name = 'gh'").fetchone()[0]
        assert sealed and SECRET not in bytes(sealed)
    finally:
        db.close()


def test_management_routes(app: tuple[TestClient, SQLiteStore]) -> None:
    client, _ = app
    assert [h["name"] for h in client.get("/api/hooks").json()["items"]] == ["gh"]
    # Exactly one of secret and secret_credential.
    r = client.post("/api/hooks", json={"name": "x", "playbook": "tests/hooks/echo"})
    assert r.status_code == 422
    r = client.post(
        "/api/hooks",
        json={"name": "x", "playbook": "no/such/path", "secret": "abc"},
    )
    assert r.status_code == 404
    r = client.post(
        "/api/hooks",
        json={"name": "x", "playbook": "tests/hooks/echo", "secret_credential": "missing"},
    )
    assert r.status_code == 404
    # Without a token, managing hooks is refused; a delivery's path is public for POST only.
    anon = {"authorization": ""}
    assert client.get("/api/hooks", headers=anon).status_code == 401
    assert client.get("/api/hooks/gh", headers=anon).status_code == 401
    assert client.delete("/api/hooks/gh", headers=anon).status_code == 401
    assert client.delete("/api/hooks/gh").status_code == 200
    assert client.get("/api/hooks/gh").status_code == 404
    assert _deliver(client, b"{}").status_code == 401


def test_a_delivery_may_come_under_another_host_name(app: tuple[TestClient, SQLiteStore]) -> None:
    """Through a tunnel: the delivery is admitted by its signature; nothing else is."""
    client, _ = app
    body = b'{"via": "tunnel"}'
    headers = {
        "content-type": "application/json",
        "X-Flowtide-Signature": sign(SECRET, body),
        "host": "hooks.example.com",
        "authorization": "",
    }
    r = client.post("/api/hooks/gh", content=body, headers=headers)
    assert r.status_code == 202, r.text
    _wait(client, r.json()["execution_id"])
    assert client.get("/api/hooks/gh", headers={"host": "hooks.example.com"}).status_code == 403


def test_a_large_body_is_checked_and_parsed_off_the_event_loop(
    app: tuple[TestClient, SQLiteStore],
) -> None:
    client, _ = app
    value = {"rows": ["r" * 100] * 5000}  # ~0.5 MB: hashed and parsed in a thread
    body = json.dumps(value).encode()
    assert _deliver(client, body, secret=b"wrong").status_code == 401
    r = _deliver(client, body)
    assert r.status_code == 202, r.text
    assert _wait(client, r.json()["execution_id"])["result"]["got"] == value
