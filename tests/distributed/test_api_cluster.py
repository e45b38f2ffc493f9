"""The cluster-scoped API on the distributed stack: catalog, credentials and keychain, and
a worker running a postgres step with a credential registered through the API. Secret
values must never come back from the API, nor reach events, logs or the database in
plaintext."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import secrets
import subprocess
import sys
import time
from typing import Any

import httpx
import psycopg
from cryptography.fernet import Fernet

from flowtide.store import pgschema

from .stack import Stack, flowtide_env
from .test_faults import _wait

HELLO = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: hello, path: {path}}}
workload: {{who: world}}
workflow:
  - step: start
    tool:
      kind: python
      input: {{who: "{{{{ who }}}}"}}
      code: "result = {{'greeting': 'hello ' + who, 'v': {v}}}"
"""

BAD_KIND = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: bad, path: tests/api/bad}
workflow:
  - step: start
    tool: {kind: pythn, code: "result = 1"}
"""

PG_QUERY = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pg_cred, path: tests/api/pg_cred}
workload: {pg_auth: dist_pg}
workflow:
  - step: query
    tool:
      kind: postgres
      auth: "{{ workload.pg_auth }}"
      command: "SELECT current_user AS who, 40 + 2 AS answer"
"""


def _client(stack: Stack) -> httpx.Client:
    return stack.client(timeout=30)


def _full_log(stack: Stack, name: str) -> str:
    # stack.log() keeps the tail only: a leak must be looked for in the whole file.
    return (stack.root / f"{name}.log").read_text(errors="replace")


def _logs(stack: Stack) -> str:
    names = ["server"] + [f"worker{i}" for i in range(len(stack.workers))]
    return "\n".join(_full_log(stack, n) for n in names)


def _fernet(stack: Stack) -> Fernet:
    # Server and workers share FLOWTIDE_HOME, so they share this key.
    return Fernet((stack.root / "home" / "master.key").read_bytes().strip())


def _stored_bytes(stack: Stack, table: str) -> bytes:
    """Every stored ciphertext of `table`, concatenated (to look for plaintext in)."""
    with psycopg.connect(stack.db) as conn:
        rows = conn.execute(f"SELECT ciphertext FROM {table}").fetchall()
    return b"".join(bytes(r[0]) for r in rows)


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["status"] == status
    return dict(body)


def _field_names(error: dict[str, Any]) -> list[str]:
    return [f["field"] for f in error.get("fields", [])]


# -- catalog ---------------------------------------------------------------------------


def test_catalog_register_list_get_and_execute_by_path(stack: Stack) -> None:
    with _client(stack) as client:
        v1 = HELLO.format(path="tests/api/hello", v=1)
        v2 = HELLO.format(path="tests/api/hello", v=2)
        r = client.post("/api/catalog/register", json={"content": v1})
        assert r.status_code == 201, r.text
        assert r.json() == {
            "path": "tests/api/hello",
            "version": 1,
            "catalog_id": "tests/api/hello@1",
            "warnings": [],
        }
        # The same text again is the same version; a change is a new one.
        again = client.post("/api/catalog/register", json={"content": v1}).json()
        assert again["version"] == 1
        r = client.post(
            "/api/catalog/register", json={"content": v2, "source_file": "flows/hello.yaml"}
        )
        assert r.json()["catalog_id"] == "tests/api/hello@2"
        other = HELLO.format(path="tests/apix/other", v=9)
        assert client.post("/api/catalog/register", json={"content": other}).status_code == 201

        items = client.get("/api/catalog/list").json()["items"]
        by_path = {i["path"]: i for i in items}
        assert by_path["tests/api/hello"] == {
            "path": "tests/api/hello",
            "version": 2,
            "versions": 2,
            "catalog_id": "tests/api/hello@2",
            "source_file": "flows/hello.yaml",
            "created": by_path["tests/api/hello"]["created"],
        }
        assert "tests/apix/other" in by_path
        # A prefix filter, literal (no wildcards) and case-sensitive.
        only = client.get("/api/catalog/list", params={"path": "tests/api/"}).json()["items"]
        assert [i["path"] for i in only] == ["tests/api/hello"]
        assert client.get("/api/catalog/list", params={"path": "tests/%"}).json()["items"] == []
        assert client.get("/api/catalog/list", params={"path": "TESTS/"}).json()["items"] == []

        latest = client.get("/api/catalog/tests/api/hello").json()
        assert (latest["version"], latest["versions"], latest["content"]) == (2, 2, v2)
        first = client.get("/api/catalog/tests/api/hello", params={"version": 1}).json()
        assert (first["catalog_id"], first["content"], first["source_file"]) == (
            "tests/api/hello@1",
            v1,
            None,
        )
        missing = _error(client.get("/api/catalog/tests/api/nothing"), 404)
        assert "tests/api/nothing" in missing["message"]
        missing = _error(client.get("/api/catalog/tests/api/hello", params={"version": 7}), 404)
        assert "tests/api/hello" in missing["message"] and "7" in missing["message"]
        bad = _error(client.get("/api/catalog/tests/api/hello", params={"version": 0}), 422)
        assert _field_names(bad) == ["query.version"]

        # POST /api/execute resolves catalog ids the same way.
        runs = {
            "catalog_id@1": {"catalog_id": "tests/api/hello@1"},
            "catalog_id": {"catalog_id": "tests/api/hello"},
            "path": {"path": "tests/api/hello"},
            "path+version": {"path": "tests/api/hello", "version": 1},
        }
        expected = {"catalog_id@1": 1, "catalog_id": 2, "path": 2, "path+version": 1}
        for label, body in runs.items():
            r = client.post("/api/execute", json={**body, "payload": {"who": label}})
            assert r.status_code == 201, r.text
            doc = _wait(client, r.json()["execution_id"])
            assert doc["status"] == "completed", doc
            assert doc["steps"]["start"]["result"] == {
                "greeting": f"hello {label}",
                "v": expected[label],
            }
        listed = client.get("/api/executions", params={"limit": 4}).json()["items"]
        assert sorted(i["version"] for i in listed) == [1, 1, 2, 2]
        assert {i["playbook"] for i in listed} == {"tests/api/hello"}
        unknown = _error(client.post("/api/execute", json={"catalog_id": "tests/api/no@1"}), 404)
        assert "tests/api/no" in unknown["message"]

        paths = client.get("/openapi.json").json()["paths"]
        for path in (
            "/api/catalog/register",
            "/api/catalog/list",
            "/api/catalog/{path}",
            "/api/credentials",
            "/api/credentials/{name}",
            "/api/keychain",
            "/api/keychain/{catalog_id}/{name}",
        ):
            assert path in paths, path


def test_register_bad_playbook_is_400_naming_file_line_and_field(stack: Stack) -> None:
    with _client(stack) as client:
        error = _error(client.post("/api/catalog/register", json={"content": BAD_KIND}), 400)
        # The CLI's message: <file>:line:column: step, field: what is wrong.
        assert error["message"].startswith("<playbook>:6:12: step 'start', field 'tool.kind':")
        assert "unknown tool kind 'pythn'" in error["message"]
        assert error["field"] == "content"
        [problem] = error["fields"]
        assert problem["field"] == "content"
        assert (problem["line"], problem["column"]) == (6, 12)
        assert (problem["step"], problem["playbook_field"]) == ("start", "tool.kind")

        named = client.post(
            "/api/catalog/register", json={"content": BAD_KIND, "source_file": "flows/bad.yaml"}
        )
        assert _error(named, 400)["message"].startswith("flows/bad.yaml:6:12:")

        syntax = _error(client.post("/api/catalog/register", json={"content": "a: ["}), 400)
        assert syntax["fields"][0]["line"] == 1 and "YAML" in syntax["message"]

        no_path = HELLO.format(path="x", v=1).replace("path: x", "title: x")
        error = _error(client.post("/api/catalog/register", json={"content": no_path}), 400)
        assert error["fields"][0]["playbook_field"] == "metadata.path"
        assert "metadata.path" in error["message"]
        for path in ("[1]", "5", "{a: b}"):
            listed = HELLO.format(path="x", v=1).replace("path: x", f"path: {path}")
            error = _error(client.post("/api/catalog/register", json={"content": listed}), 400)
            assert error["fields"][0]["playbook_field"] == "metadata.path", path
        deep = _error(client.post("/api/catalog/register", json={"content": "[" * 1000}), 400)
        assert "nests deeper than 100 levels" in deep["message"]
        # Text PostgreSQL cannot hold is bad input, not a store failure.
        nul = HELLO.format(path='"a\\0b"', v=1)
        error = _error(client.post("/api/catalog/register", json={"content": nul}), 400)
        assert error["fields"][0]["playbook_field"] == "metadata.path"
        named = {"content": HELLO.format(path="x", v=1), "source_file": "a\x00"}
        assert _field_names(_error(client.post("/api/catalog/register", json=named), 422)) == [
            "source_file"
        ]
        for url, field in (
            ("/api/catalog/a%00b", "path.path"),
            ("/api/catalog/list?path=%00", "query.path"),
            ("/api/credentials/a%00b", "path.name"),
            ("/api/keychain/a%00b@1/tok", "path.catalog_id"),
        ):
            assert _field_names(_error(client.get(url), 422)) == [field], url

        for body, field in (
            ({}, "content"),
            ({"content": ""}, "content"),
            ({"content": 5}, "content"),
            ({"content": BAD_KIND, "path": "x"}, "path"),
        ):
            error = _error(client.post("/api/catalog/register", json=body), 422)
            assert _field_names(error) == [field], error
        assert client.get("/api/catalog/tests/api/bad").status_code == 404


# -- credentials -----------------------------------------------------------------------


def test_credentials_crud_with_ciphertext_and_no_plaintext_anywhere(stack: Stack) -> None:
    secret = "s3cret-" + secrets.token_hex(12)
    data = {"token": secret, "user": "robot"}
    seen: list[str] = []
    with _client(stack) as client:

        def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
            r = client.request(method, url, **kwargs)
            seen.append(r.text)
            return r

        r = call(
            "POST", "/api/credentials", json={"name": "api_cred", "kind": "http", "data": data}
        )
        assert r.status_code == 201, r.text
        created = r.json()
        # The reply to a write names the secret fields too weak to mask safely: none here.
        assert created.pop("warnings") == []
        assert set(created) == {"name", "kind", "created", "updated"}
        assert (created["name"], created["kind"]) == ("api_cred", "http")

        listing = call("GET", "/api/credentials").json()
        assert [c for c in listing if c["name"] == "api_cred"] == [created]
        assert call("GET", "/api/credentials/api_cred").json() == created

        doc = call("GET", "/api/credentials/api_cred", params={"ciphertext": "true"}).json()
        assert {k: v for k, v in doc.items() if k != "ciphertext"} == created
        # Workers decrypt with the master key they share with the server.
        token = base64.b64decode(doc["ciphertext"])
        assert json.loads(_fernet(stack).decrypt(token)) == data

        # Replacing keeps `created`.
        time.sleep(0.01)
        replaced = call(
            "POST", "/api/credentials", json={"name": "api_cred", "kind": "bearer", "data": data}
        ).json()
        assert replaced["kind"] == "bearer" and replaced["created"] == created["created"]
        assert replaced["updated"] > created["updated"]

        # Bad input: 422 naming the field, and never the submitted value.
        for body, field in (
            ({"name": "bad name", "data": data}, "name"),
            ({"name": "", "data": data}, "name"),
            ({"name": "x", "data": {}}, "data"),
            ({"name": "x", "data": secret}, "data"),
            ({"name": "x"}, "data"),
            ({"name": "x", "kind": "no spaces", "data": data}, "kind"),
            ({"name": "x", "data": data, "value": secret}, "value"),
        ):
            error = _error(call("POST", "/api/credentials", json=body), 422)
            assert _field_names(error) == [field], error
        assert _error(call("POST", "/api/credentials", content=b"{not json"), 422)

        assert call("DELETE", "/api/credentials/api_cred").json() == {
            "name": "api_cred",
            "deleted": True,
        }
        gone = _error(call("GET", "/api/credentials/api_cred"), 404)
        assert "api_cred" in gone["message"]
        assert _error(call("GET", "/api/credentials/api_cred", params={"ciphertext": 1}), 404)
        assert _error(call("DELETE", "/api/credentials/api_cred"), 404)
        # Leave one stored, to look for the secret in the database too.
        call("POST", "/api/credentials", json={"name": "kept", "data": data})

    assert all(secret not in text for text in seen)
    assert secret.encode() not in _stored_bytes(stack, "credential")
    assert secret not in _logs(stack)


# -- keychain --------------------------------------------------------------------------


def test_keychain_crud_scopes_expiry_and_404s(stack: Stack) -> None:
    secret = "tok-" + secrets.token_hex(12)
    seen: list[str] = []
    with _client(stack) as client:

        def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
            r = client.request(method, url, **kwargs)
            seen.append(r.text)
            return r

        content = HELLO.format(path="tests/api/kc", v=1)
        cid = call("POST", "/api/catalog/register", json={"content": content}).json()["catalog_id"]
        assert cid == "tests/api/kc@1"
        url = f"/api/keychain/{cid}/amadeus_token"
        data = {"access_token": secret, "token_type": "Bearer"}

        before = time.time()
        r = call("POST", url, json={"data": data, "kind": "oauth2", "ttl_seconds": 60})
        assert r.status_code == 200, r.text
        entry = r.json()
        assert entry["catalog_id"] == cid and entry["name"] == "amadeus_token"
        assert (entry["kind"], entry["scope"], entry["execution_id"]) == ("oauth2", "global", None)
        assert before + 60 <= entry["expires_at"] <= time.time() + 60
        assert 59 < entry["ttl_seconds"] <= 60
        assert "ciphertext" not in entry

        meta = call("GET", url).json()
        assert meta["created"] == entry["created"] and "ciphertext" not in meta
        # `path` alone is the latest version: the same entry.
        assert call("GET", "/api/keychain/tests/api/kc/amadeus_token").json()["catalog_id"] == cid
        sealed = call("GET", url, params={"ciphertext": "true"}).json()
        assert json.loads(_fernet(stack).decrypt(base64.b64decode(sealed["ciphertext"]))) == data

        listing = call("GET", "/api/keychain", params={"catalog_id": cid}).json()
        assert listing["catalog_id"] == cid
        assert [i["name"] for i in listing["items"]] == ["amadeus_token"]

        # Expiry: an expired entry is 404 and no longer listed.
        short = f"/api/keychain/{cid}/short"
        assert call("POST", short, json={"data": data, "ttl_seconds": 0.5}).status_code == 200
        assert call("GET", short).status_code == 200
        time.sleep(0.7)
        expired = _error(call("GET", short), 404)
        assert "short" in expired["message"] and "expired" in expired["message"]
        names = [
            i["name"]
            for i in call("GET", "/api/keychain", params={"catalog_id": cid}).json()["items"]
        ]
        assert names == ["amadeus_token"]
        assert _error(call("DELETE", short), 404)
        at = time.time() + 30
        fixed = call("POST", short, json={"data": data, "expires_at": at}).json()
        assert fixed["expires_at"] == at
        no_expiry = call("POST", f"/api/keychain/{cid}/forever", json={"data": data}).json()
        assert no_expiry["expires_at"] is None and no_expiry["ttl_seconds"] is None

        # Local scope belongs to one execution.
        local = {"data": data, "scope": "local", "execution_id": "583412069447716865"}
        r = call("POST", f"/api/keychain/{cid}/session", json=local)
        assert r.json()["execution_id"] == "583412069447716865", r.text
        owner = {"scope": "local", "execution_id": "583412069447716865"}
        assert call("GET", f"/api/keychain/{cid}/session", params=owner).status_code == 200
        assert _error(call("GET", f"/api/keychain/{cid}/session"), 404)
        other = {"scope": "local", "execution_id": "1"}
        assert _error(call("GET", f"/api/keychain/{cid}/session", params=other), 404)

        # Bad input names the field.
        for body, field in (
            ({"data": data, "scope": "local"}, "execution_id"),
            ({"data": data, "execution_id": 5}, "execution_id"),
            ({"data": data, "scope": "planet"}, "scope"),
            ({"data": data, "ttl_seconds": 0}, "ttl_seconds"),
            ({"data": data, "ttl_seconds": "inf"}, "ttl_seconds"),
            ({"data": data, "expires_at": 1e308}, "expires_at"),
            ({"data": data, "expires_at": time.time() - 5}, "expires_at"),
            ({"data": data, "ttl_seconds": 5, "expires_at": time.time() + 5}, "expires_at"),
            ({"data": {}}, "data"),
            ({"data": secret}, "data"),
            ({"token_data": data}, "data"),
        ):
            error = _error(call("POST", url, json=body), 422)
            assert field in _field_names(error), (body, error)
        assert _field_names(_error(call("GET", url, params={"scope": "local"}), 422)) == [
            "execution_id"
        ]
        assert _field_names(_error(call("GET", url, params={"execution_id": "x"}), 422)) == [
            "query.execution_id"
        ]
        assert _field_names(
            _error(call("POST", f"/api/keychain/{cid}/a b", json={"data": data}), 422)
        ) == ["path.name"]
        assert _field_names(_error(call("GET", "/api/keychain/tests/api/kc@0/x"), 422)) == [
            "catalog_id"
        ]
        assert _field_names(_error(call("GET", "/api/keychain"), 422)) == ["query.catalog_id"]

        # Unknown catalog entries are 404 naming them, for every method.
        for method, kwargs in (("GET", {}), ("POST", {"json": {"data": data}}), ("DELETE", {})):
            error = _error(call(method, "/api/keychain/tests/api/nope@1/tok", **kwargs), 404)
            assert "tests/api/nope" in error["message"]
            error = _error(call(method, "/api/keychain/tests/api/kc@9/tok", **kwargs), 404)
            assert "tests/api/kc" in error["message"] and "9" in error["message"]
        assert _error(call("GET", "/api/keychain", params={"catalog_id": "tests/api/nope"}), 404)

        # A new version of the playbook starts with an empty keychain.
        content2 = HELLO.format(path="tests/api/kc", v=2)
        assert (
            call("POST", "/api/catalog/register", json={"content": content2}).json()["version"] == 2
        )
        assert _error(call("GET", "/api/keychain/tests/api/kc/amadeus_token"), 404)
        assert call("GET", url).status_code == 200

        assert call("DELETE", url).json() == {"name": "amadeus_token", "deleted": True}
        assert _error(call("GET", url), 404)
        assert _error(call("DELETE", url), 404)

    assert all(secret not in text for text in seen)
    assert secret.encode() not in _stored_bytes(stack, "keychain")
    assert secret not in _logs(stack)


def test_concurrent_keychain_writes_while_expired_entries_are_purged(stack: Stack) -> None:
    with _client(stack) as client:
        content = HELLO.format(path="tests/api/kc_busy", v=1)
        cid = client.post("/api/catalog/register", json={"content": content}).json()["catalog_id"]
        for i in range(20):
            r = client.post(
                f"/api/keychain/{cid}/old{i}", json={"data": {"i": i}, "ttl_seconds": 0.2}
            )
            assert r.status_code == 200, r.text
        time.sleep(0.3)

        def write(i: int) -> int:
            with _client(stack) as c:
                body = {"data": {"i": i}, "ttl_seconds": 60}
                return c.post(f"/api/keychain/{cid}/new{i % 8}", json=body).status_code

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            assert list(pool.map(write, range(64))) == [200] * 64
        items = client.get("/api/keychain", params={"catalog_id": cid}).json()["items"]
        assert sorted(i["name"] for i in items) == [f"new{i}" for i in range(8)]
    with psycopg.connect(stack.db) as conn:
        left = conn.execute(
            "SELECT count(*) FROM keychain WHERE path = 'tests/api/kc_busy' AND name LIKE 'old%'"
        ).fetchone()
    assert left == (0,), "expired entries are purged by later writes"


def test_db_status_reports_the_keychain_schema_version(stack: Stack) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flowtide.cli", "db", "status", "--db", stack.db, "--json"],
        capture_output=True,
        text=True,
        env=flowtide_env(stack.root / "home"),
        cwd=stack.root,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    versions = {r["component"]: (r["version"], r["latest"]) for r in json.loads(proc.stdout)}
    assert versions["cluster"] == (pgschema.CLUSTER.latest, pgschema.CLUSTER.latest)
    assert pgschema.CLUSTER.latest >= 3  # the keychain arrived in cluster version 3


# -- a worker uses a credential ----------------------------------------------------------


def test_worker_runs_a_postgres_step_with_a_credential_from_the_api(
    stack: Stack,
    pg_server: Any,
) -> None:
    body = pg_server.credential()
    password = str(body["password"])
    wrong = "wrong-" + secrets.token_hex(12)
    seen: list[str] = []
    with _client(stack) as client:

        def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
            r = client.request(method, url, **kwargs)
            seen.append(r.text)
            return r

        r = call(
            "POST", "/api/credentials", json={"name": "dist_pg", "kind": "postgres", "data": body}
        )
        assert r.status_code == 201, r.text
        bad = {**body, "password": wrong}
        r = call(
            "POST",
            "/api/credentials",
            json={"name": "dist_pg_bad", "kind": "postgres", "data": bad},
        )
        assert r.status_code == 201, r.text
        cid = call("POST", "/api/catalog/register", json={"content": PG_QUERY}).json()["catalog_id"]

        r = call("POST", "/api/execute", json={"catalog_id": cid})
        eid = r.json()["execution_id"]
        deadline = time.monotonic() + 60
        while call("GET", f"/api/executions/{eid}").json()["status"] == "running":
            assert time.monotonic() < deadline, _logs(stack)
            time.sleep(0.1)
        doc = json.loads(seen[-1])
        assert doc["status"] == "completed", (doc, _logs(stack))
        result = doc["steps"]["query"]["result"]
        assert result["rows"] == [{"who": body["user"], "answer": 42}]
        call("GET", f"/api/executions/{eid}/events", params={"limit": 10_000})
        claimed = [e for e in json.loads(seen[-1]) if e["type"] == "command.claimed"]
        assert claimed and claimed[0]["worker_id"] in ("w0", "w1")

        # The wrong password fails the step as an auth error, and leaks no more than the
        # right one.
        r = call(
            "POST", "/api/execute", json={"catalog_id": cid, "payload": {"pg_auth": "dist_pg_bad"}}
        )
        failed_id = r.json()["execution_id"]
        deadline = time.monotonic() + 60
        while call("GET", f"/api/executions/{failed_id}").json()["status"] == "running":
            assert time.monotonic() < deadline, _logs(stack)
            time.sleep(0.1)
        failed = json.loads(seen[-1])
        assert failed["status"] == "failed", failed
        assert failed["error"]["kind"] == "auth", failed
        call("GET", f"/api/executions/{failed_id}/events", params={"limit": 10_000})
        for name in ("dist_pg", "dist_pg_bad"):
            call("GET", f"/api/credentials/{name}")
            call("GET", f"/api/credentials/{name}", params={"ciphertext": "true"})
        call("GET", "/api/credentials")

    for secret in (password, wrong):
        assert all(secret not in text for text in seen), secret
        assert secret not in _logs(stack)
        assert secret.encode() not in _stored_bytes(stack, "credential")
    with psycopg.connect(stack.db) as conn:
        stored = conn.execute("SELECT payload, error FROM event").fetchall()
    assert all(wrong not in str(row) and password not in str(row) for row in stored)
