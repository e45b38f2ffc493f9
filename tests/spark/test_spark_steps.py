"""`kind: spark` steps on a real local Spark, in this process (one shared session)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from flowtide.spark import activity
from flowtide.spark.session import sessions

from .conftest import Runner

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

SLOW_SQL = "SELECT sum(id * 7 % 13) AS s FROM range(0, 100000000000)"


def orders() -> list[dict[str, Any]]:
    return [
        {"id": i, "region": "north" if i % 3 == 0 else "south", "amount": i if i % 2 else i + 0.25}
        for i in range(1, 101)
    ]


def test_records_to_sql_to_parquet_sink_then_read_by_reference(
    run_playbook: Runner, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_playbook(
        """\
        workload: {out: ""}
        workflow:
          - step: start
            tool:
              kind: python
              code: |
                result = {"orders": [{"id": i, "region": "north" if i % 3 == 0 else "south",
                                      "amount": i if i % 2 else i + 0.25} for i in range(1, 101)]}
            next: [totals]
          - step: totals
            tool:
              kind: spark
              inputs: {orders: "{{ start.orders }}"}
              sql: >-
                SELECT region, count(*) AS orders, sum(amount) AS revenue
                FROM orders GROUP BY region
              sink: {format: parquet, path: "{{ out }}/totals", mode: overwrite}
            next: [share]
          - step: share
            tool:
              kind: spark
              inputs: {totals: "{{ totals }}"}
              sql: >-
                SELECT region, orders, revenue, revenue / (SELECT sum(revenue) FROM totals) AS share
                FROM totals ORDER BY region
            next: [end]
          - step: end
            tool:
              kind: python
              input: {rows: "{{ share.preview }}", n: "{{ totals.row_count }}"}
              code: "result = {'n': n, 'rows': rows}"
        """,
        workload={"out": str(out)},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    expected: dict[str, list[float]] = {}
    for o in orders():
        expected.setdefault(str(o["region"]), [0, 0.0])
        expected[str(o["region"])][0] += 1
        expected[str(o["region"])][1] += float(o["amount"])
    total = sum(v[1] for v in expected.values())

    totals = result.step("totals")["result"]
    assert totals["uri"] == str(out / "totals")
    assert totals["format"] == "parquet"
    assert totals["row_count"] == 2
    assert totals["schema"] == [
        {"name": "region", "type": "string"},
        {"name": "orders", "type": "bigint"},
        {"name": "revenue", "type": "double"},
    ]
    # the sink really holds the rows (read without Spark)
    table = pq.read_table(out / "totals").to_pylist()
    assert {r["region"]: (r["orders"], r["revenue"]) for r in table} == {
        k: (v[0], pytest.approx(v[1])) for k, v in expected.items()
    }
    # the second step read the first one's result by reference: exact numbers
    rows = result.doc["result"]["rows"]
    assert result.doc["result"]["n"] == 2
    assert [r["region"] for r in rows] == ["north", "south"]
    for row in rows:
        count, revenue = expected[row["region"]]
        assert row["orders"] == count == (33 if row["region"] == "north" else 67)
        assert row["revenue"] == pytest.approx(revenue)
        assert row["share"] == pytest.approx(revenue / total)
    # without a sink, the result went to the execution's data folder
    share = result.step("share")["result"]
    eid = result.doc["execution_id"]
    assert share["uri"] == (result.home / "data" / eid / "share").absolute().as_uri()
    assert pq.read_table(result.home / "data" / eid / "share").num_rows == 2


def test_several_spark_steps_share_one_session(run_playbook: Runner) -> None:
    result = run_playbook(
        """\
        workflow:
          - step: start
            tool: {kind: spark, sql: "SELECT id FROM range(10)"}
            next: [second]
          - step: second
            tool: {kind: spark, inputs: {a: "{{ start }}"}, sql: "SELECT sum(id) AS s FROM a"}
            next: [third]
          - step: third
            tool:
              kind: spark
              inputs: {s: "{{ second }}"}
              code: |
                def main(spark, s):
                    return s.selectExpr("s * 2 AS doubled")
        """
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    assert result.step("third")["result"]["preview"] == [{"doubled": 90}]
    metas = [c["payload"]["spark"] for s in ("start", "second", "third") for c in result.calls(s)]
    assert len(metas) == 3
    assert sessions.starts == 1  # this whole test process has started one session
    assert {m["session_starts"] for m in metas} == {1}
    assert {m["app_id"] for m in metas} == {sessions.info.app_id if sessions.info else None}
    assert all(m["mode"] == "classic" and m["master"] == "local[*]" for m in metas)
    # each step's own Spark jobs are in its event, and no two steps share a job
    jobs = [set(m["jobs"]) for m in metas]
    assert all(jobs)
    assert not (jobs[0] & jobs[1] or jobs[1] & jobs[2] or jobs[0] & jobs[2])
    assert [m["rows_written"] for m in metas] == [10, 1, 1]


@pytest.mark.parametrize(
    ("tool", "condition"),
    [
        ('{kind: spark, sql: "SELEC 1"}', "PARSE_SYNTAX_ERROR"),
        (
            '{kind: spark, inputs: {a: [{"x": 1}]}, sql: "SELECT nope FROM a"}',
            "UNRESOLVED_COLUMN",
        ),
        (
            "{kind: spark, inputs: {a: {format: parquet, path: /nonexistent/flowtide}}, "
            'sql: "SELECT * FROM a"}',
            "PATH_NOT_FOUND",
        ),
    ],
)
def test_spark_errors_fail_the_step_and_the_session_stays_usable(
    run_playbook: Runner, tool: str, condition: str
) -> None:
    result = run_playbook(
        f"""\
        workflow:
          - step: start
            tool: {{kind: noop}}
            next: [transform]
          - step: transform
            tool: {tool}
            next: [end]
          - step: end
            tool: {{kind: noop}}
        """
    )
    assert result.doc["status"] == "failed"
    error = result.doc["error"]
    assert error["step"] == "transform"
    assert error["kind"] == "analysis_error"
    assert "spark step 'transform'" in error["message"]
    assert condition in error["message"]
    assert "JVM stacktrace" not in error["message"]
    [call] = result.calls("transform")
    assert call["type"] == "call.error"
    assert call["error"]["code"].startswith(condition)
    assert "end" not in {s for s, v in result.doc["steps"].items() if v["runs"]}
    # the shared session is still usable
    again = run_playbook(
        """\
        workflow:
          - step: start
            tool: {kind: spark, sql: "SELECT 41 + 1 AS answer"}
        """
    )
    assert again.doc["status"] == "completed"
    assert again.doc["result"]["preview"] == [{"answer": 42}]


def test_code_steps_return_a_dataframe_or_nothing(run_playbook: Runner, tmp_path: Path) -> None:
    marker = tmp_path / "side_effect"
    result = run_playbook(
        f"""\
        workflow:
          - step: start
            tool:
              kind: spark
              inputs: {{orders: [{{"c": "a", "v": 1}}, {{"c": "a", "v": 2}}, {{"c": "b", "v": 5}}]}}
              input: {{factor: 10}}
              code: |
                def main(spark, orders, factor):
                    print("rows in:", orders.count())
                    w = Window.partitionBy("c").orderBy(F.desc("v"))
                    return (orders.withColumn("rank", F.row_number().over(w))
                                  .withColumn("scaled", F.col("v") * factor)
                                  .orderBy("c", "rank"))
            next: [side]
          - step: side
            tool:
              kind: spark
              code: |
                spark.range(3).write.mode("overwrite").parquet("{marker}")
                result = None
        """
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    start = result.step("start")["result"]
    assert start["preview"] == [
        {"c": "a", "v": 2, "rank": 1, "scaled": 20},
        {"c": "a", "v": 1, "rank": 2, "scaled": 10},
        {"c": "b", "v": 5, "rank": 1, "scaled": 50},
    ]
    [call] = result.calls("start")
    printed = call["payload"]["stdout"].splitlines()
    assert [line for line in printed if not line.startswith("[spark] ")] == ["rows in: 3"]
    side = result.step("side")["result"]
    assert side == {"uri": None, "format": None, "schema": [], "row_count": None, "preview": []}
    assert pq.read_table(marker).num_rows == 3


def test_code_returning_something_else_is_a_clear_error(run_playbook: Runner) -> None:
    result = run_playbook(
        """\
        workflow:
          - step: start
            tool: {kind: spark, code: "def main(spark):\\n    return {'not': 'a frame'}"}
        """
    )
    assert result.doc["status"] == "failed"
    assert result.doc["error"]["kind"] == "config_error"
    assert "must return a DataFrame or None, not dict" in result.doc["error"]["message"]


def test_mixed_number_records_and_explicit_schemas(run_playbook: Runner) -> None:
    result = run_playbook(
        """\
        workflow:
          - step: start
            tool:
              kind: spark
              inputs:
                mixed: [{"a": 1}, {"a": 2.5}, {"a": null, "tag": "x"}]
                empty: {records: [], schema: "a DOUBLE"}
              sql: >-
                SELECT (SELECT sum(a) FROM mixed) AS total, (SELECT count(*) FROM mixed) AS n,
                       (SELECT count(*) FROM empty) AS none
            next: [bad]
          - step: bad
            tool: {kind: spark, inputs: {e: []}, sql: "SELECT * FROM e"}
        """
    )
    assert result.step("start")["result"]["preview"] == [{"total": 3.5, "n": 3, "none": 0}]
    assert result.doc["status"] == "failed"
    assert result.doc["error"]["kind"] == "config_error"
    assert "empty list" in result.doc["error"]["message"]
    assert "schema" in result.doc["error"]["message"]


def test_step_conf_applies_to_that_step_only(run_playbook: Runner) -> None:
    read_conf = (
        "def main(spark):\\n"
        "    return spark.createDataFrame("
        "[(spark.conf.get('spark.sql.shuffle.partitions'),)], 'p STRING')"
    )
    result = run_playbook(
        f"""\
        executor:
          spark:
            conf: {{spark.sql.shuffle.partitions: 7}}
        workflow:
          - step: start
            tool: {{kind: spark, conf: {{spark.sql.shuffle.partitions: 3}}, code: "{read_conf}"}}
            next: [after]
          - step: after
            tool: {{kind: spark, code: "{read_conf}"}}
        """
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    assert result.step("start")["result"]["preview"] == [{"p": "3"}]
    # the next step is back to the execution's session-wide setting
    assert result.step("after")["result"]["preview"] == [{"p": "7"}]


def test_parallel_loop_iterations_do_not_see_each_others_views(run_playbook: Runner) -> None:
    result = run_playbook(
        """\
        workflow:
          - step: start
            loop:
              in: [1, 2, 3, 4, 5, 6]
              iterator: x
              spec: {mode: parallel, max_in_flight: 6}
            tool:
              kind: spark
              inputs: {rows: "{{ [{'k': x}] * (x * 100) }}"}
              sql: SELECT first(k) AS k, count(*) AS n FROM rows
        """
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    results = result.step("start")["result"]["results"]
    assert [r["preview"] for r in results] == [[{"k": x, "n": x * 100}] for x in range(1, 7)]
    # each iteration has its own output folder
    assert len({r["uri"] for r in results}) == 6
    assert results[0]["uri"].endswith("/start/i0")


def test_cancel_stops_running_spark_jobs(run_playbook: Runner) -> None:
    seen: list[int] = []

    def running() -> bool:
        seen.extend(j for r in activity.snapshot() for j in r["jobs"])
        return bool(seen)

    t0 = time.monotonic()
    result = run_playbook(
        f"""\
        workflow:
          - step: start
            tool: {{kind: spark, sql: "{SLOW_SQL}"}}
        """,
        cancel_when=running,
        timeout=120,
    )
    assert time.monotonic() - t0 < 120  # the query alone would take hours
    assert result.doc["status"] == "cancelled"
    root = sessions._root
    assert root is not None
    tracker = root.sparkContext.statusTracker()
    deadline = time.monotonic() + 30
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tracker.getActiveJobsIds() == []
    # the job that was running when the execution was cancelled was stopped, not finished
    assert {tracker.getJobInfo(j).status for j in seen} == {"FAILED"}


def test_timeout_stops_the_step(run_playbook: Runner) -> None:
    t0 = time.monotonic()
    result = run_playbook(
        f"""\
        workflow:
          - step: start
            tool: {{kind: spark, timeout: 3, sql: "{SLOW_SQL}"}}
        """
    )
    assert time.monotonic() - t0 < 90
    assert result.doc["status"] == "failed"
    assert result.doc["error"]["kind"] == "timeout"
    assert "3 s" in result.doc["error"]["message"]


def test_csv_source_json_sink_and_reference(run_playbook: Runner, tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("city,temp\nOslo,3.5\nRome,19\nOslo,4.5\n")
    result = run_playbook(
        f"""\
        workflow:
          - step: start
            tool:
              kind: spark
              inputs: {{w: {{format: csv, path: "{data}"}}}}
              sql: SELECT city, avg(temp) AS t FROM w GROUP BY city
              sink: {{format: json, path: "{tmp_path / "avg"}", mode: overwrite}}
            next: [hot]
          - step: hot
            tool:
              kind: spark
              inputs: {{avg: "{{{{ start }}}}"}}
              sql: SELECT city FROM avg WHERE t > 10
        """
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    start = result.step("start")["result"]
    assert start["format"] == "json" and start["row_count"] == 2
    assert sorted((r["city"], r["t"]) for r in start["preview"]) == [("Oslo", 4.0), ("Rome", 19.0)]
    assert result.step("hot")["result"]["preview"] == [{"city": "Rome"}]


@pytest.mark.postgres
def test_jdbc_round_trip_through_postgres(run_playbook: Runner, pg_server: Any) -> None:
    import psycopg

    table = f"spark_jdbc_{int(time.time() * 1000)}"
    result = run_playbook(
        f"""\
        workflow:
          - step: start
            tool:
              kind: spark
              inputs: {{o: [{{"id": 1, "amount": 10.5}}, {{"id": 2, "amount": 4}}]}}
              sql: SELECT id, amount * 2 AS doubled FROM o
              sink: {{format: jdbc, table: public.{table}, auth: pg_test, mode: overwrite}}
            next: [back]
          - step: back
            tool:
              kind: spark
              inputs:
                fromref: "{{{{ start }}}}"
                fromsrc: {{format: jdbc, auth: pg_test, query: "SELECT sum(doubled) AS s FROM public.{table}"}}
              sql: SELECT (SELECT sum(doubled) FROM fromref) AS a, (SELECT first(s) FROM fromsrc) AS b
        """,
        credentials={"pg_test": pg_server.credential()},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    start = result.step("start")["result"]
    assert start["format"] == "jdbc" and start["table"] == f"public.{table}"
    assert start["uri"] == (
        f"jdbc:postgresql://{pg_server.host}:{pg_server.port}/{pg_server.database}"
    )
    assert start["auth"] == "pg_test" and start["row_count"] == 2
    assert result.step("back")["result"]["preview"] == [{"a": 29.0, "b": 29.0}]
    with psycopg.connect(pg_server.dsn) as conn:
        rows = conn.execute(f"SELECT id, doubled FROM public.{table} ORDER BY id").fetchall()
    assert rows == [(1, 21.0), (2, 8.0)]
    # The password reached Spark, and the log holds it only sealed: the event that adds it
    # to the execution's secret set reads back intact, the store's bytes never show it.
    added = [e for e in result.events if e["type"] == "secrets.added"]
    assert added and pg_server.password in added[0]["payload"]["values"]
    stored = b"".join(p.read_bytes() for p in result.home.glob("flowtide.db*") if p.is_file())
    assert pg_server.password.encode() not in stored
    assert pg_server.password not in json.dumps(result.doc)


def test_progress_view_shows_the_running_spark_job(tmp_path: Path) -> None:
    import asyncio

    from rich.console import Console

    from flowtide.playbook.loader import parse_playbook
    from flowtide.runtime.local import LocalRuntime
    from flowtide.runtime.progress import ProgressView
    from flowtide.store.sqlite import SQLiteStore

    from .conftest import HEADER

    text = HEADER + f'workflow:\n  - step: crunch\n    tool: {{kind: spark, sql: "{SLOW_SQL}"}}\n'
    playbook = parse_playbook(text, str(tmp_path / "pb.yaml"))
    store = SQLiteStore(tmp_path / "flowtide.db")
    console = Console(record=True, width=120, force_terminal=False)
    view = ProgressView(console, title="pb.yaml")
    seen: list[str] = []

    async def main() -> None:
        async with LocalRuntime(store, listener=view.on_events, data_dir=tmp_path / "data") as rt:
            eid = await rt.start(playbook)
            view.track(eid)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                runs = [r for r in activity.snapshot() if r["tasks_total"]]
                if runs:
                    console.print(view.render())
                    seen.append(console.export_text())
                    break
                await asyncio.sleep(0.1)
            await rt.cancel(eid)
            await rt.wait(eid, timeout=60)

    try:
        asyncio.run(main())
    finally:
        store.close()
    assert seen, "the spark job never showed up in the activity snapshot"
    screen = seen[0]
    assert "spark step" in screen and "crunch" in screen
    assert re.search(r"\d+/\d+", screen.split("spark step", 1)[1])  # tasks done/total


def test_a_traced_spark_step_is_a_child_span_and_its_driver_gets_the_traceparent(
    run_playbook: Runner,
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from flowtide import tracing
    from flowtide.tracing.sdk import recorder_with

    exporter = InMemorySpanExporter()
    tracing._install(recorder_with(exporter))
    try:
        result = run_playbook(
            """\
            workflow:
              - step: start
                tool:
                  kind: spark
                  code: |
                    def main(spark):
                        seen = spark.sparkContext.getLocalProperty("flowtide.traceparent")
                        return spark.createDataFrame([(seen,)], "seen string")
            """
        )
    finally:
        tracing._install(None)
    assert result.doc["status"] == "completed", result.doc["error"]
    [seen] = [row["seen"] for row in result.step("start")["result"]["preview"]]
    spans = {s.name: s for s in exporter.get_finished_spans()}
    spark, command = spans["spark"], spans["step start"]
    assert spark.context is not None and command.context is not None
    assert spark.parent is not None and spark.parent.span_id == command.context.span_id
    # The driver's jobs carry the spark span's own traceparent.
    assert seen == tracing.TraceContext(spark.context.trace_id, spark.context.span_id).header
    assert (spark.attributes or {})["flowtide.step"] == "start"


def test_a_spark_steps_output_says_what_spark_did(run_playbook: Runner, tmp_path: Path) -> None:
    """The step's output (its live log, and its call's `stdout` once it ended) carries
    `[spark]` lines: the session, each statement, progress of a job running longer than
    a second, what the driver logged meanwhile, and what was written."""
    result = run_playbook(
        """\
        workload: {out: ""}
        workflow:
          - step: talk
            tool:
              kind: spark
              code: |
                def main(spark):
                    jvm = spark.sparkContext._jvm
                    jvm.org.apache.logging.log4j.LogManager.getLogger("flowtide.test").warn(
                        "the driver says hello")
                    print("from the code")
                    return spark.range(0, 10)
              sink: {format: parquet, path: "{{ workload.out }}", mode: overwrite}
            next: [crunch]
          - step: crunch
            tool:
              kind: spark
              sql: |
                SELECT id, reflect('java.lang.Thread', 'sleep', 2000L) AS slept FROM range(0, 2, 1, 2)
        """,
        workload={"out": str(tmp_path / "o")},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    talk = "".join(c["payload"].get("stdout", "") for c in result.calls("talk"))
    assert "[spark] session local" in talk
    assert "[spark] driver: " in talk and "the driver says hello" in talk
    assert "from the code" in talk
    assert f"[spark] wrote 10 rows to {tmp_path / 'o'}" in talk
    crunch = "".join(c["payload"].get("stdout", "") for c in result.calls("crunch"))
    assert "[spark] statement 1/1: SELECT id, reflect(" in crunch
    # Its tasks sleep 2 s: at least one progress line, `stage N done/total tasks`.
    assert re.search(r"\[spark\] (job \d+: )?stage \d+ \d+/\d+ tasks", crunch), crunch
