"""Authentication and authorisation on the real stack: every route refuses a request
without a token (401) and a token of the wrong role (403); the attacks of issue 14 (code
run, credentials read or deleted, results forged, executions forced, workers spoofed by
anyone who can reach the port) now fail; tokens are created, used and revoked."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowtide.auth.principal import outranks
from flowtide.web.access import PUBLIC_PATHS, RULES
from pyuser import writable

from .stack import Stack
from .test_faults import ONE_STEP, _events, _wait, _waiting_commands

PEOPLE = ("reader", "operator", "admin")

RCE = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: rce, path: tests/access/rce}}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        import os
        os.system("touch {marker}")
        result = 1
"""

PG_CREDENTIAL = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pg_cred, path: tests/access/pg_cred}
workflow:
  - step: query
    tool:
      kind: postgres
      auth: access_pg
      command: "SELECT 40 + 2 AS answer"
"""


def _operations(stack: Stack) -> list[tuple[str, str]]:
    spec = httpx.get(f"{stack.url}/openapi.json", timeout=30).json()
    return sorted(
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method in ("get", "post", "put", "delete", "patch")
    )


def _concrete(path: str) -> str:
    # Starlette declares `{x:path}` where OpenAPI shows `{x}`; any value will do here.
    return re.sub(r"\{[^}]+\}", "1", path)


def _declared(path: str) -> str:
    return (
        path.replace("{path}", "{path:path}")
        .replace("{catalog_id}", "{catalog_id:path}")
        .replace("{event_id}", "{event_id:int}")
    )


def test_every_route_has_a_rule_and_refuses_whom_it_must(stack: Stack) -> None:
    operations = _operations(stack)
    declared = {(m, _declared(p)) for m, p in operations}
    # A new endpoint without a rule fails here (and is refused by the server meanwhile).
    assert declared <= set(RULES), sorted(declared - set(RULES))
    assert set(RULES) <= declared, sorted(set(RULES) - declared)
    with httpx.Client(base_url=stack.url, timeout=30) as anonymous:
        for method, path in operations:
            rule = RULES[(method, _declared(path))]
            url = _concrete(path)
            r = anonymous.request(method, url, json={})
            if rule.public:
                if (method, path) == ("POST", "/api/hooks/{name}"):
                    # A webhook's delivery: refused by its signature, not for a token.
                    assert r.status_code == 401, r.text
                    assert "www-authenticate" not in r.headers
                    assert "delivery refused" in r.json()["error"]["message"]
                    continue
                assert r.status_code != 401, (method, path)
                continue
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            for role in (*PEOPLE, "worker"):
                if rule.admits_role(role):
                    continue
                with stack.client(role) as client:
                    r = client.request(method, url, json={})
                assert r.status_code == 403, (method, path, role, r.status_code, r.text)
                assert role in r.json()["error"]["message"]
    # The API's description, the probes and the UI's page stay open (signing in to the
    # UI is a POST: tests/distributed/test_ui_session.py).
    for path in PUBLIC_PATHS - {"/docs/oauth2-redirect", "/api/session"}:
        r = httpx.get(f"{stack.url}{path}", timeout=30, follow_redirects=True)
        assert r.status_code == 200, path


def test_a_bad_or_missing_token_is_401_and_says_nothing_more(stack: Stack) -> None:
    for header in (
        {},
        {"authorization": "Basic YWRtaW46YWRtaW4="},
        {"authorization": "Bearer"},
        {"authorization": "Bearer ftk_aaaaaaaaaaaa_" + "A" * 43},
        {"authorization": "Bearer " + stack.tokens["admin"][:-1] + "x"},
        {"authorization": "Bearer not.a.jwt"},
    ):
        r = httpx.get(f"{stack.url}/api/executions", headers=header, timeout=30)
        assert r.status_code == 401, (header, r.text)
        assert "ftk_" not in r.text


def test_running_code_needs_an_operator_token(stack: Stack, open_dir: Path) -> None:
    # Where the step (nobody, on a root worker) can write.
    marker = writable(open_dir / "out") / "owned"
    body = {"playbook": RCE.format(marker=marker)}
    assert httpx.post(f"{stack.url}/api/execute", json=body, timeout=30).status_code == 401
    with stack.client("reader") as reader:
        assert reader.post("/api/execute", json=body).status_code == 403
    with stack.client("worker") as worker:
        # A worker starts sub-playbooks of the commands it holds, nothing else.
        assert worker.post("/api/execute", json=body).status_code == 403
        orphan = {**body, "parent_execution_id": "12345"}
        assert worker.post("/api/execute", json=orphan).status_code == 403
    time.sleep(1.0)
    assert not marker.exists()
    with stack.client("operator") as operator:
        r = operator.post("/api/execute", json=body)
        assert r.status_code == 201
        assert _wait(operator, r.json()["execution_id"])["status"] == "completed"
    assert marker.exists()


def test_credentials_are_the_admins_alone(stack: Stack) -> None:
    with stack.client("admin") as admin:
        r = admin.post(
            "/api/credentials", json={"name": "vault_probe", "data": {"password": "s3cr3t-pw"}}
        )
        assert r.status_code == 201
    for path, method in (
        ("/api/credentials/vault_probe?ciphertext=true", "GET"),
        ("/api/credentials", "GET"),
        ("/api/credentials/vault_probe", "DELETE"),
        ("/api/credentials", "POST"),
    ):
        body = {"name": "vault_probe", "data": {"password": "x"}}
        r = httpx.request(method, f"{stack.url}{path}", json=body, timeout=30)
        assert r.status_code == 401, (method, path)
        for role in ("reader", "operator", "worker"):
            with stack.client(role) as client:
                r = client.request(method, path, json=body)
            assert r.status_code == 403, (method, path, role)
            assert "s3cr3t-pw" not in r.text
    with stack.client("admin") as admin:
        assert admin.get("/api/credentials/vault_probe").status_code == 200
        # A worker gets a credential's value only for a command it holds now.
        with stack.worker_client("prober") as worker:
            r = worker.post(
                "/api/worker/credentials",
                json={
                    "worker_id": "prober",
                    "execution_id": "1",
                    "command_id": "1",
                    "name": "vault_probe",
                },
            )
            assert r.status_code == 403 and "s3cr3t-pw" not in r.text
        assert admin.delete("/api/credentials/vault_probe").status_code == 200


def test_forged_reports_and_spoofed_workers_are_refused(stack: Stack) -> None:
    with stack.client("admin") as admin:
        # A second worker credential: the intruder has a valid worker token of its own.
        intruder_token = admin.post(
            "/api/tokens", json={"role": "worker", "name": "intruder"}
        ).json()["token"]
        eid, (issued,) = _waiting_commands(admin, ONE_STEP, 1)
        with stack.worker_client("honest", pool="idle") as honest:
            r = honest.post(
                f"/api/commands/{issued['event_id']}/claim",
                json={
                    "worker_id": "honest",
                    "execution_id": eid,
                    "command_id": issued["command_id"],
                },
            )
            assert r.status_code == 200
        # What the event log shows anyone who may read it: the holder's worker id.
        claimed = next(e for e in _events(admin, eid) if e["type"] == "command.claimed")
        holder = claimed["worker_id"]
        forged = {
            "worker_id": holder,
            "reports": [
                {
                    "execution_id": eid,
                    "events": [
                        {
                            "event_id": str(int(claimed["event_id"]) + 7),
                            "execution_id": eid,
                            "type": "command.completed",
                            "step": "only",
                            "status": "ok",
                            "payload": {"status": "ok", "result": {"forged": True}, "attempt": 1},
                            "command_id": issued["command_id"],
                            "worker_id": holder,
                        }
                    ],
                }
            ],
        }
        intruder = {"authorization": f"Bearer {intruder_token}"}
        calls = [
            ("/api/events/reports", forged),
            ("/api/events/batch", {"execution_id": eid, **forged, **forged["reports"][0]}),
            ("/api/worker/pool/heartbeat", {"worker_id": holder}),
            ("/api/worker/pool/deregister", {"worker_id": holder}),
            (
                "/api/worker/pool/register",
                {"worker_id": holder, "pool": "idle"},
            ),
        ]
        for path, body in calls:
            body = {k: v for k, v in body.items() if k != "reports" or path.endswith("reports")}
            assert httpx.post(f"{stack.url}{path}", json=body, timeout=30).status_code == 401
            for role in PEOPLE:
                assert admin.post(path, json=body, headers=stack.headers(role)).status_code == 403
            r = httpx.post(f"{stack.url}{path}", json=body, headers=intruder, timeout=30)
            assert r.status_code == 403, (path, r.text)
        # Forcing the execution's end is the admin's, not an operator's.
        for role in ("reader", "operator"):
            r = admin.post(
                f"/api/executions/{eid}/finalize",
                json={"status": "completed", "reason": "forged"},
                headers=stack.headers(role),
            )
            assert r.status_code == 403
        doc = admin.get(f"/api/executions/{eid}").json()
        assert doc["status"] == "running" and doc["result"] is None
        assert not any(e["type"] == "command.completed" for e in _events(admin, eid))
        admin.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"})
        admin.delete("/api/tokens/intruder")


def test_a_pool_token_serves_its_pool_only(stack: Stack) -> None:
    with stack.client("admin") as admin:
        token = admin.post(
            "/api/tokens", json={"role": "worker", "name": "gpu-only", "pool": "gpu"}
        ).json()["token"]
        headers = {"authorization": f"Bearer {token}"}
        with httpx.Client(base_url=stack.url, headers=headers, timeout=30) as gpu:
            r = gpu.post("/api/worker/pool/register", json={"worker_id": "g1", "pool": "idle"})
            assert r.status_code == 403 and "gpu" in r.json()["error"]["message"]
            r = gpu.post("/api/worker/pool/register", json={"worker_id": "g1", "pool": "gpu"})
            assert r.status_code == 200
            eid, (issued,) = _waiting_commands(admin, ONE_STEP, 1)  # pool "idle"
            r = gpu.post(
                "/api/commands/claim",
                json={
                    "worker_id": "g1",
                    "claims": [
                        {
                            "event_id": issued["event_id"],
                            "execution_id": eid,
                            "command_id": issued["command_id"],
                        }
                    ],
                },
            )
            assert r.status_code == 200
            assert r.json()["results"][0]["code"] == 403
        admin.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"})
        admin.delete("/api/tokens/gpu-only")


def test_tokens_are_created_listed_and_revoked(stack: Stack) -> None:
    with stack.client("admin") as admin:
        r = admin.post("/api/tokens", json={"role": "reader", "name": "short-lived"})
        assert r.status_code == 201
        created = r.json()
        assert created["token"].startswith("ftk_") and created["role"] == "reader"
        listed = admin.get("/api/tokens").json()["items"]
        mine = [t for t in listed if t["name"] == "short-lived"]
        assert mine and "token" not in mine[0]
        assert created["token"] not in str(listed)
        headers = {"authorization": f"Bearer {created['token']}"}
        assert httpx.get(f"{stack.url}/api/whoami", headers=headers, timeout=30).json() == {
            "name": "short-lived",
            "role": "reader",
            "pool": None,
            "subject": created["id"],
        }
        # A second active token of that name is refused.
        again = admin.post("/api/tokens", json={"role": "reader", "name": "short-lived"})
        assert again.status_code == 422 and again.json()["error"]["fields"][0]["field"] == "name"
        assert admin.delete("/api/tokens/short-lived").status_code == 200
        deadline = time.monotonic() + 15
        status = 200
        while status == 200 and time.monotonic() < deadline:
            status = httpx.get(f"{stack.url}/api/whoami", headers=headers, timeout=30).status_code
            time.sleep(0.5)
        assert status == 401
        assert admin.delete("/api/tokens/no-such-token").status_code == 404


def test_request_bodies_are_capped(stack: Stack) -> None:
    huge = b'{"playbook": "' + b"x" * (17 * 1024 * 1024) + b'"}'
    with stack.client("operator") as client:
        r = client.post("/api/execute", content=huge, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "16777216" in r.json()["error"]["message"]

        def chunks() -> Any:
            for _ in range(20):
                yield b"x" * (1024 * 1024)

        r = client.post(
            "/api/execute", content=chunks(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 413
        assert httpx.get(f"{stack.url}/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize("role", [*PEOPLE, "worker"])
def test_roles_rank_as_documented(role: str) -> None:
    assert outranks(role, role)
    assert outranks("admin", "reader") and not outranks("reader", "operator")
    assert not outranks("admin", "worker") and not outranks("worker", "reader")


def test_a_worker_without_the_master_key_gets_the_credentials_of_its_commands(
    stack: Stack, pg_server: Any, tmp_path: Path
) -> None:
    home = tmp_path / "worker-home"
    home.mkdir()
    worker = stack.start_worker(concurrency=2, pool="nokey", env={"FLOWTIDE_HOME": str(home)})
    try:
        with stack.client("admin") as admin:
            body = pg_server.credential()
            r = admin.post(
                "/api/credentials", json={"name": "access_pg", "kind": "postgres", "data": body}
            )
            assert r.status_code == 201
            r = admin.post("/api/execute", json={"playbook": PG_CREDENTIAL, "pool": "nokey"})
            doc = _wait(admin, r.json()["execution_id"])
            assert doc["status"] == "completed", doc
            assert doc["steps"]["query"]["result"]["rows"] == [{"answer": 42}]
        # It never had, nor made, a key of its own.
        assert not list(home.rglob("master.key"))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        stack.workers.remove(worker)


def test_a_worker_without_a_token_stops_with_a_clear_error(stack: Stack) -> None:
    from flowtide.dev.nats import worker_user_name

    env = {**stack.env, **stack.nats_env(worker_user_name("default"))}
    env.pop("FLOWTIDE_TOKEN")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowtide.cli",
            "worker",
            "--server",
            stack.url,
            "--nats",
            stack.nats,
            "--worker-id",
            "tokenless",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "refused worker tokenless" in proc.stderr and "FLOWTIDE_TOKEN" in proc.stderr
    assert "Traceback" not in proc.stderr
