"""The web UI's page, assets and browser session on a real server: the page is public
and carries a strict CSP; a browser signs in with a token and is then known by an
HttpOnly cookie holding a session of its own (never the token; only its hash in the
cluster database); signing out, revoking the token, the session's lifetime and idle time
end it; a worker's token cannot sign in; a cookie alone cannot change anything without
the CSRF header; nothing outside the shipped assets is served."""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import time
from collections.abc import Iterator

import httpx
import psycopg

from flowtide.documents.summary import SUMMARY_FORMAT

from .stack import Stack
from .test_faults import _wait


@contextlib.contextmanager
def _session(stack: Stack, role: str) -> Iterator[httpx.Client]:
    """A browser-like client signed in as `role` (the cookie only, no bearer header)."""
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        r = client.post("/api/session", json={"token": stack.tokens[role]})
        assert r.status_code == 200, r.text
        assert r.json()["role"] == role
        yield client


def test_signing_in_sets_an_httponly_strict_cookie_the_api_takes(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as anon:
        r = anon.post("/api/session", json={"token": "ft_not-a-token"})
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert anon.get("/api/whoami").status_code == 401
    with _session(stack, "reader") as browser:
        cookie = browser.post("/api/session", json={"token": stack.tokens["reader"]}).headers[
            "set-cookie"
        ]
        flags = {p.strip().split("=")[0].lower() for p in cookie.split(";")}
        assert {"httponly", "path", "max-age", "samesite"} <= flags
        assert "samesite=strict" in cookie.lower()
        assert "secure" not in flags  # plain HTTP here: a Secure cookie would not come back
        me = browser.get("/api/whoami")
        assert me.status_code == 200 and me.json()["role"] == "reader"
        assert browser.get("/api/executions").status_code == 200
        # The role still decides: a reader may not cancel, cookie or not.
        r = browser.post(
            "/api/executions/123/cancel", json={"reason": "x"}, headers={"x-flowtide-csrf": "1"}
        )
        assert r.status_code == 403 and "needs operator" in r.json()["error"]["message"]
        # Signing out clears the cookie, and ends the session: a copy of it is refused.
        session_id = browser.cookies["flowtide_session"]
        out = browser.delete("/api/session")
        assert out.status_code == 200 and "max-age=0" in out.headers["set-cookie"].lower()
        assert browser.get("/api/whoami").status_code == 401
        assert _with_cookie(stack, session_id).status_code == 401


def _with_cookie(stack: Stack, value: str, path: str = "/api/whoami") -> httpx.Response:
    """A GET with only this session cookie, from a fresh client."""
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        client.cookies.set("flowtide_session", value)
        return client.get(path)


def _session_rows(stack: Stack) -> dict[bytes, tuple[object, ...]]:
    with psycopg.connect(stack.db) as conn:
        rows = conn.execute(
            "SELECT digest, subject, name, role, token_id, created, expires, seen FROM ui_session"
        ).fetchall()
    return {bytes(r[0]): tuple(r[1:]) for r in rows}


def test_the_cookie_is_a_session_of_its_own_kept_hashed(stack: Stack) -> None:
    token = stack.tokens["operator"]
    with _session(stack, "operator") as browser:
        session_id = browser.cookies["flowtide_session"]
        assert session_id != token and token not in session_id and len(session_id) == 43
        digest = hashlib.sha256(session_id.encode()).digest()
        kept = _session_rows(stack)[digest]
        subject, name, role, token_id, created, expires, seen = kept
        assert role == "operator" and token_id == subject and token.startswith(f"ftk_{token_id}_")
        assert expires == created + 12 * 3600 and seen == created  # the defaults
        # Nothing in the table authenticates: no row holds the id or the token.
        with psycopg.connect(stack.db) as conn:
            dump = json.dumps(
                [[str(c) for c in r] for r in conn.execute("SELECT * FROM ui_session")]
            )
        assert session_id not in dump and token.split("_")[-1] not in dump
    # A cookie holding a valid token is not a session.
    assert _with_cookie(stack, token).status_code == 401
    with stack.client("operator") as api:
        assert api.get("/api/whoami").status_code == 200  # the token itself still works


def test_revoking_a_token_ends_its_sessions(stack: Stack) -> None:
    with stack.client("admin") as admin:
        made = admin.post("/api/tokens", json={"role": "reader", "name": "ui-revoke"})
        assert made.status_code == 201, made.text
        token, token_id = made.json()["token"], made.json()["id"]
        with httpx.Client(base_url=stack.url, timeout=30) as browser:
            assert browser.post("/api/session", json={"token": token}).status_code == 200
            assert browser.get("/api/whoami").status_code == 200  # cached by the server now
            session_id = browser.cookies["flowtide_session"]
            assert admin.delete(f"/api/tokens/{token_id}").status_code == 200
            assert browser.get("/api/whoami").status_code == 401
            assert _with_cookie(stack, session_id).status_code == 401
    assert all(row[3] != token_id for row in _session_rows(stack).values())


def test_a_session_ends_when_its_token_expires(stack: Stack) -> None:
    with stack.client("admin") as admin:
        made = admin.post("/api/tokens", json={"role": "reader", "name": "ui-expiring"})
        token, token_id = made.json()["token"], made.json()["id"]
    with httpx.Client(base_url=stack.url, timeout=30) as browser:
        assert browser.post("/api/session", json={"token": token}).status_code == 200
        session_id = browser.cookies["flowtide_session"]
    with psycopg.connect(stack.db) as conn:
        conn.execute(
            "UPDATE api_token SET expires = %s WHERE token_id = %s", (time.time(), token_id)
        )
    assert _with_cookie(stack, session_id).status_code == 401


def test_a_session_ends_at_its_lifetime_and_when_idle(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as browser:
        ids = []
        for _ in range(3):
            assert browser.post("/api/session", json={"token": stack.tokens["reader"]}).is_success
            ids.append(browser.cookies["flowtide_session"])
            browser.cookies.clear()
    over, idle, live = ids
    now = time.time()
    with psycopg.connect(stack.db) as conn:
        # Not yet looked up, so not cached: the server reads these rows as they are.
        digest = {s: hashlib.sha256(s.encode()).digest() for s in ids}
        conn.execute("UPDATE ui_session SET expires = %s WHERE digest = %s", (now, digest[over]))
        conn.execute(
            "UPDATE ui_session SET seen = %s WHERE digest = %s", (now - 3601, digest[idle])
        )
    assert _with_cookie(stack, over).status_code == 401
    assert _with_cookie(stack, idle).status_code == 401
    assert _with_cookie(stack, live).status_code == 200


def test_a_workers_token_cannot_sign_in(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as anon:
        r = anon.post("/api/session", json={"token": stack.tokens["worker"]})
        assert r.status_code == 403 and "worker" in r.json()["error"]["message"]
        assert "set-cookie" not in r.headers


def test_credential_set_on_a_server_prints_its_warnings(stack: Stack) -> None:
    body = json.dumps({"user": "app", "password": "abc"})
    done = stack.run("credential", "set", "weak_ui_cred", "--json", body)
    assert done.returncode == 0, done.stderr
    assert "stored on" in done.stdout
    assert "warning: credential 'weak_ui_cred': the value of 'password'" in done.stderr
    assert "abc" not in done.stderr  # named, never shown
    strong = json.dumps({"password": "a-long-and-uncommon-secret-417"})
    done = stack.run("credential", "set", "strong_ui_cred", "--json", strong)
    assert done.returncode == 0 and "warning" not in done.stderr


def test_a_cookie_alone_cannot_change_anything_without_the_csrf_header(stack: Stack) -> None:
    with _session(stack, "operator") as browser:
        missing = "/api/executions/123/cancel"
        r = browser.post(missing, json={"reason": "forged"})
        assert r.status_code == 403 and "x-flowtide-csrf" in r.json()["error"]["message"]
        r = browser.post(missing, json={"reason": "ui"}, headers={"x-flowtide-csrf": "1"})
        assert r.status_code == 404  # past the gate and the rule: no such execution
    # A bearer token needs no such header (no browser sends it on its own).
    with stack.client("operator") as api:
        r = api.post("/api/executions/123/cancel", json={"reason": "cli"})
        assert r.status_code == 404
    # A cookie with a bad token is refused as a bad bearer token is.
    with httpx.Client(base_url=stack.url, timeout=30) as forged:
        forged.cookies.set("flowtide_session", "ft_forged")
        assert forged.get("/api/whoami").status_code == 401


def test_the_page_and_its_assets_are_public_and_nothing_else_is_served(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as anon:
        root = anon.get("/")
        assert root.status_code == 307 and root.headers["location"] == "/ui"
        for path in ("/ui", "/ui/executions/7311", "/ui/executions?status=failed"):
            page = anon.get(path)
            assert page.status_code == 200, path
            assert page.headers["content-type"].startswith("text/html")
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert page.headers["x-content-type-options"] == "nosniff"
            assert "/ui/static/app.js" in page.text
        js = anon.get("/ui/static/app.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        for bad in (
            "/ui/static/../graph.py",
            "/ui/static/%2e%2e/graph.py",
            "/ui/static/..%2Fsummary.py",
            "/ui/static/%2e%2e%2f%2e%2e%2fserver/ui.py",
            "/ui/static/missing.js",
            "/ui/static/",
        ):
            r = anon.get(bad)
            # Never a file outside the shipped assets: a 404, or the page itself for a
            # path the client normalised to one outside /ui/static/.
            assert "def " not in r.text and "import" not in r.text, bad
            if r.status_code == 200:
                assert r.headers["content-type"].startswith("text/html"), bad
                assert "/ui/static/app.js" in r.text
            else:
                assert r.status_code == 404, bad
        assert anon.get("/ui/static/missing.js").status_code == 404
    # Public, but the body cap holds: refused on its declared length, before the body.
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(
            b"POST /api/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 67108864\r\n\r\n{}"
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 413")


# -- the read and action endpoints the UI added -------------------------------------

STEPS = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: ui_steps, path: tests/ui/steps}
workload: {n: 3, big: 0}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'numbers': list(range(n))}", input: {n: "{{ n }}"}}
    next: [huge]
  - step: huge
    # A result too large to show: the panel gets its size only.
    tool: {kind: python, code: "result = 'x' * big", input: {big: "{{ big }}"}}
    next: [end]
  - step: end
"""


def test_step_detail_rerun_and_list_filters(stack: Stack) -> None:
    with stack.client("operator", timeout=30) as api, stack.client("reader", timeout=30) as reader:
        r = api.post("/api/catalog/register", json={"content": STEPS, "source_file": "steps.yaml"})
        assert r.status_code == 201, r.text
        r = api.post(
            "/api/execute",
            json={"catalog_id": "tests/ui/steps", "payload": {"n": 4, "big": 300_000}},
        )
        assert r.status_code == 201, r.text
        first = r.json()["execution_id"]
        assert _wait(api, first)["status"] == "completed"

        # Its summary was kept as it ended, and reads as the one folded from the log.
        with psycopg.connect(stack.db) as conn:
            kept = conn.execute(
                "SELECT format FROM execution_summary WHERE execution_id = %s", (int(first),)
            ).fetchone()
            assert kept == (SUMMARY_FORMAT,)
            from_kept = reader.get(f"/api/executions/{first}/summary").json()
            conn.execute("DELETE FROM execution_summary WHERE execution_id = %s", (int(first),))
        assert reader.get(f"/api/executions/{first}/summary").json() == from_kept
        assert from_kept["progress"]["steps_finished"] == 3

        step = reader.get(f"/api/executions/{first}/steps/start")
        assert step.status_code == 200, step.text
        doc = step.json()
        assert doc["status"] == "completed" and doc["kind"] == "python" and doc["runs"] == 1
        assert doc["result"] == {"numbers": [0, 1, 2, 3]} and not doc["result_truncated"]
        assert doc["line"] == 7 and doc["source"].startswith("  - step: start\n")
        assert doc["source"].rstrip().endswith("next: [huge]")  # not the next step
        assert [c["type"] for c in doc["calls"]] == ["call.done"]
        assert doc["calls"][0]["attempt"] == 1 and doc["spark"] is None
        huge = reader.get(f"/api/executions/{first}/steps/huge").json()
        assert huge["result"] is None and huge["result_truncated"] is True
        assert huge["result_size"] > 300_000
        missing = reader.get(f"/api/executions/{first}/steps/nope")
        assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]

        # The log from its end, paged back; one step's events.
        every = reader.get(f"/api/executions/{first}/events").json()
        ids = [e["event_id"] for e in every]
        tail = reader.get(f"/api/executions/{first}/events", params={"newest": True, "limit": 3})
        assert [e["event_id"] for e in tail.json()] == ids[-3:]
        back = reader.get(
            f"/api/executions/{first}/events",
            params={"newest": True, "limit": 3, "before": ids[-3]},
        ).json()
        assert [e["event_id"] for e in back] == ids[-6:-3]
        huge_events = reader.get(
            f"/api/executions/{first}/events", params={"step": "huge", "newest": True}
        ).json()
        assert huge_events and {e["step"] for e in huge_events} == {"huge"}
        assert [e["event_id"] for e in huge_events] == [
            e["event_id"] for e in every if e["step"] == "huge"
        ]

        # Re-run: the same catalog version and workload; an operator's right only.
        assert reader.post(f"/api/executions/{first}/rerun", json={}).status_code == 403
        r = api.post(f"/api/executions/{first}/rerun", json={})
        assert r.status_code == 201, r.text
        second = r.json()["execution_id"]
        assert second != first and r.json()["rerun_of"] == first
        assert _wait(api, second)["status"] == "completed"
        again = api.get(f"/api/executions/{second}/steps/start").json()
        assert again["result"] == {"numbers": [0, 1, 2, 3]}
        assert api.post("/api/executions/1/rerun", json={}).status_code == 404

        def ids(**params: object) -> list[str]:
            r = reader.get("/api/executions", params=params)
            assert r.status_code == 200, r.text
            return [i["execution_id"] for i in r.json()["items"]]

        assert ids(playbook="TESTS/UI/STEPS") == [second, first]
        assert ids(playbook="tests/ui/steps", parent=first) == []
        assert ids(playbook="tests/ui/steps", since=time.time() + 3600) == []
        assert ids(playbook="tests/ui/steps", min_seconds=3600) == []
        assert ids(playbook="tests/ui/steps", max_seconds=3600) == [second, first]
        item = reader.get("/api/executions", params={"playbook": "tests/ui/steps"}).json()["items"][
            0
        ]
        assert item["ended"] is not None and item["duration"] >= 0 and item["progress"] is None
        bad = reader.get("/api/executions", params={"min_seconds": -1})
        assert bad.status_code == 422


def test_catalog_validate_marks_errors_and_the_entry_offers_its_workload(stack: Stack) -> None:
    with stack.client("reader", timeout=30) as reader, stack.client("operator", timeout=30) as api:
        broken = STEPS.replace("next: [huge]", "next: [nowhere]")
        r = reader.post("/api/catalog/validate", json={"content": broken, "source_file": "b.yaml"})
        assert r.status_code == 200, r.text
        check = r.json()
        assert check["valid"] is False and check["name"] is None
        [error] = check["errors"]
        assert error["line"] == 9 and "nowhere" in error["message"] and error["step"] == "start"
        syntax = reader.post("/api/catalog/validate", json={"content": "a: [\n"}).json()
        assert syntax["valid"] is False and syntax["errors"][0]["line"] is not None
        good = reader.post("/api/catalog/validate", json={"content": STEPS}).json()
        assert good["valid"] and good["errors"] == [] and good["workload"] == {"n": 3, "big": 0}
        assert good["path"] == "tests/ui/steps" and good["steps"] == 3
        too_big = reader.post("/api/catalog/validate", json={"content": "x" * 4_000_001})
        assert too_big.status_code == 422
        # A path whose URL would name another one is refused.
        dotted = STEPS.replace("path: tests/ui/steps", "path: tests/../api/tokens")
        r = api.post("/api/catalog/register", json={"content": dotted})
        assert r.status_code == 400 and "'..' segment" in r.json()["error"]["message"]
        # Validating records nothing; registering is an operator's.
        assert reader.post("/api/catalog/register", json={"content": STEPS}).status_code == 403
        api.post("/api/catalog/register", json={"content": STEPS})
        entry = reader.get("/api/catalog/tests/ui/steps").json()
        assert entry["name"] == "ui_steps" and entry["workload"] == {"n": 3, "big": 0}
        assert entry["errors"] == [] and entry["steps"] == 3


LONG = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: ui_long, path: tests/ui/long}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'numbers': list(range(400))}"}
    next: [each]
  - step: each
    loop: {in: "{{ start.numbers }}", iterator: item, spec: {mode: parallel, max_in_flight: 2}}
    tool: {kind: python, code: "import time; time.sleep(0.05); result = 1"}
    next: [end]
  - step: end
"""


def test_the_list_shows_a_running_loops_progress(stack: Stack) -> None:
    with stack.client("operator", timeout=30) as api:
        r = api.post("/api/execute", json={"playbook": LONG})
        assert r.status_code == 201, r.text
        eid = r.json()["execution_id"]
        try:
            deadline = time.monotonic() + 60
            progress = None
            while time.monotonic() < deadline:
                items = api.get("/api/executions", params={"playbook": "tests/ui/long"}).json()
                item = next(i for i in items["items"] if i["execution_id"] == eid)
                progress = item["progress"]
                if progress and progress["iterations_done"] > 0:
                    break
                time.sleep(0.2)
            assert progress is not None, "no progress while the loop ran"
            assert progress["iterations"] == 400 and 0 < progress["iterations_done"] < 400
            assert item["status"] == "running" and item["ended"] is None
        finally:
            api.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"})
        assert _wait(api, eid)["status"] == "cancelled"
        done = api.get("/api/executions", params={"playbook": "tests/ui/long"}).json()["items"][0]
        assert done["progress"] is None and done["ended"] is not None
