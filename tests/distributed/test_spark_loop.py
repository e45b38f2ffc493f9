"""A `mode: spark` loop on the distributed stack: the worker that claims the loop's one
command is the Spark driver (its own local session), and the result is what the same
playbook gives embedded. The command's lease is kept while the job runs, a cancel stops
the job, and a driver killed mid-job (`kill -9`, its JVM and Spark's python workers with
it) gives the command to the other worker, whose re-run still counts exactly.

The tests run in order on one stack of two workers (the last one kills a worker)."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from flowtide.spark.outputs import read_output

from .stack import Stack
from .test_results import _embedded

# Each worker starts a JVM (seconds; more on a busy machine).
pytestmark = [pytest.mark.postgres, pytest.mark.nats, pytest.mark.spark, pytest.mark.timeout(300)]

STACK_WORKERS = 2
# One command at a time: two loops at once have a driver each.
STACK_CONCURRENCY = 1

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: spark_loop_dist, path: tests/dist/spark_loop}
workload: {n: 500}
workflow:
  - step: start
    tool: {kind: python, input: {n: "{{ workload.n }}"}, code: "result = list(range(n))"}
    next: [square]
  - step: square
    loop: {in: "{{ start }}", iterator: x, spec: {mode: spark, partitions: 2}}
    tool:
      kind: python
      input: {x: "{{ iter.x }}"}
      code: |
        if x % 50 == 3:
            raise ValueError(x)
        result = x * x
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' }}"
              then: {do: continue}
    next: [end]
  - step: end
    tool:
      kind: python
      input: {stats: "{{ square.stats }}", results: "{{ square.results }}"}
      code: "result = {'stats': stats, 'sum': sum(r for r in results if isinstance(r, int))}"
"""


def test_a_spark_loop_runs_on_a_worker_as_embedded(stack: Stack, tmp_path: Path) -> None:
    file = tmp_path / "spark_loop.yaml"
    file.write_text(PLAYBOOK)
    proc = stack.run("run", file, "--json", timeout=300)
    assert proc.stdout, proc.stderr + stack.log("worker0")
    remote = json.loads(proc.stdout)
    assert remote["status"] == "completed", remote["error"]
    assert remote["result"] == {
        "stats": {"total": 500, "success": 490, "failed": 10},
        "sum": sum(x * x for x in range(500) if x % 50 != 3),
    }
    local = _embedded(stack.root, file)
    assert local["result"] == remote["result"]


ENV = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: spark_loop_env, path: tests/dist/spark_loop_env}
workflow:
  - step: env
    loop: {in: [1], iterator: x, spec: {mode: spark}}
    tool: {kind: python, code: "import os; print('seen on a worker'); result = sorted(os.environ)"}
"""


def test_an_item_on_a_worker_sees_no_more_of_its_environment_than_a_python_step(
    stack: Stack, tmp_path: Path
) -> None:
    # Not the worker's variables (its tokens, or any the test runner has): only what a
    # python step's child process gets, and Spark's own (never its keys).
    file = tmp_path / "spark_loop_env.yaml"
    file.write_text(ENV)
    proc = stack.run("run", file, "--json", timeout=300)
    assert proc.stdout, proc.stderr + stack.log("worker0")
    remote = json.loads(proc.stdout)
    assert remote["status"] == "completed", remote["error"]
    (names,) = remote["result"]["results"]
    basics = {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "SSL_CERT_FILE"}
    basics |= {"SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"}
    basics |= {
        p for n in ("http", "https", "all", "no") for p in (f"{n}_proxy", f"{n.upper()}_PROXY")
    }
    kept = ("LC_", "SPARK_", "PYSPARK_", "PYTHON", "FLOWTIDE_MAX_", "FLOWTIDE_FILE_ROOTS")
    other = [n for n in names if n not in basics and not n.startswith(kept)]
    assert not other, other
    assert "PYTHON_WORKER_FACTORY_SECRET" not in names
    # What the item printed is in the step's log, as the other `[spark]` lines are.
    logs = stack.run("logs", remote["execution_id"], "env")
    assert logs.returncode == 0, logs.stderr
    assert "[spark] item 0: seen on a worker\n" in logs.stdout, logs.stdout


# Each run of an item leaves a file `<index>-<uuid>` in `marks` as it starts, then sleeps.
SLOW = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: spark_loop_slow, path: tests/dist/spark_loop_slow}
workload: {n: 20, pause: 0.5, marks: ""}
workflow:
  - step: work
    loop:
      in: "{{ range(workload.n) | list }}"
      iterator: x
      spec: {mode: spark, partitions: 2}
    tool:
      kind: python
      input: {x: "{{ iter.x }}", pause: "{{ workload.pause }}", marks: "{{ workload.marks }}"}
      code: |
        import os, time, uuid
        open(os.path.join(marks, f"{x}-{uuid.uuid4().hex}"), "w").close()
        time.sleep(pause)
        result = x
"""


@pytest.fixture
def marks() -> Iterator[Path]:
    """A folder any user may write to (the items' python may run as nobody)."""
    path = Path(tempfile.mkdtemp(prefix="flowtide-spark-marks-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(client: httpx.Client, marks: Path, **workload: Any) -> str:
    r = client.post(
        "/api/execute", json={"playbook": SLOW, "payload": {"marks": str(marks), **workload}}
    )
    assert r.status_code == 201, r.text
    return str(r.json()["execution_id"])


def _wait(client: httpx.Client, eid: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = client.get(f"/api/executions/{eid}").json()
        if doc["status"] != "running":
            return dict(doc)
        time.sleep(0.1)
    raise AssertionError(f"execution {eid} still running after {timeout}s")


def _events(client: httpx.Client, eid: str, kind: str) -> list[dict[str, Any]]:
    page = client.get(f"/api/executions/{eid}/events", params={"limit": 10_000}).json()
    return [e for e in page if e["type"] == kind and e["step"] == "work"]


def _runs(marks: Path) -> list[int]:
    """The index of every run of an item so far (one per file)."""
    return [int(p.name.split("-")[0]) for p in marks.iterdir()]


def _driver(client: httpx.Client, eid: str, marks: Path, stack: Stack) -> str:
    """The worker running the loop's command, once its items have started."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        claimed = _events(client, eid, "command.claimed")
        if claimed and len(_runs(marks)) >= 2:
            return str(claimed[-1]["worker_id"])
        time.sleep(0.1)
    raise AssertionError("the loop's items never started: " + stack.log("worker0"))


def _running(client: httpx.Client, worker_id: str, since: float = 0.0) -> int:
    """What `worker_id` runs, as its last heartbeat said (-1: none since `since`)."""
    for pool in client.get("/api/worker/pools").json()["pools"]:
        for worker in pool["workers"]:
            if worker["worker_id"] == worker_id:
                if time.time() - float(worker["last_heartbeat_age"]) < since:
                    return -1  # said before `since`: may be stale
                return int(worker["running"])
    return -1


def _exact(doc: dict[str, Any], n: int) -> None:
    """The loop's stats, results and dataset hold every index once."""
    result = doc["steps"]["work"]["result"]
    assert result["stats"] == {"total": n, "success": n, "failed": 0}
    assert result["results"] == list(range(n))
    written = read_output(result)  # DuckDB over every parquet file under the folder
    assert written.row_count == n
    assert sorted(row["index"] for row in written.rows) == list(range(n))
    folder = Path(result["uri"].removeprefix("file://"))
    assert not (folder / "_temporary").exists(), "an attempt's leftovers are in the output"


def test_the_lease_is_kept_while_the_job_runs_past_it(stack: Stack, marks: Path) -> None:
    # Two loops at once, a worker the driver of each (both workers have their JVM for the
    # tests after this one): 10 items of 0.5 s in each of 2 partitions outlast the lease.
    folders = [marks / "a", marks / "b"]
    for folder in folders:
        folder.mkdir()
        folder.chmod(0o777)
    with stack.client() as client:
        eids = [_start(client, folder) for folder in folders]
        drivers = set()
        for eid, folder in zip(eids, folders, strict=True):
            doc = _wait(client, eid, timeout=240)
            assert doc["status"] == "completed", doc["error"]
            _exact(doc, 20)
            (claimed,) = _events(client, eid, "command.claimed")
            (done,) = _events(client, eid, "command.completed")
            assert done["time"] - claimed["time"] > 1.5 * stack.lease
            # Issued once, claimed once, run once: never taken back from its driver.
            assert len(_events(client, eid, "command.issued")) == 1
            assert done["worker_id"] == claimed["worker_id"]
            drivers.add(done["worker_id"])
            # The driver sent the items done while the job ran, and the exact counts last.
            progress = _events(client, eid, "command.progress")
            assert any(0 < e["payload"]["done"] < 20 for e in progress[:-1]), progress
            assert progress[-1]["payload"]["done"] == 20
            assert progress[-1]["payload"]["failed"] == 0
            assert sorted(_runs(folder)) == list(range(20))
        assert drivers == {"w0", "w1"}


def test_cancel_stops_the_job(stack: Stack, marks: Path) -> None:
    # 100 items of 0.2 s in each of 2 partitions: 20 s of work, cancelled in its first.
    n = 200
    with stack.client() as client:
        eid = _start(client, marks, n=n, pause=0.2)
        driver = _driver(client, eid, marks, stack)
        r = client.post(f"/api/executions/{eid}/cancel")
        assert r.status_code == 200, r.text
        cancelled_at, cancelled_wall = time.monotonic(), time.time()
        doc = _wait(client, eid, timeout=10)
        assert doc["status"] == "cancelled", doc
        # The job is interrupted: the driver's slot is free well before the 20 s of work
        # (a heartbeat after the cancel says so).
        while _running(client, driver, since=cancelled_wall) != 0:
            assert time.monotonic() - cancelled_at < 10, stack.log(f"worker{driver[1:]}")
            time.sleep(0.1)
        # No item starts once the job is stopped (the python workers of its cancelled
        # tasks included: Spark itself kills them only seconds later).
        stopped = len(_runs(marks))
        time.sleep(1.5)
        after = len(_runs(marks))
        assert after == stopped, f"{after - stopped} items started after the job was stopped"
        assert after < n // 4, f"{after} items of {n} ran: the job was not stopped early"


def _descendants(pid: int) -> list[psutil.Process]:
    return list(psutil.Process(pid).children(recursive=True))


def test_a_driver_killed_mid_job_gives_the_loop_to_the_other_worker(
    stack: Stack, marks: Path
) -> None:
    n = 40
    with stack.client() as client:
        stack.wait_workers(2)
        # 20 items of 0.25 s in each of 2 partitions.
        eid = _start(client, marks, n=n, pause=0.25)
        driver = _driver(client, eid, marks, stack)
        victim = stack.workers[int(driver[1:])]
        spawned = _descendants(victim.pid)
        assert any("java" in p.name() for p in spawned), "the driver's JVM is its child"
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        # Its JVM exits with it (stdin closed), and Spark's python workers with the JVM.
        _gone, alive = psutil.wait_procs(spawned, timeout=20)
        for p in alive:
            p.kill()
        assert not alive, f"left running after the worker was killed: {alive}"
        started_before = len(_runs(marks))

        doc = _wait(client, eid, timeout=120)
        assert doc["status"] == "completed", doc["error"]
        _exact(doc, n)
        issued = _events(client, eid, "command.issued")
        assert [bool(e["payload"].get("reissued")) for e in issued] == [False, True]
        (done,) = _events(client, eid, "command.completed")
        assert done["worker_id"] != driver
        # Every item ran in the re-run (at least once in all; some twice).
        runs = _runs(marks)
        assert sorted(set(runs)) == list(range(n))
        assert len(runs) >= n + started_before
