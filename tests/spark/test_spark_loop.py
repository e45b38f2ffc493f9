"""`loop.spec.mode: spark`: a loop's items run as Spark tasks, on a real local Spark in
this process (the session the other spark tests share)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from flowtide.errors import PlaybookError
from flowtide.playbook.loader import parse_playbook
from jsonstub import JsonHandler
from payloads import event_problems

from .conftest import HEADER, KILLED_LOOP, Runner, cli_json, flowtide_cli

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

ITEMS = 20_000


def _loop(mode: str, *, extra: str = "", got: str = "square.results") -> str:
    return f"""\
        workload: {{n: 10}}
        workflow:
          - step: start
            tool:
              kind: python
              input: {{n: "{{{{ workload.n }}}}"}}
              code: |
                result = [{{"x": i, "name": f"item-{{i}}"}} for i in range(n)]
            next: [square]
          - step: square
            loop: {{in: "{{{{ start }}}}", iterator: row, spec: {{mode: {mode}{extra}}}}}
            tool:
              kind: python
              input: {{x: "{{{{ iter.row.x }}}}", i: "{{{{ loop_index }}}}", last: "{{{{ iter._last }}}}"}}
              code: |
                if x % 100 == 7:
                    raise ValueError(f"no {{x}}")
                result = {{"sq": x * x, "i": i, "last": last}}
              spec:
                policy:
                  rules:
                    - when: "{{{{ output.status == 'error' }}}}"
                      then: {{do: continue}}
            set: {{ctx.ended: "{{{{ loop }}}}"}}
            next: [end]
          - step: end
            tool:
              kind: python
              input: {{got: "{{{{ {got} }}}}", stats: "{{{{ square.stats }}}}", ended: "{{{{ ctx.ended }}}}"}}
              code: |
                result = {{"got": got, "stats": stats, "ended": ended}}
        """


def test_a_spark_loop_gives_the_next_step_what_a_parallel_loop_gives(
    run_playbook: Runner,
) -> None:
    spark = run_playbook(_loop("spark", extra=", partitions: 3"), workload={"n": 1000})
    parallel = run_playbook(_loop("parallel"), workload={"n": 1000})
    assert spark.doc["status"] == "completed", spark.doc["error"]
    assert parallel.doc["status"] == "completed", parallel.doc["error"]
    assert spark.doc["result"] == parallel.doc["result"]
    got = spark.doc["result"]["got"]
    assert len(got) == 1000 and got[1] == {"sq": 1, "i": 1, "last": False}
    # `loop` on the step's own `set`, as it ended: the same as a parallel loop's.
    assert spark.doc["result"]["ended"] == {
        "index": 999,
        "first": False,
        "length": 1000,
        "done": True,
    }
    assert got[999] == {"sq": 999 * 999, "i": 999, "last": True}
    # An item's error is its result (the envelope's error), counted as failed.
    assert spark.doc["result"]["stats"] == {"total": 1000, "success": 990, "failed": 10}
    # The step's log, numbers as `flowtide status` writes them.
    call = next(e for e in spark.events if e["type"] == "call.done" and e["step"] == "square")
    log = call["payload"]["stdout"]
    assert "[spark] loop over 1,000 items in 3 partitions" in log, log
    assert "[spark] items: 990 ok, 10 failed of 1,000" in log, log
    # One command for the loop: a handful of events, not ~8 per item (besides its
    # progress, one every 2 s while the job runs: how many depends on the machine's load).
    square_events = [e for e in spark.events if e["step"] == "square"]
    assert len([e for e in square_events if e["type"] != "command.progress"]) <= 7
    square = spark.step("square")["result"]
    assert square["row_count"] == 1000 and square["format"] == "parquet"
    assert [c["name"] for c in square["schema"]] == ["index", "status", "result", "error", "action"]


def test_twenty_thousand_items_exact_by_reference(run_playbook: Runner) -> None:
    """Over `results_max` the result is the reference and the stats: the dataset holds
    one row per index, and the sum is exact."""
    result = run_playbook(
        _loop("spark", extra=", results_max: 1000", got="square.row_count"), workload={"n": ITEMS}
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    assert result.doc["result"]["got"] == ITEMS
    square = result.step("square")["result"]
    assert "results" not in square
    assert square["stats"] == {
        "total": ITEMS,
        "success": ITEMS - ITEMS // 100,
        "failed": ITEMS // 100,
    }
    table = pq.read_table(square["uri"].removeprefix("file://"))
    index = table.column("index").to_pylist()
    assert sorted(index) == list(range(ITEMS))
    sums = 0
    for status, raw in zip(
        table.column("status").to_pylist(), table.column("result").to_pylist(), strict=True
    ):
        if status == "ok":
            sums += json.loads(raw)["sq"]
    assert sums == sum(x * x for x in range(ITEMS) if x % 100 != 7)
    errors = [json.loads(e) for e in table.column("error").to_pylist() if e]
    assert len(errors) == ITEMS // 100 and errors[0]["kind"] == "python_error"


def test_retried_items_count_once_as_success(run_playbook: Runner, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    result = run_playbook(
        """\
        workload: {marks: ""}
        workflow:
          - step: work
            loop: {in: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], iterator: x, spec: {mode: spark, partitions: 2}}
            tool:
              kind: python
              input: {x: "{{ iter.x }}", marks: "{{ workload.marks }}"}
              code: |
                import os
                mark = os.path.join(marks, str(x))
                if x % 3 == 0 and not os.path.exists(mark):
                    open(mark, "w").close()
                    raise RuntimeError("first try fails")
                result = x * 10
              spec:
                policy:
                  rules:
                    - when: "{{ output.status == 'error' }}"
                      then: {do: retry, attempts: 3, backoff: 0.01}
        """,
        workload={"marks": str(marks)},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    work = result.step("work")["result"]
    assert work["stats"] == {"total": 10, "success": 10, "failed": 0}
    assert work["results"] == [x * 10 for x in range(10)]
    assert sorted(p.name for p in marks.iterdir()) == ["0", "3", "6", "9"]


def test_an_item_that_fails_fails_the_loop_with_its_index(run_playbook: Runner) -> None:
    result = run_playbook(
        """\
        workflow:
          - step: work
            loop: {in: "{{ [1, 2, 0, 4, 0] }}", iterator: x, spec: {mode: spark}}
            tool:
              kind: python
              input: {x: "{{ iter.x }}"}
              code: "result = 10 // x"
        """
    )
    assert result.doc["status"] == "failed"
    error = result.doc["error"]
    assert error["step"] == "work" and error["kind"] == "python_error"
    assert error["message"].startswith("item 2: ") and "ZeroDivisionError" in error["message"]
    # Item 4 failed too: said, with where to read every item's row.
    eid = result.doc["execution_id"]
    assert error["message"].endswith(
        f" (1 more item failed: their rows are in `flowtide data {eid} work`)"
    ), error["message"]


def test_items_from_a_spark_steps_result_and_from_a_source(
    run_playbook: Runner, tmp_path: Path
) -> None:
    """A dataset's rows are the items: dicts for rows, values for a one-column source."""
    result = run_playbook(
        """\
        workload: {out: ""}
        workflow:
          - step: make
            tool:
              kind: spark
              sql: SELECT id AS x, concat('n', id) AS name FROM range(0, 50)
              sink: {format: parquet, path: "{{ workload.out }}/rows", mode: overwrite}
            next: [rows]
          - step: rows
            loop: {in: "{{ make }}", iterator: r, spec: {mode: spark, partitions: 4}}
            tool: {kind: python, input: {r: "{{ iter.r }}"}, code: "result = r['name'] + ':' + str(r['x'] * 2)"}
            next: [names]
          - step: names
            tool:
              kind: spark
              sql: SELECT id FROM range(0, 5)
              sink: {format: json, path: "{{ workload.out }}/ids", mode: overwrite}
            next: [values]
          - step: values
            loop:
              in: {format: json, path: "{{ workload.out }}/ids"}
              iterator: v
              spec: {mode: spark}
            tool: {kind: python, input: {v: "{{ iter.v }}"}, code: "result = v + 100"}
            next: [typed]
          - step: typed
            tool:
              kind: spark
              sql: >-
                SELECT id AS x, IF(id = 1, NULL, 'n') AS name, DATE '2026-01-02' AS d,
                CAST(1.5 AS DECIMAL(4, 2)) AS m FROM range(0, 3)
            next: [mixed]
          - step: mixed
            loop: {in: "{{ typed }}", iterator: r, spec: {mode: spark}}
            tool: {kind: python, input: {r: "{{ iter.r }}"}, code: "result = r"}
        """,
        workload={"out": str(tmp_path)},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    rows = result.step("rows")["result"]
    assert sorted(rows["results"]) == sorted(f"n{i}:{i * 2}" for i in range(50))
    assert rows["stats"] == {"total": 50, "success": 50, "failed": 0}
    values = result.step("values")["result"]
    assert sorted(values["results"]) == [100, 101, 102, 103, 104]
    # Dates and decimals arrive as JSON gives them; a null column is None, not missing.
    mixed = result.step("mixed")["result"]["results"]
    assert sorted(mixed, key=lambda r: r["x"]) == [
        {"x": i, "name": None if i == 1 else "n", "d": "2026-01-02", "m": 1.5} for i in range(3)
    ]


def test_parquet_items_are_numbered_by_file_name_then_row_and_read_by_the_tasks(
    run_playbook: Runner, tmp_path: Path
) -> None:
    """Parquet files on this disk: the tasks read their row groups themselves (no job
    counts the rows first); indexes follow the files in name order, then their rows,
    whatever slices of row groups the tasks got."""
    import pyarrow as pa

    data = tmp_path / "items"
    data.mkdir()
    # Written out of name order, with row groups of 7 rows; an empty file; Spark's
    # marker files, which are not data.
    values = {"b.parquet": list(range(100, 130)), "a.parquet": [1, 2, 3, 4, 5], "c.parquet": []}
    for name, xs in values.items():
        table = pa.table(
            {"v": pa.array(xs, pa.int64()), "s": pa.array([f"s{x}" for x in xs], pa.string())}
        )
        pq.write_table(table, data / name, row_group_size=7)
    (data / "_SUCCESS").touch()
    (data / ".notes").write_bytes(b"x")
    result = run_playbook(
        """\
        workload: {data: ""}
        workflow:
          - step: rows
            loop:
              in: {format: parquet, path: "{{ workload.data }}"}
              iterator: r
              spec: {mode: spark, partitions: 4}
            tool:
              kind: python
              input: {r: "{{ iter.r }}", i: "{{ loop_index }}"}
              code: "result = [i, r['v'], r['s']]"
        """,
        workload={"data": str(data)},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    rows = result.step("rows")["result"]
    expected = [*values["a.parquet"], *values["b.parquet"]]
    assert rows["results"] == [[i, v, f"s{v}"] for i, v in enumerate(expected)]
    assert rows["stats"] == {"total": 35, "success": 35, "failed": 0}
    # The loop's own rows: a file per task, in index order, and nothing else left.
    out = Path(rows["uri"].removeprefix("file://"))
    assert sorted(p.name for p in out.iterdir()) == [
        "_SUCCESS",
        *(f"part-0000{t}.parquet" for t in range(4)),
    ]
    assert pq.read_table(out).column("index").to_pylist() == list(range(35))
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []
    assert rows["preview"][0] == {
        "index": 0,
        "status": "ok",
        "result": '[0,1,"s1"]',
        "error": None,
        "action": "continue",
    }


def test_a_task_whose_python_worker_dies_is_run_again_and_counted_once(tmp_path: Path) -> None:
    """A local master that retries tasks (`local[2,2]`): an item kills its python worker
    on the task's first attempt; Spark runs the task again, the loop keeps the rows of
    the attempt that answered, and every index is there once."""
    marks = tmp_path / "marks"
    marks.mkdir()
    book = tmp_path / "killed.yaml"
    book.write_text(KILLED_LOOP)
    home = tmp_path / "home"
    env = {"FLOWTIDE_SPARK_MASTER": "local[2,2]"}
    doc = cli_json("run", str(book), "--set", f"marks={marks}", home=home, env=env)
    assert doc["status"] == "completed", doc["error"]
    work = json.loads(flowtide_cli("status", doc["execution_id"], "--json", home=home).stdout)
    result = work["steps"]["work"]["result"]
    assert result["stats"] == {"total": 600, "success": 600, "failed": 0}
    assert result["results"] == [x * x for x in range(600)]
    out = Path(result["uri"].removeprefix("file://"))
    assert pq.read_table(out).column("index").to_pylist() == list(range(600))
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []
    # The dead attempt's items ran twice (at-least-once side effects), the others once.
    runs = {int(p.name): len(p.read_text()) for p in marks.iterdir() if p.name != "died"}
    assert sorted(runs) == list(range(600))
    assert runs[300] == 2 and runs[0] == 1 and runs[599] == 1


def test_a_source_that_cannot_be_read_names_the_step_and_loop_in(
    run_playbook: Runner, tmp_path: Path
) -> None:
    result = run_playbook(
        """\
        workload: {path: ""}
        workflow:
          - step: rows
            loop: {in: {format: csv, path: "{{ workload.path }}"}, iterator: r, spec: {mode: spark}}
            tool: {kind: python, input: {r: "{{ iter.r }}"}, code: "result = r"}
        """,
        workload={"path": str(tmp_path / "missing.csv")},
    )
    assert result.doc["status"] == "failed"
    error = result.doc["error"]
    assert error["step"] == "rows" and error["kind"] == "analysis_error", error
    assert error["message"].startswith("step 'rows', field 'loop.in': cannot read the items: ")
    assert "missing.csv" in error["message"] and "spark step" not in error["message"]


def test_the_loader_says_what_a_spark_loop_takes(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError) as err:
        parse_playbook(
            HEADER
            + """\
workflow:
  - step: s
    loop: {in: [1], iterator: x, spec: {mode: spark}}
    tool: {kind: shell, command: "echo hi"}
  - step: t
    loop: {in: [1], iterator: x, spec: {mode: parallel, partitions: 4}}
    tool: {kind: noop}
  - step: u
    loop: {in: [1], iterator: x, spec: {mode: spark, partitions: 0}}
    tool: {kind: python, code: "result = 1"}
""",
            str(tmp_path / "pb.yaml"),
        )
    text = str(err.value)
    assert "a 'mode: spark' loop runs one python or http tool per item" in text
    assert "loop 'spec.partitions' applies to 'mode: spark' only" in text
    # Each says what to do instead.
    assert "(this step has: shell); for other tools, or several, use 'mode: parallel'" in text
    assert "remove it, or set 'spec.mode: spark'" in text
    assert "got 0 (expected an integer >= 1, or no 'partitions' for the default)" in text


class _Slow(JsonHandler):
    """Answers `{"n": N}` after 0.2 s, counting the requests in flight at once."""

    lock = threading.Lock()
    now = 0
    most = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        cls = type(self)
        with cls.lock:
            cls.now += 1
            cls.most = max(cls.most, cls.now)
        time.sleep(0.2)
        with cls.lock:
            cls.now -= 1
        n = int(self.path.rsplit("/", 1)[-1])
        self.reply({"n": n, "double": n * 2})


def test_an_http_body_runs_max_in_flight_items_at_once_per_partition(
    run_playbook: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # A flowtide setting holding a secret stays out of the items' environment.
    monkeypatch.setenv("FLOWTIDE_TOKEN_FOR_TEST", "s3cret-token")
    try:
        result = run_playbook(
            f"""\
            workflow:
              - step: fetch
                loop: {{in: "{{{{ range(12) | list }}}}", iterator: n, spec: {{mode: spark, partitions: 1, max_in_flight: 4}}}}
                tool:
                  kind: http
                  url: "http://127.0.0.1:{server.server_port}/n/{{{{ iter.n }}}}"
                next: [env]
              - step: env
                loop: {{in: [1], iterator: n, spec: {{mode: spark}}}}
                tool:
                  kind: python
                  code: |
                    import os
                    result = sorted(
                        k for k in os.environ
                        if k.startswith("FLOWTIDE_TOKEN") or k == "PYTHON_WORKER_FACTORY_SECRET"
                    )
            """
        )
    finally:
        server.shutdown()
        server.server_close()
    assert result.doc["status"] == "completed", result.doc["error"]
    fetched = result.step("fetch")["result"]["results"]
    assert [r["data"]["double"] for r in fetched] == [n * 2 for n in range(12)]
    assert _Slow.most == 4
    assert result.step("env")["result"]["results"] == [[]]


def test_items_done_are_reported_while_the_job_runs(run_playbook: Runner) -> None:
    """`command.progress` while the job runs (a task at a time, at most every 2 s), the
    exact counts in the last; the execution's document, summary and `flowtide status`
    show them."""
    result = run_playbook(
        """\
        workflow:
          - step: slow
            loop: {in: "{{ range(48) | list }}", iterator: x, spec: {mode: spark, partitions: 12}}
            tool:
              kind: python
              input: {x: "{{ iter.x }}"}
              code: |
                import time
                time.sleep(0.05)
                if x == 5:
                    raise ValueError("five")
                result = x
              spec:
                policy:
                  rules:
                    - when: "{{ output.status == 'error' }}"
                      then: {do: continue}
        """
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    progress = [e for e in result.events if e["type"] == "command.progress"]
    assert event_problems(progress) == []  # as engine.events.PAYLOADS says
    # None done as it starts (a resumed loop's count is its own, not the last attempt's),
    # one while it ran at least, and the last.
    assert len(progress) >= 3, progress
    start, during, last = progress[0], progress[1:-1], progress[-1]
    assert {k: start["payload"][k] for k in ("done", "total", "per_second")} == {
        "done": 0,
        "total": 48,
        "per_second": 0.0,
    }
    # (All 48 may be counted before the job has committed its rows.)
    assert all(0 < e["payload"]["done"] <= 48 and e["payload"]["total"] == 48 for e in during)
    assert all(e["payload"]["per_second"] > 0 for e in progress[1:])
    assert [e["payload"]["done"] for e in during] == sorted({e["payload"]["done"] for e in during})
    assert {k: last["payload"][k] for k in ("done", "total", "failed")} == {
        "done": 48,
        "total": 48,
        "failed": 1,
    }
    # Reported before the command's end, which comes after its last progress.
    kinds = [e["type"] for e in result.events if e["step"] == "slow"]
    assert kinds.index("command.completed") > kinds.index("command.progress")
    # The job's call.done is timed as it ended, as any call's: after the progress it made.
    done = next(e for e in result.events if e["type"] == "call.done" and e["step"] == "slow")
    assert done["time"] >= during[-1]["time"]
    items = result.step("slow")["items"]
    assert items["done"] == 48 and items["total"] == 48 and items["failed"] == 1

    from flowtide.documents.summary import execution_summary
    from flowtide.engine.events import Event
    from flowtide.engine.state import fold

    playbook = parse_playbook((result.home.parent / "pb.yaml").read_text(), "pb.yaml")
    state = fold(
        playbook,
        int(result.doc["execution_id"]),
        [Event.from_dict(e) for e in result.events],
    )
    summary = execution_summary(state)
    loop = summary["steps"]["slow"]["loop"]
    assert loop is not None
    assert (loop["total"], loop["done"], loop["succeeded"], loop["failed"]) == (48, 48, 47, 1)
    assert summary["progress"]["iterations"] == 48
    assert summary["progress"]["iterations_done"] == 48

    status = flowtide_cli("status", result.doc["execution_id"], home=result.home)
    assert status.returncode == 0, status.stderr
    assert "48/48" in status.stdout and "1 failed" in status.stdout, status.stdout
    printed = flowtide_cli("events", result.doc["execution_id"], home=result.home)
    assert "command.progress" in printed.stdout and "items=48/48" in printed.stdout


def test_a_partition_starts_no_item_once_the_stop_marker_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a python worker runs (no JVM): the driver marks a cancelled loop stopped, and
    # the items of its tasks, still running until Spark kills them, start no more (the
    # marker is looked for every 50 ms: here before each item). Meanwhile the partition
    # writes how many items it ran, which the driver adds up for the loop's progress.
    import pyarrow as pa

    from flowtide.spark import loopmarks, partition
    from flowtide.spark.partition import run_partition

    monkeypatch.setattr(partition, "LOOK_SECONDS", 0.0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # The partition keeps of its process's environment what an item may see: this one's
    # comes back after.
    saved = dict(os.environ)

    marks, base = tmp_path / "marks", loopmarks.make("stopped")
    stop = os.path.join(base, "stop")
    marks.mkdir()
    text = f"""\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: stopped, path: tests/stopped}}
workflow:
  - step: work
    loop: {{in: "{{{{ range(4) | list }}}}", iterator: x, spec: {{mode: spark}}}}
    tool:
      kind: python
      input: {{x: "{{{{ iter.x }}}}"}}
      code: |
        open("{marks}/" + str(x), "w").close()
        if x == 1:
            open("{stop}", "w").close()
        result = x
"""
    plan = {
        **{"key": "stopped", "marks": base, "text": text, "file": None, "step": "work"},
        **{"iterator": "x", "size": 4, "unwrap": None, "items": [0, 1, 2, 3]},
        **{"base": {}, "ctx": {}, "execution_id": 1, "max_in_flight": 1, "data_dir": None},
    }
    batch = pa.RecordBatch.from_arrays([pa.array([0, 1, 2, 3])], names=["index"])
    try:
        with pytest.raises(RuntimeError, match="the loop was stopped"):
            list(run_partition(plan, iter([batch])))
        assert sorted(p.name for p in marks.iterdir()) == ["0", "1"]
        assert loopmarks.read_done(base) == 2
        loopmarks.forget(base)
        assert loopmarks.read_done(base) is None
        # Without the marker (its item leaves it again) every item runs.
        (rows,) = run_partition({**plan, "key": "again", "marks": None}, iter([batch]))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert rows.column(0).to_pylist() == [0, 1, 2, 3]


def test_warming_starts_a_python_worker_per_task_slot(run_playbook: Runner) -> None:
    """A playbook with a spark loop warms the session's python workers (the embedded
    runtime's `warm`): one job of a task per slot, outside any run's job group, whose
    tasks load what a loop's task imports."""
    from flowtide.spark.direct import _warm_worker, warm_workers
    from flowtide.spark.session import sessions

    result = run_playbook(
        """\
        workflow:
          - step: work
            loop: {in: [1, 2, 3], iterator: x, spec: {mode: spark}}
            tool: {kind: python, input: {x: "{{ iter.x }}"}, code: "result = x"}
        """
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    spark = sessions._root
    assert spark is not None
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    warm_workers(spark)
    [job] = set(tracker.getJobIdsForGroup(None)) - before
    info = tracker.getJobInfo(job)
    assert info.status == "SUCCEEDED"
    stage = tracker.getStageInfo(info.stageIds[-1])
    assert stage.numTasks == spark.sparkContext.defaultParallelism
    import pyarrow as pa

    batch = pa.RecordBatch.from_arrays([pa.array([0, 1], pa.int64())], ["id"])
    [ready] = list(_warm_worker(iter([batch])))
    assert ready.column(0).to_pylist() == [1, 1]


def test_a_failed_direct_job_leaves_no_files_and_no_output(run_playbook: Runner) -> None:
    """A task that fails for good (its python worker dies; this local master runs a task
    once): the loop fails naming Spark's error, and neither the attempts' files nor an
    output folder are left in the execution's data folder."""
    result = run_playbook(
        """\
        workflow:
          - step: work
            loop: {in: "{{ range(40) | list }}", iterator: x, spec: {mode: spark, partitions: 4}}
            tool:
              kind: python
              input: {x: "{{ iter.x }}"}
              code: |
                import os
                if x == 25:
                    os._exit(3)
                result = x
        """
    )
    assert result.doc["status"] == "failed"
    error = result.step("work")["error"]
    assert error["kind"] == "spark_error", error
    data = result.home / "data" / str(result.doc["execution_id"])
    left = sorted(str(p.relative_to(data)) for p in data.rglob("*")) if data.exists() else []
    assert [p for p in left if "work" in p] == []
