"""A spark step's log once it is interrupted (Ctrl-C, a cancel, its timeout): a line says
so, and the driver's account of the jobs it stops (a stack trace per killed task) is
counted, not copied; what the driver logged before is copied as ever."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowtide.spark import activity
from flowtide.spark.activity import SparkRun


class _Session:
    interrupted: list[str]

    def __init__(self) -> None:
        self.interrupted = []

    def addTag(self, tag: str) -> None:  # noqa: N802 - Spark's name
        pass

    def removeTag(self, tag: str) -> None:  # noqa: N802 - Spark's name
        pass

    def registerProgressHandler(self, handler: Any) -> None:  # noqa: N802 - Spark's name
        pass

    def interruptTag(self, tag: str) -> None:  # noqa: N802 - Spark's name
        self.interrupted.append(tag)


def test_an_interrupted_runs_log_says_so_without_the_jvms_stack_traces(tmp_path: Path) -> None:
    driver = tmp_path / "driver.log"
    driver.write_text("")
    session = _Session()
    run = SparkRun("interrupted-log", 5, "work", session, True, driver_log=str(driver), stdout=[])
    activity.begin(run)
    with open(driver, "a") as f:
        f.write("INFO a line before the cancel\n")
    activity.interrupt(run, "cancelled")
    with open(driver, "a") as f:
        f.write("ERROR Utils: Aborting task\norg.apache.spark.TaskKilledException: x\n")
        f.writelines("\tat org.apache.spark.Some.frame(Some.scala:1)\n" for _ in range(40))
    activity.end(run)
    shown = "".join(run.stdout or [])
    assert session.interrupted == ["interrupted-log"]
    assert shown.startswith("[spark] driver: INFO a line before the cancel\n"), shown
    assert "[spark] cancelled: stopping its Spark jobs\n" in shown
    assert "TaskKilledException" not in shown and "\tat " not in shown
    assert (
        f"[spark] driver: 42 lines logged as its jobs were stopped, not copied (see {driver})"
        in shown
    )
    assert len(run.stdout or []) == 3


def test_a_run_stopped_with_its_process_says_so(tmp_path: Path) -> None:
    run = SparkRun("stopping-log", 6, "work", _Session(), True, stdout=[])
    activity.begin(run)
    assert activity.cancel_all() >= 1
    activity.end(run)
    assert run.stdout == [
        "[spark] cancelled: stopping its Spark jobs (the process running it is stopping)\n"
    ]
