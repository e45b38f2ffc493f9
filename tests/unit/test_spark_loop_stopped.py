"""A spark loop whose job stopped before its end (its run's process died, or it was
cancelled) is shown with the items it had done and no items per second: the rate of a
job that runs no more is not news. While it runs, and once its exact counts came, the
rate is shown."""

from __future__ import annotations

from typing import Any

from flowtide.cli.executions import _items
from flowtide.documents.execution import as_interrupted, shown_items
from flowtide.documents.summary import as_interrupted as summary_interrupted

RUNNING = {"done": 4912, "total": 200_000, "per_second": 327.4}
FINAL = {"done": 48, "total": 48, "per_second": 30.0, "failed": 1}


def test_the_status_table_shows_no_rate_for_a_job_that_stopped() -> None:
    assert _items(RUNNING, "running") == "4,912/200,000 (327/s)"
    assert _items(RUNNING, "interrupted") == "4,912/200,000 when it stopped"
    assert _items(RUNNING, "cancelled") == "4,912/200,000 when it stopped"
    assert _items(FINAL, "completed") == "48/48 (30/s), 1 failed"
    assert _items(FINAL, "failed") == "48/48 (30/s), 1 failed"


def test_documents_of_an_interrupted_run_have_no_rate() -> None:
    step: dict[str, Any] = {
        "status": "running", "runs": 1, "attempts": 0, "retries": 0,
        "result": None, "error": None, "items": dict(RUNNING),
    }  # fmt: skip
    doc: Any = {"execution_id": "1", "status": "running", "steps": {"work": step}}
    shown = as_interrupted(doc)["steps"]["work"]
    assert shown["status"] == "interrupted"
    assert shown["items"] == {"done": 4912, "total": 200_000, "per_second": 0.0}
    assert shown_items(RUNNING, "running") == RUNNING
    assert shown_items(RUNNING, "cancelled")["per_second"] == 0.0
    assert shown_items(FINAL, "failed") == FINAL

    loop = {
        "instance": 1, "total": 200_000, "done": 4912, "succeeded": 4912, "failed": 0,
        "in_flight": 0, "finished": False, "cursor": False, "per_second": 327.4,
    }  # fmt: skip
    summary: Any = {"status": "running", "steps": {"work": {"status": "running", "loop": loop}}}
    stopped = summary_interrupted(summary, 12.0)["steps"]["work"]
    assert stopped["status"] == "interrupted"
    assert stopped["loop"]["per_second"] == 0.0 and stopped["loop"]["done"] == 4912
    # Another loop's summary has no rate to stop.
    plain = {k: v for k, v in loop.items() if k != "per_second"}
    other: Any = {"status": "running", "steps": {"each": {"status": "running", "loop": plain}}}
    assert "per_second" not in summary_interrupted(other, 12.0)["steps"]["each"]["loop"]


def test_a_stopped_spark_loop_says_a_resume_runs_its_items_again() -> None:
    from flowtide.cli.executions import _stopped_spark_loops
    from flowtide.documents.summary import _items_loop
    from flowtide.engine.state import StepRecord

    doc: Any = {
        "steps": {
            "work": {"status": "interrupted", "items": dict(RUNNING)},
            "done": {"status": "completed", "items": dict(FINAL)},
            "plain": {"status": "interrupted"},
        }
    }
    assert _stopped_spark_loops(doc) == ["work"]
    rec = StepRecord()
    rec.status, rec.items = "cancelled", dict(RUNNING)
    loop = _items_loop(rec, False)
    assert loop["exact"] is False and loop["per_second"] == 0.0 and loop["done"] == 4912
    rec.status, rec.items = "completed", dict(FINAL)
    assert _items_loop(rec, True)["exact"] is True
