"""`flowtide dev up|status|down`: a whole stack from the command line, then a playbook on it,
a dead worker noticed and replaced, data kept across down/up, and clear errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from browser import CHROMIUM, SEEN_MS, chromium, shot
from flowtide.dev.postgres import find_pg_bin, free_port

from .stack import flowtide_env
from .test_dev_roles import assert_plain_owner

pytestmark = pytest.mark.skipif(find_pg_bin() is None, reason="PostgreSQL server not installed")

ROOT = Path(__file__).resolve().parents[2]


def _flowtide(
    home: Path, *args: Any, timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env={**flowtide_env(home), "FLOWTIDE_HOME": str(home), **(env or {})},
        cwd=ROOT,
        timeout=timeout,
    )


@pytest.fixture
def home() -> Iterator[Path]:
    # Under /tmp, world-traversable: as root, PostgreSQL runs as another account.
    base = Path(tempfile.mkdtemp(prefix="flowtide-dev-", dir="/tmp"))
    base.chmod(0o755)
    home = base / ".flowtide"
    try:
        yield home
    finally:
        _flowtide(home, "dev", "down", timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def _status(home: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    r = _flowtide(home, "dev", "status", "--json")
    doc = json.loads(r.stdout)
    return r.returncode, {c["name"]: c for c in doc["components"]}


#: A run long enough to be watched: a loop of short sleeps.
LIVE_PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: live, path: tests/dev/live}
workload: {n: 20}
workflow:
  - step: start
    loop: {in: "{{ range(n) | list }}", iterator: item, spec: {mode: sequential}}
    tool: {kind: python, code: "import time; time.sleep(0.2); result = {'i': item}", input: {item: "{{ item }}"}}
"""

SCRIPT_PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: script_file, path: tests/dev/script_file}
workflow:
  - step: start
    tool:
      kind: python
      script: {uri: ./scripts/greet.py, source: {type: file}}
      input: {name: dev}
"""


#: A python step whose result goes to a file of the runtime's data folder.
STORED_PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: stored_result, path: tests/dev/stored_result}
workflow:
  - step: start
    tool:
      kind: python
      code: "result = {'rows': [{'i': i, 'text': 'x' * 40} for i in range(200)]}"
    output: {store: {kind: disk}, inline_max_bytes: 1024}
"""


def _listing(home: Path) -> set[str]:
    return {str(p.relative_to(home)) for p in home.rglob("*")}


def test_dev_up_runs_a_playbook_then_down_keeps_the_data(home: Path) -> None:
    # The workers run in --workdir: a playbook's relative script path resolves there.
    project = home.parent / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "scripts" / "greet.py").write_text(
        "def main(name):\n    return {'hello': name, 'cwd': __import__('os').getcwd()}\n"
    )
    (project / "script.yaml").write_text(SCRIPT_PLAYBOOK)
    (project / "stored.yaml").write_text(STORED_PLAYBOOK)
    # The user's own runs in the same home: `dev down --purge` leaves them alone.
    own = _flowtide(home, "run", project / "stored.yaml", "--json")
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout)["result"]["_ref"]["uri"].startswith(f"file://{home}/data/")
    before = _listing(home)
    ports = [str(free_port()) for _ in range(3)]
    up = _flowtide(
        home,
        "dev",
        "up",
        "--workdir",
        project,
        "--workers",
        "1",
        "--port",
        ports[0],
        "--nats-port",
        ports[1],
        "--pg-port",
        ports[2],
        "--lease",
        "5",
    )
    assert up.returncode == 0, up.stderr
    url = f"https://127.0.0.1:{ports[0]}"
    assert f"--server {url}" in up.stdout
    assert "web UI:                flowtide dev ui  (a proxy on 127.0.0.1" in up.stdout
    # Mutual TLS with the stack's own CA: without a client certificate of it, or without
    # trusting it, no connection; private keys are the owner's alone.
    tls = home / "dev" / "tls"
    assert all(key.stat().st_mode & 0o077 == 0 for key in tls.glob("*-key.pem"))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/healthz", verify=ssl.create_default_context(cafile=tls / "ca.pem"))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/healthz", timeout=5)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{ports[0]}/healthz", timeout=5)
    # The database password is in the state file (0600), never on screen.
    state = json.loads((home / "dev" / "stack.json").read_text())
    assert state["pg_password"] not in up.stdout + up.stderr
    assert (home / "dev" / "stack.json").stat().st_mode & 0o077 == 0

    code, parts = _status(home)
    assert code == 0
    assert {n: p["state"] for n, p in parts.items()} == {
        "postgres": "running",
        "nats": "running",
        "server": "running",
        "worker-0": "running",
    }

    # nats-server runs with users: its config is private, no part has a password on its
    # command line (each got its own through its environment), a client without
    # credentials is refused, and the workers' user cannot read the KV.
    passwords = state["nats_passwords"]
    assert set(passwords) == {"server", "worker-default"}
    assert (home / "dev" / "nats.conf").stat().st_mode & 0o077 == 0
    for name, part in parts.items():
        cmdline = Path(f"/proc/{part['pid']}/cmdline").read_bytes().decode(errors="replace")
        for secret in [state["pg_password"], *passwords.values()]:
            assert secret not in cmdline, name
    # nats-server takes TLS only, verified with the stack's CA (FLOWTIDE_NATS_CA): a
    # client that does not trust it gets no connection, whatever scheme it asks for.
    nats_url = f"tls://127.0.0.1:{ports[1]}"
    trust = {"FLOWTIDE_NATS_CA": str(tls / "ca.pem")}
    for plain in (nats_url, f"nats://127.0.0.1:{ports[1]}"):
        untrusted = _flowtide(home, "kv", "ls", "--url", plain)
        assert untrusted.returncode == 2 and "certificate verify failed" in untrusted.stderr
    anonymous = _flowtide(home, "kv", "ls", "--url", nats_url, env=trust)
    assert anonymous.returncode == 2 and "authorization violation" in anonymous.stderr
    as_worker = _flowtide(
        home,
        "kv",
        "ls",
        "--url",
        nats_url,
        env={
            **trust,
            "FLOWTIDE_NATS_USER": "worker-default",
            "FLOWTIDE_NATS_PASSWORD": passwords["worker-default"],
        },
    )
    assert as_worker.returncode == 2 and "permissions violation" in as_worker.stderr
    assert passwords["worker-default"] not in as_worker.stderr

    # PostgreSQL takes TCP connections over TLS only; the stack's URL verifies it.
    pg = f"postgresql://flowtide:{state['pg_password']}@127.0.0.1:{ports[2]}/flowtide"
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(pg + "?sslmode=disable", connect_timeout=5).close()
    verified = f"{pg}?sslmode=verify-full&sslrootcert={tls / 'ca.pem'}"
    with psycopg.connect(verified, connect_timeout=5) as conn:
        row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
        assert row == (True,)
    # The login is no superuser: it owns the stack's database, nothing more.
    assert_plain_owner(verified)

    logs = _flowtide(home, "dev", "logs", "server")
    assert logs.returncode == 0 and f"flowtide server on {url}" in logs.stdout
    assert state["pg_password"] not in logs.stdout
    unknown = _flowtide(home, "dev", "logs", "nope")
    assert unknown.returncode == 2 and "worker-0" in unknown.stderr

    run = _flowtide(home, "run", "examples/quickstart.yaml", "--server", url, "--json")
    assert run.returncode == 0, run.stderr
    remote = json.loads(run.stdout)
    embedded = json.loads(
        _flowtide(
            home, "run", "examples/quickstart.yaml", "--json", "--home", home.parent / "e-home"
        ).stdout
    )
    assert remote["status"] == "completed"
    assert remote["result"] == embedded["result"]
    assert parts["worker-0"]["detail"].endswith(f" in {project}")
    scripted = _flowtide(home, "run", project / "script.yaml", "--server", url, "--json")
    assert scripted.returncode == 0, scripted.stderr
    assert json.loads(scripted.stdout)["steps"]["start"]["result"] == {
        "hello": "dev",
        "cwd": str(project),
    }

    # What the stack's workers write stays under HOME/dev.
    stored = _flowtide(home, "run", project / "stored.yaml", "--server", url, "--json")
    assert stored.returncode == 0, stored.stderr
    uri = json.loads(stored.stdout)["result"]["_ref"]["uri"]
    assert uri.startswith(f"file://{home}/dev/data/results/disk/"), uri

    _ui_through_the_proxy(home, url)

    # A worker killed behind the stack's back shows as stopped; `up` replaces only it.
    worker_pid = parts["worker-0"]["pid"]
    server_pid = parts["server"]["pid"]
    os.kill(worker_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        code, parts = _status(home)
        if parts["worker-0"]["state"] == "stopped":
            break
        time.sleep(0.2)
    assert code == 1 and parts["worker-0"]["state"] == "stopped"
    again = _flowtide(home, "dev", "up")
    assert again.returncode == 0, again.stderr
    assert "server: already running" in again.stderr
    code, parts = _status(home)
    assert code == 0
    assert parts["server"]["pid"] == server_pid and parts["worker-0"]["pid"] != worker_pid

    down = _flowtide(home, "dev", "down")
    assert down.returncode == 0, down.stderr
    code, parts = _status(home)
    assert code == 1 and all(p["state"] == "stopped" for p in parts.values())

    # Up again on the same data: the earlier execution is still there.
    assert _flowtide(home, "dev", "up").returncode == 0
    doc = _flowtide(home, "status", remote["execution_id"], "--server", url, "--json")
    assert doc.returncode == 0, doc.stderr
    assert json.loads(doc.stdout)["status"] == "completed"

    purge = _flowtide(home, "dev", "down", "--purge")
    assert purge.returncode == 0
    assert not (home / "dev").exists()
    # Nothing the stack made is left, and the user's own run is all there.
    assert _listing(home) == before


def _ui_through_the_proxy(home: Path, url: str) -> None:
    """`flowtide dev ui`: the stack's UI in Chromium, which holds no client certificate,
    through the loopback proxy: signed in by the printed link, the list of executions,
    and a running execution followed live over its event stream."""
    from flowtide.dev.stack import DevStack

    ui = subprocess.Popen(
        [sys.executable, "-m", "flowtide.cli", "dev", "ui", "--port", "0", "--no-open"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**flowtide_env(home), "FLOWTIDE_HOME": str(home)},
        cwd=ROOT,
    )
    try:
        assert ui.stdout is not None
        first, link = ui.stdout.readline(), ui.stdout.readline().strip()
        assert f"-> {url} (with the admin's client certificate)" in first, first
        admin = json.loads((home / "dev" / "tokens.json").read_text())["admin"]
        assert link.startswith("open http://127.0.0.1:"), link
        assert link.endswith(f"/ui#token={admin}"), link
        link = link.removeprefix("open ")
        base = link.split("/ui#")[0]
        # The proxy adds no credential: without a session the API says 401.
        assert httpx.get(f"{base}/api/whoami", timeout=10).status_code == 401
        assert httpx.get(f"{base}/ui", timeout=10).status_code == 200
        if not CHROMIUM.exists():
            return  # CI installs it (scripts/ensure-chromium.sh); the HTTP checks ran
        with DevStack(home).admin_client(timeout=30) as api:
            started = api.post(
                "/api/execute",
                json={"playbook": LIVE_PLAYBOOK, "payload": {"n": 30}},
            )
            assert started.status_code == 201, started.text
        eid = started.json()["execution_id"]
        with chromium() as browser:
            page = browser.new_context().new_page()
            page.set_default_timeout(SEEN_MS)
            page.goto(link)
            page.get_by_test_id("user-name").wait_for()
            page.goto(f"{base}/ui/executions")
            page.get_by_test_id("exec-row").first.wait_for()
            page.goto(f"{base}/ui/executions/{eid}?tab=events")
            page.locator('[data-testid="events-state"][data-state="live"]').wait_for()
            seen = page.get_by_test_id("event-row").count()
            page.wait_for_function(
                "n => document.querySelectorAll('[data-testid=event-row]').length > n", arg=seen
            )
            shot(page, "dev-ui-live")
            page.locator('[data-testid="events-state"][data-state="ended"]').wait_for(
                timeout=60_000
            )
    finally:
        ui.terminate()
        ui.communicate(timeout=10)


def test_dev_up_with_two_shards_runs_playbooks_on_both_and_keeps_its_shard_count(
    home: Path,
) -> None:
    # Free ports for what the test names; the stack picks the shards' own after them
    # (or free ones where those are taken).
    ports = [str(free_port()) for _ in range(3)]
    up = _flowtide(
        home,
        "dev",
        "up",
        "--shards",
        "2",
        "--workers",
        "1",
        "--port",
        ports[0],
        "--nats-port",
        ports[1],
        "--pg-port",
        ports[2],
    )
    assert up.returncode == 0, up.stderr
    url = f"https://127.0.0.1:{ports[0]}"
    assert f"--server {url}" in up.stdout

    r = _flowtide(home, "dev", "status", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    shards = doc["shards"]
    assert doc["count"] == 2 and [s["shard"] for s in shards] == [0, 1]
    assert all(s["postgres"]["up"] and s["server"]["up"] for s in shards), shards
    assert doc["cluster_database"]["up"]
    # Each shard its own PostgreSQL server (own port) and server; the cluster database
    # on a third one.
    pg_ports = {doc["cluster_database"]["port"], *(s["postgres"]["port"] for s in shards)}
    assert len(pg_ports) == 3 and int(ports[2]) == doc["cluster_database"]["port"]
    assert shards[0]["server"]["url"] == url
    # Each shard's database is the login's own, and the login no superuser there either.
    password = json.loads((home / "dev" / "stack.json").read_text())["pg_password"]
    shard_db = (
        f"postgresql://flowtide:{password}@127.0.0.1:{shards[1]['postgres']['port']}"
        f"/flowtide_shard_1?sslmode=verify-full&sslrootcert={home / 'dev' / 'tls' / 'ca.pem'}"
    )
    assert_plain_owner(shard_db)
    other = shards[1]["server"]["url"]
    assert other != url

    from flowtide.sharding import shard_for

    # Two runs through shard 0's server: the shards in turn take them (one each).
    eids = []
    for _ in range(2):
        run = _flowtide(home, "run", "examples/quickstart.yaml", "--server", url, "--json")
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["status"] == "completed"
        eids.append(json.loads(run.stdout)["execution_id"])
    assert sorted(shard_for(int(e), 2) for e in eids) == [0, 1], eids
    # Through shard 1's server (its token and TLS files found on their own, as for
    # shard 0's): each run is answered by forwarding to its shard's server where it is
    # not this one's (mutual TLS between the servers).
    for eid in eids:
        forwarded = _flowtide(home, "status", eid, "--server", other, "--json")
        assert forwarded.returncode == 0, forwarded.stderr
        assert json.loads(forwarded.stdout)["status"] == "completed"

    # Each shard's backlog as its server's /metrics says: the runs ended, nothing open.
    r = _flowtide(home, "dev", "status", "--json")
    healths = [s["health"] for s in json.loads(r.stdout)["shards"]]
    for health in healths:
        assert health is not None and health["open_executions"] == 0, healths
        assert health["oldest_open_age_seconds"] == 0 and health["stalled"] == 0, healths
        assert health["outbox_pending"] >= 0 and health["idle_past_stalled_after"] == 0
    text = _flowtide(home, "dev", "status").stdout
    for shard in (0, 1):
        assert f"shard {shard} health:  outbox " in text, text
    assert "0 open executions (oldest 0.0 s)" in text and "0 failed as stalled so far" in text

    # The stack keeps its shard count: another one is refused, nothing is touched.
    refused = _flowtide(home, "dev", "up", "--shards", "3")
    assert refused.returncode == 1 and "does not re-shard" in refused.stderr
    assert "--purge" in refused.stderr

    down = _flowtide(home, "dev", "down")
    assert down.returncode == 0, down.stderr
    r = _flowtide(home, "dev", "status", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["count"] == 2
    assert all(c["state"] == "stopped" for c in doc["components"]), doc["components"]


def test_dev_up_refuses_a_missing_workdir_before_starting_anything(home: Path) -> None:
    missing = home.parent / "no-such-dir"
    r = _flowtide(home, "dev", "up", "--workdir", missing, "--pg-port", free_port())
    assert r.returncode == 1
    assert f"the workers' directory {missing} does not exist" in r.stderr
    assert not (home / "dev" / "pg").exists()


def test_dev_up_names_a_taken_port(home: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _flowtide(
            home,
            "dev",
            "up",
            "--workers",
            "0",
            "--pg-port",
            free_port(),
            "--nats-port",
            port,
            "--port",
            free_port(),
        )
    assert r.returncode == 1
    assert f"port {port}" in r.stderr and "--nats-port" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs PostgreSQL as another account")
def test_dev_up_as_root_explains_an_unreachable_directory(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    tmp_path.chmod(0o700)
    r = _flowtide(private / ".flowtide", "dev", "up", "--pg-port", free_port())
    assert r.returncode == 1
    assert "cannot write" in r.stderr and "chmod o+x" in r.stderr
