"""The web UI's sessions on the embedded app (`flowtide ui`'s, in process: the same
session router and Gate the server mounts): the cookie carries a random session id, never
the token; signing out ends the session (the same cookie is then refused); a session
ends after its idle time and its lifetime (an injected clock, no sleeps); a worker's
token cannot sign in; a token put in the cookie is refused; the CSRF header is still
required of a cookie."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowtide.auth.oidc import jwt_expiry
from flowtide.auth.principal import Principal
from flowtide.auth.sessions import (
    MemorySessions,
    Session,
    SessionPolicy,
    Sessions,
    session_digest,
)
from flowtide.errors import AuthError
from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.local import LocalAuthenticator, create_local_app
from flowtide.web.access import SESSION_COOKIE, Authenticator

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

HOST = "127.0.0.1:9"
TOKEN = "local-secret-token-0123456789"
CSRF = {"x-flowtide-csrf": "1"}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app_and_auth(tmp_path: Path, clock: Clock) -> Iterator[tuple[TestClient, LocalAuthenticator]]:
    store = SQLiteStore(tmp_path / "flowtide.db")
    app = create_local_app(
        store, secret=TOKEN, hosts=[HOST], home=tmp_path, prewarm=0, scheduler=False
    )
    auth = app.state.authenticator()
    # No cache, so each request asks the store; the clock is the test's.
    auth.sessions = Sessions(policy=SessionPolicy(lifetime=100.0, idle=10.0), ttl=0, clock=clock)
    with TestClient(app, base_url=f"http://{HOST}") as client:
        yield client, auth
    store.close()


def _sign_in(client: TestClient, token: str = TOKEN) -> str:
    r = client.post("/api/session", json={"token": token})
    assert r.status_code == 200, r.text
    assert r.json()["role"] == "admin"
    return str(client.cookies[SESSION_COOKIE])


def _as_cookie(client: TestClient, value: str, path: str = "/api/whoami") -> int:
    """The status of a GET with only this cookie (no bearer header)."""
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, value)
    return client.get(path).status_code


def test_the_cookie_is_a_session_id_not_the_token(
    app_and_auth: tuple[TestClient, LocalAuthenticator],
) -> None:
    client, auth = app_and_auth
    r = client.post("/api/session", json={"token": TOKEN})
    assert r.status_code == 200
    cookie = r.headers["set-cookie"]
    flags = {p.strip().split("=")[0].lower() for p in cookie.split(";")}
    assert {"httponly", "path", "max-age", "samesite"} <= flags
    assert "samesite=strict" in cookie.lower() and "path=/" in cookie.lower()
    assert "max-age=100" in cookie.lower()  # the session's lifetime
    assert "secure" not in flags  # plain HTTP
    session_id = client.cookies[SESSION_COOKIE]
    assert TOKEN not in cookie and session_id != TOKEN and len(session_id) == 43
    # The store keeps the hash only.
    assert isinstance(auth.sessions.store, MemorySessions)
    assert list(auth.sessions.store._rows) == [session_digest(session_id)]
    assert client.get("/api/whoami").json()["role"] == "admin"
    # Two sign-ins, two sessions.
    assert _sign_in(client) != session_id


def test_a_token_in_the_cookie_is_refused(
    app_and_auth: tuple[TestClient, LocalAuthenticator],
) -> None:
    client, _ = app_and_auth
    assert _as_cookie(client, TOKEN) == 401
    assert _as_cookie(client, "not-a-session") == 401
    assert _as_cookie(client, "x" * 5000) == 401
    # The token still works where tokens go.
    client.cookies.clear()
    r = client.get("/api/whoami", headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200


def test_signing_out_ends_the_session(
    app_and_auth: tuple[TestClient, LocalAuthenticator],
) -> None:
    client, auth = app_and_auth
    session_id = _sign_in(client)
    other = _sign_in(client)
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, session_id)
    out = client.delete("/api/session")
    assert out.status_code == 200 and "max-age=0" in out.headers["set-cookie"].lower()
    # A copy of the cookie kept elsewhere is worth nothing now.
    assert _as_cookie(client, session_id) == 401
    assert _as_cookie(client, other) == 200  # another sign-in is its own
    assert len(auth.sessions.store._rows) == 1  # type: ignore[attr-defined]
    # Signing out without a session, or twice, is harmless.
    client.cookies.clear()
    assert client.delete("/api/session").status_code == 200
    client.cookies.set(SESSION_COOKIE, session_id)
    assert client.delete("/api/session").status_code == 200


def test_a_session_ends_when_idle_and_at_its_lifetime(
    app_and_auth: tuple[TestClient, LocalAuthenticator], clock: Clock
) -> None:
    client, _ = app_and_auth
    idle = _sign_in(client)
    busy = _sign_in(client)
    clock.now += 9
    assert _as_cookie(client, busy) == 200  # seen at +9
    clock.now += 9  # +18: idle for 18 s, busy for 9
    assert _as_cookie(client, idle) == 401
    assert _as_cookie(client, busy) == 200
    # Active all along, it still ends at its lifetime (100 s).
    while clock.now + 8 < 1_000_000.0 + 100:
        clock.now += 8
        assert _as_cookie(client, busy) == 200
    clock.now = 1_000_000.0 + 100
    assert _as_cookie(client, busy) == 401


def test_a_cookie_needs_the_csrf_header_to_change_anything(
    app_and_auth: tuple[TestClient, LocalAuthenticator],
) -> None:
    client, _ = app_and_auth
    _sign_in(client)
    r = client.post("/api/executions/123/cancel", json={"reason": "forged"})
    assert r.status_code == 403 and "x-flowtide-csrf" in r.json()["error"]["message"]
    r = client.post("/api/executions/123/cancel", json={"reason": "ui"}, headers=CSRF)
    assert r.status_code == 404  # past the gate and the rule
    assert client.get("/api/executions").status_code == 200  # reading needs no header


def test_a_workers_token_cannot_sign_in(
    app_and_auth: tuple[TestClient, LocalAuthenticator],
) -> None:
    client, auth = app_and_auth
    worker = Principal("tok123", "w1", "worker", "default")

    async def as_worker(header: str | None) -> Principal:
        return worker

    auth.authenticate = as_worker  # type: ignore[method-assign]
    r = client.post("/api/session", json={"token": "ftk_whatever"})
    assert r.status_code == 403 and "worker" in r.json()["error"]["message"]
    assert "set-cookie" not in r.headers
    assert not auth.sessions.store._rows  # type: ignore[attr-defined]


def test_bad_sign_in_sets_no_cookie(app_and_auth: tuple[TestClient, LocalAuthenticator]) -> None:
    client, _ = app_and_auth
    r = client.post("/api/session", json={"token": "wrong"})
    assert r.status_code == 401 and "set-cookie" not in r.headers


def _jwt(claims: dict[str, object]) -> str:
    def part(doc: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


def test_a_jwts_session_ends_with_the_jwt_and_a_tokens_names_its_token() -> None:
    assert jwt_expiry(_jwt({"exp": 1234, "sub": "a"})) == 1234.0
    assert jwt_expiry(_jwt({"sub": "a"})) is None
    assert jwt_expiry("a.%%%.b") is None
    clock = Clock()
    store = MemorySessions()
    sessions = Sessions(store, policy=SessionPolicy(lifetime=3600, idle=600), clock=clock)

    class Tokens:  # only its presence matters: a token's principal names its token
        pass

    auth = Authenticator(Tokens(), sessions=sessions)  # type: ignore[arg-type]
    person = Principal("jwt:iss:alice", "alice", "reader")
    sid, lifetime = asyncio.run(auth.open_session(person, _jwt({"exp": clock.now + 60})))
    assert lifetime == 60
    [kept] = store._rows.values()
    assert kept.token_id is None and kept.expires == clock.now + 60
    sid, lifetime = asyncio.run(
        auth.open_session(Principal("abcdefghijkl", "ci", "operator"), "ftk_x")
    )
    assert lifetime == 3600 and store._rows[session_digest(sid)].token_id == "abcdefghijkl"
    with pytest.raises(AuthError) as refused:
        asyncio.run(auth.open_session(Principal("t", "w", "worker"), "ftk_y"))
    assert refused.value.status == 403


def test_the_cache_keeps_no_session_past_its_end() -> None:
    clock = Clock()
    store = MemorySessions(max_sessions=2)
    sessions = Sessions(store, policy=SessionPolicy(lifetime=50, idle=20), ttl=3600, clock=clock)
    person = Principal("s", "bob", "reader")
    sid, _ = asyncio.run(sessions.open(person, None))
    assert asyncio.run(sessions.resume(sid)) == person  # cached now, for an hour
    clock.now += 21
    with pytest.raises(AuthError):
        asyncio.run(sessions.resume(sid))
    # Signing out forgets the cached session at once.
    sid, _ = asyncio.run(sessions.open(person, "tok"))
    assert asyncio.run(sessions.resume(sid)) == person
    asyncio.run(sessions.close(sid))
    with pytest.raises(AuthError):
        asyncio.run(sessions.resume(sid))
    # So does revoking its token here (the store's row is gone with the token).
    sid, _ = asyncio.run(sessions.open(person, "tok"))
    asyncio.run(sessions.resume(sid))
    store.close(session_digest(sid))
    sessions.forget_token("tok")
    with pytest.raises(AuthError):
        asyncio.run(sessions.resume(sid))
    # The memory store holds at most its cap, the oldest dropped first.
    for _ in range(3):
        asyncio.run(sessions.open(person, None))
    assert len(store._rows) == 2


def test_memory_sessions_record_activity() -> None:
    store = MemorySessions()
    policy = SessionPolicy(lifetime=1000, idle=100)
    now = time.time()
    store.open(b"k", Session(Principal("s", "n", "reader"), None, now, now + 1000, now))
    found = store.find(b"k", now + 50, policy)
    assert found is not None and found.seen == now + 50
    assert store.find(b"k", now + 149, policy) is not None  # idle from +50, not from 0
    assert store.find(b"k", now + 260, policy) is None
    assert b"k" not in store._rows
