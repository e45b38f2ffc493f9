"""The two ways a spark loop's job runs (`flowtide.spark.loop`), each giving the loop's
written rows (`Rows`): the step's reference, the totals, and readers of the first failing
item's error and of the results.

- `direct_job` (a local master, `flowtide.spark.direct`): the python workers read the
  items and write the rows; the driver commits the files the tasks' answers name.
- `jvm_job`: `run_partition` over `items_frame`'s rows, written as any spark step's
  result; the totals are metrics the write observes (no second pass over the rows).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from flowtide.spark.datasets import PREVIEW_ROWS, default_location
from flowtide.spark.direct import (
    SUMMARY_SCHEMA,
    DirectItems,
    clear_left,
    commit,
    direct_function,
    preview,
    read_results,
)
from flowtide.spark.partition import partition_function
from flowtide.tools.base import ToolContext

__all__ = ["OUT_SCHEMA", "Rows", "Totals", "direct_job", "jvm_job"]

#: The rows a spark loop writes, one per item that ran.
OUT_SCHEMA = "index long, status string, result string, error string, action string"


@dataclass
class Totals:
    """What a loop's rows hold: rows, ok ones, those whose rules said `fail` and the
    first of them, and the characters of their results (each and a separator)."""

    ran: int = 0
    ok: int = 0
    fails: int = 0
    first_fail: int | None = None
    chars: int = 0


@dataclass
class Rows:
    """A loop's written rows: the step's reference, their totals, and readers of the
    first failing item's error and of every (index, result) in index order."""

    reference: dict[str, Any]
    totals: Totals
    first_error: Callable[[], str | None]
    results: Callable[[], list[tuple[int, str]]]


def direct_job(
    frame: Any, plan: dict[str, Any], items: DirectItems, tasks: int, ctx: ToolContext
) -> Rows:
    """Run the loop as a direct job (`flowtide.spark.direct`) and commit its files."""
    final = Path(url2pathname(urlparse(default_location(ctx)).path))
    staging = final.parent / f".{final.name}.{plan['key']}"
    clear_left(final)
    staging.mkdir(parents=True)
    plan = {**plan, "files": items.files, "slices": items.slices(tasks), "staging": str(staging)}
    try:
        answers = commit(
            frame.mapInArrow(direct_function(plan), SUMMARY_SCHEMA).collect(),
            tasks,
            staging,
            final,
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    totals = Totals(
        sum(a.ran for a in answers),
        sum(a.ok for a in answers),
        sum(a.fails for a in answers),
        next((a.first_fail for a in answers if a.first_fail is not None), None),
        sum(a.chars for a in answers),
    )
    error = next((a.first_error for a in answers if a.first_fail is not None), None)
    schema = [
        {"name": n.strip().split()[0], "type": "bigint" if "long" in n else "string"}
        for n in OUT_SCHEMA.split(",")
    ]
    reference = {
        "uri": final.as_uri(),
        "format": "parquet",
        "schema": schema,
        "row_count": totals.ran,
        "preview": preview(final, PREVIEW_ROWS),
    }
    return Rows(reference, totals, lambda: error, lambda: read_results(final))


def jvm_job(frame: Any, plan: dict[str, Any], ctx: ToolContext, write: Any, reference: Any) -> Rows:
    """Run the loop through the JVM (`run_partition` on `items_frame`'s rows), its rows
    written as any spark step's result; the totals are metrics the write observes."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation()
    fail = F.col("action") == "fail"
    out = frame.mapInArrow(partition_function(plan), OUT_SCHEMA).observe(
        observation,
        F.count(F.lit(1)).alias("ran"),
        F.sum(F.when(F.col("status") == "ok", 1).otherwise(0)).alias("ok"),
        F.sum(F.when(fail, 1).otherwise(0)).alias("fails"),
        F.min(F.when(fail, F.col("index"))).alias("first"),
        F.sum(F.length("result") + 1).alias("chars"),
    )
    written = write(out, None, ctx)
    got = observation.get
    first = got.get("first")
    totals = Totals(
        int(got.get("ran") or 0),
        int(got.get("ok") or 0),
        int(got.get("fails") or 0),
        int(first) if first is not None else None,
        int(got.get("chars") or 0),
    )
    back = frame.sparkSession.read.parquet(written.uri)

    def first_error() -> str | None:
        rows = back.filter(F.col("index") == totals.first_fail).select("error").collect()
        return rows[0]["error"] if rows else None

    def results() -> list[tuple[int, str]]:
        return sorted(
            (int(r["index"]), r["result"]) for r in back.select("index", "result").collect()
        )

    return Rows(reference(written), totals, first_error, results)
