"""The same playbook, unchanged, on every kind of Spark: embedded local mode, a Spark
Connect server (`sc://`) and a standalone master + worker (`spark://`), each started by the
test from the pip pyspark distribution on loopback. Runs `flowtide` as a user does."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

from flowtide.spark.session import POSTGRES_JAR

from .conftest import KILLED_LOOP, cli_events, cli_json, flowtide_cli
from .servers import ConnectServer, StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "spark_etl.yaml"
RATES = {"DE": 1.08, "FR": 1.08, "GB": 1.27, "US": 1.0, "JP": 0.0067, "BR": 0.2}


def spark_round(value: float) -> float:
    """Spark SQL's round(x, 2) on a double: HALF_UP on the shortest decimal form (Python's
    round() is half-even on the binary value, which differs on ties such as 36.825)."""
    return float(Decimal(repr(value)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def expected_totals() -> dict[str, tuple[int, float]]:
    """What examples/spark_etl.yaml must report, computed from the CSV without Spark."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    with (REPO / "examples" / "data" / "orders.csv").open() as f:
        for row in csv.DictReader(f):
            if not row["quantity"] or float(row["unit_price"]) <= 0:
                continue
            revenue = spark_round(
                int(row["quantity"]) * float(row["unit_price"]) * RATES[row["country"]]
            )
            totals[row["country"]][0] += 1
            totals[row["country"]][1] += revenue
    return {c: (int(n), v) for c, (n, v) in totals.items()}


def spark_calls(execution_id: str, home: Path) -> list[dict[str, Any]]:
    return [
        e["payload"]["spark"]
        for e in cli_events(execution_id, home)
        if e["type"] in ("call.done", "call.error") and "spark" in (e.get("payload") or {})
    ]


def check_etl_result(result: dict[str, Any]) -> None:
    expected = expected_totals()
    assert result["orders_priced"] == sum(n for n, _ in expected.values()) == 1980
    assert result["summary_rows"] == 36  # 6 countries x 6 months
    got = {r["country"]: (r["orders"], r["revenue_usd"]) for r in result["by_country"]}
    assert got.keys() == expected.keys()
    for country, (n, revenue) in expected.items():
        assert got[country][0] == n
        assert got[country][1] == pytest.approx(revenue, abs=0.05)


def run_example(home: Path, out: Path, *extra: str) -> dict[str, Any]:
    doc = cli_json("run", str(EXAMPLE), "--set", f"out_dir={out}", *extra, home=home)
    assert doc["status"] == "completed", doc["error"]
    return doc


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("embedded")
    home = tmp / ".flowtide"
    doc = run_example(home, tmp / "out")
    return {"doc": doc, "calls": spark_calls(doc["execution_id"], home), "home": home}


def test_example_runs_embedded_on_one_local_session(embedded: dict[str, Any]) -> None:
    check_etl_result(embedded["doc"]["result"])
    calls = embedded["calls"]
    assert len(calls) == 3  # load_orders, enrich, summary (no PostgreSQL here)
    # a fresh process: its first spark step started the one session all steps used
    assert {c["session_starts"] for c in calls} == {1}
    assert len({c["app_id"] for c in calls}) == 1
    assert {c["mode"] for c in calls} == {"classic"}
    assert {c["master"] for c in calls} == {"local[*]"}


def test_flowtide_data_reads_a_spark_steps_output(embedded: dict[str, Any]) -> None:
    home, eid = embedded["home"], embedded["doc"]["execution_id"]
    proc = flowtide_cli("data", eid, "summary", "--limit", "0", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["row_count"] == len(out["rows"]) == 36
    by_country: dict[str, float] = defaultdict(float)
    for row in out["rows"]:  # the partition column comes back from the folder names
        by_country[row["country"]] += row["revenue_usd"]
    for r in embedded["doc"]["result"]["by_country"]:
        assert by_country[r["country"]] == pytest.approx(r["revenue_usd"], abs=0.01)
    # a step without a dataset, and one that never existed: exit 2 with a reason
    proc = flowtide_cli("data", eid, "rates", home=home)
    assert proc.returncode == 2 and "did not produce a dataset" in proc.stderr
    proc = flowtide_cli("data", eid, "nope", home=home)
    assert proc.returncode == 2 and "no step 'nope'" in proc.stderr


@pytest.mark.postgres
def test_example_writes_the_summary_to_postgres_over_jdbc(
    tmp_path: Path, pg_server: Any, embedded: dict[str, Any]
) -> None:
    import psycopg

    home = tmp_path / ".flowtide"
    body = json.dumps(pg_server.credential())
    proc = flowtide_cli("credential", "set", "pg", "--kind", "postgres", "--json", body, home=home)
    assert proc.returncode == 0, proc.stderr
    table = f"public.country_revenue_{os.getpid()}"
    doc = run_example(home, tmp_path / "out", "--set", "pg_auth=pg", "--set", f"pg_table={table}")
    assert doc["result"] == {**embedded["doc"]["result"], "postgres_table": table}
    with psycopg.connect(pg_server.dsn) as conn:
        count, revenue = conn.execute(f"SELECT count(*), sum(revenue_usd) FROM {table}").fetchone()
    assert count == 36
    assert revenue == pytest.approx(doc["result"]["revenue_usd"], abs=0.05)
    events = json.dumps(cli_events(doc["execution_id"], home))
    assert pg_server.password not in events


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    jars = [str(POSTGRES_JAR)] if POSTGRES_JAR.is_file() else []
    with ConnectServer(tmp_path_factory.mktemp("connect"), jars=jars) as server:
        yield server


def test_same_playbook_on_spark_connect(
    tmp_path: Path, connect_server: ConnectServer, embedded: dict[str, Any]
) -> None:
    home = tmp_path / ".flowtide"
    doc = run_example(home, tmp_path / "out", "--spark-master", connect_server.url)
    assert doc["result"] == embedded["doc"]["result"]
    calls = spark_calls(doc["execution_id"], home)
    assert {c["mode"] for c in calls} == {"connect"}
    assert {c["master"] for c in calls} == {connect_server.url}
    assert {c["session_starts"] for c in calls} == {1}
    assert all(c["jobs"] for c in calls)  # Connect operation ids, one list per step


def test_ctrl_c_cancels_the_spark_job_on_the_connect_server(
    tmp_path: Path, connect_server: ConnectServer
) -> None:
    playbook = tmp_path / "slow.yaml"
    playbook.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: slow, path: tests/slow}\n"
        "workflow:\n  - step: crunch\n    tool:\n      kind: spark\n"
        '      sql: "SELECT sum(id * 7 % 13) AS s FROM range(0, 100000000000)"\n'
    )
    env = dict(os.environ, FLOWTIDE_HOME=str(tmp_path / ".flowtide"), FLOWTIDE_NO_PROGRESS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtide.cli", "run", str(playbook)]
        + ["--spark-master", connect_server.url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def running() -> bool:
        # A loaded machine can keep the server's UI from answering within its timeout:
        # that is "not yet", not a failure.
        try:
            return bool(connect_server.running_jobs())
        except OSError:
            return False

    try:
        deadline = time.monotonic() + 180
        while not running():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the query never started on the server"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()  # closes the pipes
    assert proc.returncode == 130, stderr
    assert "flowtide resume" in stderr
    # The server would run this query for hours; Ctrl-C must have stopped it.
    deadline = time.monotonic() + 30
    while connect_server.running_jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert connect_server.running_jobs() == []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with StandaloneCluster(tmp_path_factory.mktemp("cluster"), cores=2, memory="2g") as c:
        yield c


def test_same_playbook_on_a_standalone_cluster(
    tmp_path: Path, cluster: StandaloneCluster, embedded: dict[str, Any]
) -> None:
    home = tmp_path / ".flowtide"
    env = {"FLOWTIDE_SPARK_MASTER": cluster.master_url}
    doc = cli_json("run", str(EXAMPLE), "--set", f"out_dir={tmp_path / 'out'}", home=home, env=env)
    assert doc["status"] == "completed", doc["error"]
    assert doc["result"] == embedded["doc"]["result"]
    calls = spark_calls(doc["execution_id"], home)
    assert {c["master"] for c in calls} == {cluster.master_url}
    [app_id] = {c["app_id"] for c in calls}
    # the work really ran on the cluster's executors: the master lists the application
    apps = {a["id"]: a for a in cluster.completed_apps() + cluster.active_apps()}
    assert app_id in apps
    assert apps[app_id]["name"] == "flowtide"


LOOP_EXAMPLE = REPO / "examples" / "spark_loop.yaml"
LOOP_ROWS = 2000


def run_loop_example(home: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> Any:
    doc = cli_json(
        "run", str(LOOP_EXAMPLE), "--set", f"rows={LOOP_ROWS}", "--set", f"out_dir={out}", *extra,
        home=home, env=env,
    )  # fmt: skip
    assert doc["status"] == "completed", doc["error"]
    return doc["result"]


def expected_tiers() -> dict[str, tuple[int, int]]:
    """What examples/spark_loop.yaml reports, computed without Spark."""
    tiers: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for i in range(LOOP_ROWS):
        visits = i * 7919 % 100
        tier = "gold" if visits >= 80 else "silver" if visits >= 40 else "bronze"
        tiers[tier][0] += 1
        tiers[tier][1] += visits * 3 + len(f"customer-{i}")
    return {t: (n, s) for t, (n, s) in tiers.items()}


def check_loop_result(result: dict[str, Any]) -> None:
    assert result["stats"] == {"total": LOOP_ROWS, "success": LOOP_ROWS, "failed": 0}
    got = {r["tier"]: (r["customers"], r["score"]) for r in result["tiers"]}
    assert got == expected_tiers()


def test_spark_loop_example_on_spark_connect(tmp_path: Path, connect_server: ConnectServer) -> None:
    """The loop's items run in the Connect server's python workers."""
    check_loop_result(
        run_loop_example(
            tmp_path / ".flowtide", tmp_path / "out", "--spark-master", connect_server.url
        )
    )


def test_spark_loop_example_on_a_standalone_cluster(
    tmp_path: Path, cluster: StandaloneCluster
) -> None:
    """The loop's items run on the cluster's executor."""
    env = {"FLOWTIDE_SPARK_MASTER": cluster.master_url}
    check_loop_result(run_loop_example(tmp_path / ".flowtide", tmp_path / "out", env=env))


def test_a_spark_loop_task_killed_mid_job_is_run_again_and_counted_once(
    tmp_path: Path, cluster: StandaloneCluster
) -> None:
    """An item's python worker dies (os._exit) on the task's first attempt: Spark runs the
    task again, its rows replace the lost attempt's, and every index is counted once."""
    marks = tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    book = tmp_path / "killed.yaml"
    book.write_text(KILLED_LOOP)
    env = {"FLOWTIDE_SPARK_MASTER": cluster.master_url}
    doc = cli_json("run", str(book), "--set", f"marks={marks}", home=tmp_path / "home", env=env)
    assert doc["status"] == "completed", doc["error"]
    events = cli_events(doc["execution_id"], tmp_path / "home")
    [call] = [e for e in events if e["type"] == "call.done" and e["step"] == "work"]
    # The document holds the step's result: exact, one per index, in index order.
    work = json.loads(
        flowtide_cli("status", doc["execution_id"], "--json", home=tmp_path / "home").stdout
    )["steps"]["work"]["result"]
    assert work["stats"] == {"total": 600, "success": 600, "failed": 0}
    assert work["results"] == [x * x for x in range(600)]
    assert call["payload"]["spark"]["rows_written"] == 600
    # The killed attempt's items ran twice (at-least-once side effects), the others once.
    runs = {int(p.name): len(p.read_text()) for p in marks.iterdir() if p.name != "died"}
    assert sorted(runs) == list(range(600))
    assert runs[300] == 2 and max(runs.values()) == 2 and runs[0] == 1
