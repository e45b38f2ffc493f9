"""How a server authenticates, from its start: it refuses to run with no way in; the first
admin token comes from the database (`flowtide token create --db`); JWTs of an identity
provider (a JWKS served on loopback) map to roles; --insecure-no-auth says so."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from flowtide.auth.oidc import JwtSettings, JwtVerifier, parse_role_map
from flowtide.errors import AuthError, FlowtideError

from .stack import Stack, _free_port, flowtide_env


def _cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


class _Server:
    """A server of its own on `db`, with the stack's NATS (as its server user)."""

    def __init__(self, stack: Stack, db: str, root: Path, *extra: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / f"server-{self.port}.log"
        args = ["server", "--db", db, "--nats", stack.nats, "--port", str(self.port), *extra]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flowtide.cli", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=flowtide_env(root / "home") | stack.nats_env("server"),
            )

    def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(self.log.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


@pytest.fixture
def fresh_db(pg_server: Any) -> Iterator[str]:
    name = f"auth_{_free_port()}"
    yield pg_server.create_database(name)
    pg_server.drop_database(name)


class _Jwks:
    """An identity provider's JWKS endpoint on loopback, and tokens it signs."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        body = json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]})

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, key: Any = None, **claims: Any) -> str:
        now = int(time.time())
        doc = {"iss": "https://idp.test", "sub": "alice", "exp": now + 300, "iat": now, **claims}
        return jwt.encode(doc, key or self.key, algorithm="RS256", headers={"kid": "k1"})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def idp() -> Iterator[_Jwks]:
    provider = _Jwks()
    yield provider
    provider.close()


def test_a_server_with_no_way_in_refuses_to_start_until_an_admin_token_exists(
    stack: Stack, fresh_db: str, tmp_path: Path
) -> None:
    server = _Server(stack, fresh_db, tmp_path)
    assert server.proc.wait(timeout=60) == 2
    log = server.log.read_text()
    assert "no active API token" in log and "flowtide token create --role admin --db" in log
    password = fresh_db.split(":")[2].split("@")[0]
    assert password not in log

    env = flowtide_env(tmp_path / "home")
    made = _cli("token", "create", "--role", "admin", "--name", "first", "--db", fresh_db, env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("ftk_") and "shown this once" in made.stderr
    listed = _cli("token", "list", "--db", fresh_db, "--json", env=env)
    assert listed.returncode == 0 and token not in listed.stdout
    assert [t["name"] for t in json.loads(listed.stdout)] == ["first"]
    bad = _cli("token", "create", "--role", "root", "--db", fresh_db, env=env)
    assert bad.returncode == 2 and "role" in bad.stderr

    server = _Server(stack, fresh_db, tmp_path)
    try:
        server.ready()
        headers = {"authorization": f"Bearer {token}"}
        assert httpx.get(f"{server.url}/api/executions", timeout=30).status_code == 401
        r = httpx.get(f"{server.url}/api/executions", headers=headers, timeout=30)
        assert r.status_code == 200
        # Through the server, with the admin token from the environment.
        env_admin = {**env, "FLOWTIDE_TOKEN": token}
        reader = _cli("token", "create", "--role", "reader", "--server", server.url, env=env_admin)
        assert reader.returncode == 0, reader.stderr
        anonymous = _cli("token", "list", "--server", server.url, env=env)
        assert anonymous.returncode == 2 and "FLOWTIDE_TOKEN" in anonymous.stderr
        with httpx.Client(base_url=server.url, timeout=30) as browser:
            assert browser.post("/api/session", json={"token": token}).status_code == 200
            assert browser.get("/api/whoami").json()["role"] == "admin"
            # Revoked in the database (not through this server): its session ends too.
            revoked = _cli("token", "revoke", "first", "--db", fresh_db, env=env)
            assert revoked.returncode == 0, revoked.stderr
            deadline = time.monotonic() + 5  # a server caches a session for 2 s
            while browser.get("/api/whoami").status_code != 401:
                assert time.monotonic() < deadline, "the session outlived its token"
                time.sleep(0.2)
        with psycopg.connect(fresh_db) as conn:
            assert conn.execute("SELECT count(*) FROM ui_session").fetchone() == (0,)
    finally:
        server.stop()


def test_jwts_of_the_identity_provider_map_to_roles(
    stack: Stack, fresh_db: str, tmp_path: Path, idp: _Jwks
) -> None:
    server = _Server(
        stack,
        fresh_db,
        tmp_path,
        "--jwks-url",
        idp.url,
        "--jwt-issuer",
        "https://idp.test",
        "--jwt-roles-claim",
        "groups",
        "--jwt-role",
        "data-team=operator",
        "--jwt-role",
        "auditors=reader",
    )
    try:
        server.ready()

        def get(token: str, path: str = "/api/whoami") -> httpx.Response:
            headers = {"authorization": f"Bearer {token}"}
            return httpx.get(f"{server.url}{path}", headers=headers, timeout=30)

        operator = idp.token(groups=["staff", "data-team"], preferred_username="alice")
        assert get(operator).json() == {
            "name": "alice",
            "role": "operator",
            "pool": None,
            "subject": "jwt:https://idp.test:alice",
        }
        auditor = idp.token(groups="auditors")
        assert get(auditor, "/api/executions").status_code == 200
        r = httpx.post(
            f"{server.url}/api/execute",
            json={"playbook": "x"},
            headers={"authorization": f"Bearer {auditor}"},
            timeout=30,
        )
        assert r.status_code == 403
        assert get(idp.token(groups=["staff"])).status_code == 403  # no role mapped
        assert get(idp.token(groups="data-team", exp=int(time.time()) - 600)).status_code == 401
        assert get(idp.token(groups="data-team", iss="https://evil.test")).status_code == 401
        forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        assert get(idp.token(key=forger, groups="data-team")).status_code == 401
        # A browser signed in with a JWT: its session ends when the JWT would have.
        with httpx.Client(base_url=server.url, timeout=30) as browser:
            assert browser.post("/api/session", json={"token": operator}).status_code == 200
            assert browser.get("/api/whoami").json()["role"] == "operator"
        exp = jwt.decode(operator, options={"verify_signature": False})["exp"]
        with psycopg.connect(fresh_db) as conn:
            row = conn.execute("SELECT token_id, expires, role FROM ui_session").fetchone()
        assert row == (None, float(exp), "operator")
    finally:
        server.stop()


def test_insecure_no_auth_serves_everyone_and_says_so(
    stack: Stack, fresh_db: str, tmp_path: Path
) -> None:
    server = _Server(stack, fresh_db, tmp_path, "--insecure-no-auth")
    try:
        server.ready()
        assert httpx.get(f"{server.url}/api/executions", timeout=30).status_code == 200
        assert "AUTHENTICATION IS OFF" in server.log.read_text()
        # The UI still signs in (anyone is everyone here).
        with httpx.Client(base_url=server.url, timeout=30) as browser:
            assert browser.post("/api/session", json={"token": "anything"}).status_code == 200
            assert browser.get("/api/whoami").json()["name"] == "anonymous"
    finally:
        server.stop()


def test_the_verifier_maps_claims_and_refuses_what_it_cannot_map(idp: _Jwks) -> None:
    verifier = JwtVerifier(
        JwtSettings(jwks_url=idp.url, audience="flowtide", role_map=parse_role_map("ops=admin"))
    )
    admin = verifier.verify(idp.token(aud="flowtide", flowtide_roles=["ops"]))
    assert (admin.role, admin.pool) == ("admin", None)
    with pytest.raises(AuthError) as refused:
        verifier.verify(idp.token(aud="other", flowtide_roles=["ops"]))
    assert refused.value.status == 401
    plain = JwtVerifier(JwtSettings(jwks_url=idp.url))
    worker = plain.verify(idp.token(flowtide_roles="worker", flowtide_pool="gpu"))
    assert (worker.role, worker.pool) == ("worker", "gpu")
    # A person's role wins over worker; a bad pool name is refused.
    assert plain.verify(idp.token(flowtide_roles=["worker", "reader"])).role == "reader"
    with pytest.raises(AuthError) as bad_pool:
        plain.verify(idp.token(flowtide_roles="worker", flowtide_pool="no pool!"))
    assert bad_pool.value.status == 403
    with pytest.raises(FlowtideError):
        parse_role_map("ops=root")
