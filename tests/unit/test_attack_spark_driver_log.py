"""The driver's log lines copied to a spark step's log: never those written while a
spark step of another execution ran on the same driver (they may hold its data or
secrets, which this execution's log does not mask)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from flowtide.spark import activity
from flowtide.spark.activity import SparkRun

_tags = itertools.count()


class _Session:
    def addTag(self, tag: str) -> None:  # noqa: N802 - Spark's name
        pass

    def removeTag(self, tag: str) -> None:  # noqa: N802 - Spark's name
        pass

    def registerProgressHandler(self, handler: Any) -> None:  # noqa: N802 - Spark's name
        pass


def _run(execution_id: int, driver_log: Path) -> SparkRun:
    run = SparkRun(
        tag=f"attack-{next(_tags)}",
        execution_id=execution_id,
        step="s",
        session=_Session(),
        connect=True,
        driver_log=str(driver_log),
        stdout=[],
    )
    activity.begin(run)
    return run


def _write(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def test_lines_written_while_another_execution_ran_are_not_copied(tmp_path: Path) -> None:
    driver = tmp_path / "driver.log"
    driver.write_text("before\n")
    mine = _run(1, driver)
    _write(driver, "mine alone")
    activity._copy_driver_log(mine)
    other = _run(2, driver)
    _write(driver, "the other's secret s3cr3t")
    activity._copy_driver_log(mine)
    activity.end(other)
    assert "s3cr3t" not in "".join(other.stdout or [])  # not copied to its own either
    _write(driver, "its tail s3cr3t")
    activity._copy_driver_log(mine)
    _write(driver, "mine again")
    activity.end(mine)
    shown = "".join(mine.stdout or [])
    assert "s3cr3t" not in shown
    assert "[spark] driver: mine alone" in shown
    assert "[spark] driver: mine again" in shown
    assert shown.count("not copied") == 1


def test_another_step_of_the_same_execution_shares_the_drivers_lines(tmp_path: Path) -> None:
    driver = tmp_path / "driver.log"
    driver.write_text("")
    first, second = _run(3, driver), _run(3, driver)
    _write(driver, "either step's line")
    activity.end(second)
    activity.end(first)
    assert "[spark] driver: either step's line" in "".join(first.stdout or [])
    assert "[spark] driver: either step's line" in "".join(second.stdout or [])
