"""A step's detail for the UI (`flowtide.documents.step`): its YAML source cut at the next
step, its result or only its size, its newest calls, the Spark run and dataset of a
Spark step, masking; and the catalog editor's check of a playbook text."""

from __future__ import annotations

from flowtide.documents.checks import check_playbook
from flowtide.documents.step import MAX_RESULT_BYTES, step_document, step_source
from flowtide.engine.events import Event
from flowtide.playbook.loader import parse_playbook

from .driver import Driver

FLOW = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: details, path: tests/details}
workload: {n: 2}
workflow:
  - step: start
    # a comment inside the step stays with it
    tool: {kind: python, code: "result = 1"}

    next: [load]
  - step: load
    tool:
      kind: spark
      code: "result = spark.range(3)"
    next: [end]
  - step: end
workbook: []
"""


def test_a_steps_source_is_its_entry_and_nothing_after() -> None:
    playbook = parse_playbook(FLOW, "flow.yaml")
    line, text = step_source(playbook, "start")
    assert line == 6
    assert text.splitlines() == [
        "  - step: start",
        "    # a comment inside the step stays with it",
        '    tool: {kind: python, code: "result = 1"}',
        "",
        "    next: [load]",
    ]
    assert step_source(playbook, "load")[1].splitlines()[-1] == "    next: [end]"
    # The last step ends where the next top-level key starts.
    assert step_source(playbook, "end") == (16, "  - step: end")


SPARK_META = {
    "master": "local[*]",
    "mode": "classic",
    "app_id": "local-1",
    "version": "4.0.0",
    "ui_url": "http://127.0.0.1:4040",
    "jobs": [0, 1],
    "rows_written": 3,
    "uri": "file:///data/load",
    "duration_ms": 812.5,
    "phases_ms": {"run": 700},
}


def _call(eid: int, step: str, event_id: int, **payload: object) -> Event:
    return Event(event_id, eid, "call.done", step, "ok", {"task": step, "attempt": 1, **payload})


def test_a_spark_steps_detail_has_its_run_and_dataset_and_the_rest_is_masked() -> None:
    reference = {
        "uri": "file:///data/load",
        "format": "parquet",
        "schema": [{"name": "id", "type": "bigint"}, {"name": "token", "type": "string"}],
        "row_count": 3,
        "preview": [{"id": 0, "token": "s3cr3t-value-1"}, {"id": 1, "token": "plain"}],
    }

    def respond(driver: Driver, command: object) -> dict[str, object]:
        return {"result": reference if command.step == "load" else 1}  # type: ignore[attr-defined]

    driver = Driver(FLOW, respond=respond).run()
    state = driver.state
    state.secrets = frozenset({"s3cr3t-value-1"})
    eid = state.execution_id
    calls = [_call(eid, "load", 900 + i, spark=SPARK_META, duration_ms=10.0 + i) for i in range(12)]
    doc = step_document(state, "load", calls)
    assert doc["status"] == "completed" and doc["kind"] == "spark" and doc["line"] == 11
    assert len(doc["calls"]) == 10 and doc["calls"][0]["event_id"] == "911"  # newest first
    assert doc["calls"][0]["duration_ms"] == 21.0 and "spark" in doc["calls"][0]["meta"]
    spark = doc["spark"]
    assert spark["master"] == "local[*]" and spark["jobs"] == [0, 1] and spark["rows_written"] == 3
    assert spark["format"] == "parquet" and spark["row_count"] == 3
    assert [c["name"] for c in spark["schema"]] == ["id", "token"]
    assert "phases_ms" not in spark
    # A value of the execution's secret set never leaves unmasked, preview included.
    assert spark["preview"][0]["token"] == "***" and spark["preview"][1]["token"] == "plain"
    assert doc["result"]["preview"][0]["token"] == "***"
    assert step_document(state, "start", [])["spark"] is None


def test_a_result_too_large_to_show_is_named_by_its_size() -> None:
    big = "x" * (MAX_RESULT_BYTES + 1)
    driver = Driver(FLOW, respond=lambda d, c: {"result": big}).run()
    doc = step_document(driver.state, "start", [])
    assert doc["result"] is None and doc["result_truncated"] is True
    assert doc["result_size"] == MAX_RESULT_BYTES + 3  # with the JSON quotes
    small = Driver(FLOW, respond=lambda d, c: {"result": "ok"}).run()
    assert step_document(small.state, "start", [])["result"] == "ok"


def test_checking_a_playbook_names_every_error_with_its_line() -> None:
    good = check_playbook(FLOW, "flow.yaml")
    assert good["valid"] and good["name"] == "details" and good["workload"] == {"n": 2}
    assert good["errors"] == [] and good["steps"] == 3
    bad = check_playbook(FLOW.replace("next: [end]", "next: [nowhere]"), "flow.yaml")
    assert not bad["valid"] and bad["workload"] is None
    assert [(e["line"], e["step"]) for e in bad["errors"]] == [(15, "load")]
    assert "nowhere" in bad["errors"][0]["message"]
    deep = check_playbook("[" * 100_000, None)
    assert not deep["valid"] and deep["errors"][0]["line"] is not None


def test_a_checked_text_is_kept_and_each_caller_gets_its_own_copy() -> None:
    first = check_playbook(FLOW, "kept.yaml")
    first["workload"]["n"] = 99  # a caller changing its copy changes nobody else's
    again = check_playbook(FLOW, "kept.yaml")
    assert again["workload"] == {"n": 2}
    # The file is part of the key: errors name it.
    assert check_playbook(FLOW, "other.yaml") == again
