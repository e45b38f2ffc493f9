"""Prometheus metrics of the distributed stack: command counters and claim latency follow a
run, gauges read from the database, and counters add up over `--workers 2` processes."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from .stack import Stack, _free_port, flowtide_env

STEPS = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: three, path: tests/dist/three}
workflow:
  - step: first
    tool: {kind: python, code: "result = {'n': 1}"}
    next: [{step: second}]
  - step: second
    tool: {kind: python, code: "result = {'n': 2}"}
    next: [{step: third}]
  - step: third
    tool: {kind: python, code: "result = {'n': 3}"}
"""

ONE_STEP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: one, path: tests/dist/one}
workflow:
  - step: only
    tool: {kind: python, code: "result = {'ok': True}"}
"""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _scrape(url: str, headers: dict[str, str]) -> Samples:
    # A new connection each time, so a multi-process server answers from any process.
    r = httpx.get(f"{url}/metrics", timeout=30, headers={"connection": "close", **headers})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return _parse(r.text)


def _value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def _labels(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(ls)[label] for (n, ls), _ in samples.items() if n == name and label in dict(ls)}


def _eventually(check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def _wait(client: httpx.Client, eid: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = str(client.get(f"/api/executions/{eid}/status").json()["status"])
        if status not in ("running", "pending"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"execution {eid} still running after {timeout}s")


def test_counters_latency_and_gauges_follow_a_run(stack: Stack) -> None:
    names = ["issued", "claimed", "completed", "failed"]
    with stack.client(timeout=30) as client:
        before = _scrape(stack.url, stack.headers("reader"))
        eid = client.post("/api/execute", json={"playbook": STEPS}).json()["execution_id"]
        assert _wait(client, eid) == "completed"
        events = client.get(f"/api/executions/{eid}/events").json()
    commands = {e["command_id"] for e in events if e["type"] == "command.issued"}
    assert len(commands) == 3

    def delta(after: Samples, name: str) -> float:
        return _value(after, name, pool="default") - _value(before, name, pool="default")

    # The status can be read between the last report's commit and its counting.
    after: Samples = {}

    def settled() -> bool:
        nonlocal after
        after = _scrape(stack.url, stack.headers("reader"))
        # Published rows are marked in batches shortly after (outbox.MARK_DELAY).
        return (
            delta(after, "flowtide_commands_completed_total") >= 3
            and _value(after, "flowtide_outbox_pending") == 0
        )

    _eventually(settled)
    counts = {n: delta(after, f"flowtide_commands_{n}_total") for n in names}
    assert counts == {"issued": 3, "claimed": 3, "completed": 3, "failed": 0}
    latency = "flowtide_command_claim_latency_seconds"
    assert delta(after, f"{latency}_count") == 3
    assert 0 < delta(after, f"{latency}_sum") < 3 * 10
    assert _value(after, f"{latency}_bucket", pool="default", le="+Inf") == _value(
        after, f"{latency}_count", pool="default"
    )
    assert _value(after, "flowtide_executions", status="completed") >= 1 + _value(
        before, "flowtide_executions", status="completed"
    )
    assert _value(after, "flowtide_executions", status="running") == 0
    assert _value(after, "flowtide_outbox_pending") == 0
    assert _value(after, "flowtide_outbox_oldest_pending_age_seconds") == 0
    # Process metrics, one series per server process.
    assert len(_labels(after, "process_resident_memory_bytes", "pid")) == 1
    assert _value(after, "process_cpu_seconds_total") > 0


@dataclass
class _Server:
    """`flowtide server --workers 2` started by a test."""

    url: str
    tmp: Path
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def two_process_server(stack: Stack, tmp_path: Path) -> Iterator[_Server]:
    """`flowtide server --workers 2` on the stack's database and NATS, with TMPDIR (where
    its metrics directory goes) in `tmp_path`."""
    port = _free_port()
    env = flowtide_env(tmp_path / "home") | {"TMPDIR": str(tmp_path)} | stack.nats_env("server")
    env["WORKER_ID"] = "one-server"  # both processes: a hash of it would be one machine id
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log_path = tmp_path / "server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowtide.cli",
                "server",
                "--db",
                stack.db,
                "--nats",
                stack.nats,
                "--kv",
                stack.nats,
                "--kv-bucket",
                "metrics_test",
                "--port",
                str(port),
                "--workers",
                "2",
            ],
            # A session of its own: a stuck supervisor and its workers are killed together.
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    server = _Server(f"http://127.0.0.1:{port}", tmp_path, proc)
    try:

        def ready() -> bool:
            assert proc.poll() is None, log_path.read_text()
            try:
                return httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _eventually(ready, timeout=60)
        yield server
    finally:
        server.stop()


def _per_process_issued(metrics_dir: Path, scratch: Path) -> dict[str, float]:
    """flowtide_commands_issued_total of each process, from its own file."""
    out: dict[str, float] = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = path.stem.removeprefix("counter_")
        alone = scratch / pid
        alone.mkdir(exist_ok=True)
        shutil.copy(path, alone / path.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, str(alone))
        value = registry.get_sample_value("flowtide_commands_issued_total", {"pool": "default"})
        out[pid] = value or 0.0
    return out


def _server_machine_ids(stack: Stack) -> set[int]:
    import psycopg

    from flowtide.store import pg

    with psycopg.connect(stack.db) as conn:
        holders = pg.machines.holders(conn)
    return {m for m, holder in holders.items() if holder.startswith("server:")}


def test_counters_add_up_over_server_processes(
    stack: Stack, two_process_server: _Server, tmp_path: Path
) -> None:
    url = two_process_server.url
    (metrics_dir,) = tmp_path.glob("flowtide-metrics-*")
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def execute(_: int) -> str:
        r = httpx.post(
            f"{url}/api/execute",
            json={"playbook": ONE_STEP},
            headers={"connection": "close", **stack.headers()},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        return str(r.json()["execution_id"])

    # Each execution issues its first command in the process that took the request (the
    # workers report to the stack's server). Fire until both processes took some.
    executions: list[str] = []
    per_process: dict[str, float] = {}
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for _ in range(20):
            executions += pool.map(execute, range(20))
            per_process = _per_process_issued(metrics_dir, scratch)
            if len([v for v in per_process.values() if v > 0]) == 2:
                break
    assert len(per_process) == 2 and all(v > 0 for v in per_process.values()), per_process
    assert sum(per_process.values()) == len(executions)
    # Whichever process answers, the sum is exact.
    for _ in range(10):
        assert _value(
            _scrape(url, stack.headers("reader")), "flowtide_commands_issued_total"
        ) == len(executions)
    # Both processes report their own process metrics.
    _eventually(
        lambda: (
            len(_labels(_scrape(url, stack.headers("reader")), "process_start_time_seconds", "pid"))
            == 2
        )
    )
    with stack.client(timeout=30) as client:
        assert all(_wait(client, eid) == "completed" for eid in executions)
    # Each process issued its ids under a machine id of its own, leased in the database
    # (both have one WORKER_ID: a hash of it would be one machine id).
    machines = {(int(eid) >> 12) & 0x3FF for eid in executions}
    assert len(machines) == 2, machines
    held = _server_machine_ids(stack)
    assert machines <= held
    two_process_server.stop()
    assert two_process_server.proc.returncode == 0
    # Stopped processes give their machine ids back.
    assert not machines & _server_machine_ids(stack)
    assert not list(tmp_path.glob("flowtide-metrics-*")), "the server removes its directory"


def test_oldest_open_execution_and_idle_gauges(stack: Stack) -> None:
    """An execution left waiting (its pool has no worker) shows as the oldest open one,
    its age growing with the clock; once it ends the gauge falls back to 0."""
    gauge = "flowtide_oldest_open_execution_age_seconds"
    with stack.client(timeout=30) as client:
        started = time.time()
        r = client.post("/api/execute", json={"playbook": ONE_STEP, "pool": "nobody-here"})
        eid = r.json()["execution_id"]
        seen: Samples = {}

        def aged(minimum: float) -> Callable[[], bool]:
            def check() -> bool:
                nonlocal seen
                seen = _scrape(stack.url, stack.headers("reader"))
                return _value(seen, gauge) >= minimum

            return check

        # Read at most every metrics.OPEN_REFRESH seconds: seen within a few.
        _eventually(aged(0.5), timeout=15)
        assert _value(seen, gauge) <= time.time() - started + 0.5
        assert _value(seen, "flowtide_executions", status="running") >= 1
        # Idle past FLOWTIDE_STALLED_AFTER (600 s here): none; its command is issued anyway.
        assert ("flowtide_executions_idle_past_stalled_after", frozenset()) in seen
        assert _value(seen, "flowtide_executions_idle_past_stalled_after") == 0
        first = _value(seen, gauge)
        _eventually(aged(first + 1), timeout=15)  # the age grows with the clock
        assert client.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"}).is_success
        assert _wait(client, eid) == "cancelled"

        def cleared() -> bool:
            return _value(_scrape(stack.url, stack.headers("reader")), gauge) == 0

        _eventually(cleared, timeout=15)
