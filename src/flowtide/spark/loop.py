"""Loops in Spark: `loop.spec.mode: spark` runs a loop's items as Spark tasks.

The engine issues such a loop as one command (`flowtide.engine.decide`); the runtime that
claims it (embedded or a distributed worker) is the Spark driver:

1. `in:` renders on the driver to an inline list, an earlier spark step's result reference
   or a source (`{format: parquet|csv|json, path}`); each item is a row's dict, a
   one-column source's value, or the list's element. With a local master, a list or
   parquet files on this disk of plain columns go to the python workers as they are
   (`flowtide.spark.direct`: the tasks read their slices and write their rows, indexes
   counting files in name order, then rows). Otherwise they are a DataFrame of
   `(index, item)` rows (`items_frame`), the indexes counted partition by partition in
   Spark's order, in the JVM.
2. Each partition runs in a Spark python worker (`mapInArrow`, Arrow batches): the
   playbook is parsed and its step's templates and code compiled once per partition,
   the execution's context (`base`, `ctx`) arrives once per task, and every item runs
   through `flowtide.runtime.pipeline.StepRunner.run` exactly as an iteration of any
   loop does: the tool's templates with `iter`, `loop_index`, `loop`; the tool; its
   policy rules (retry with backoff, continue, fail, break); NoETL's `output` envelope.
   An item's error is a row, never a failed Spark task.
3. The rows `(index, status, result, error, action)` (results and errors as JSON) are
   written as parquet in the execution's data folder; Spark's commit protocol (or the
   direct job's, which keeps the files of the attempts whose answers `collect` kept)
   keeps the output of one attempt of each task, so a re-run task (failed, killed,
   speculative) replaces its rows and every index is there once. The stats are counted
   from what was written (metrics the write observes, or the answers), so they are
   exact (`flowtide.spark.loopjobs`).
4. The step's result: `{uri, format, schema, row_count, preview, stats, results}`, with
   `results` (what every item returned, in index order, as a loop of any mode gives)
   when there are at most `spec.results_max` items (default 10,000).

A cancel or timeout interrupts the job (`flowtide.spark.activity`); with a local master
the driver also leaves a stop marker that the python workers look for before each item,
so no item starts once the loop is stopped (Spark itself kills a python worker whose task
was cancelled only seconds later).

An item whose rules say `fail` fails the loop once the job is over (the items of other
partitions still ran); `break` stops the items after it in its partition, the other
partitions run to their end. What an item `set`s in `ctx` stays with the item. The first
lines the items print are shown in the step's log (`flowtide.spark.printed`). Side
effects are at-least-once, as with any retried command: a task Spark runs again runs its
items again.

With `spec.rate` (items started per second across the job) the job is one wave: a
partition per task slot unless `spec.partitions` says, each pacing its item starts at
its share of the rate on a monotonic schedule (`flowtide.spark.pace`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flowtide import tracing
from flowtide.engine.context import layered, plain
from flowtide.errors import TemplateError, ToolError
from flowtide.playbook.model import Step
from flowtide.playbook.template import render
from flowtide.runtime.outcome import Call, Outcome, Record, error_dict
from flowtide.settings import LimitsSection, current
from flowtide.spark import loopmarks
from flowtide.spark.direct import direct_items
from flowtide.spark.loopjobs import OUT_SCHEMA, direct_job, jvm_job
from flowtide.spark.pace import share_of
from flowtide.spark.printed import LoopOutput
from flowtide.tools.base import ToolContext
from flowtide.tools.registry import get_tool
from flowtide.tools.spark import SparkTool

__all__ = ["OUT_SCHEMA", "run_spark_loop"]

#: Partitions per core of Spark's default parallelism when `spec.partitions` is not set.
_PARTITIONS_PER_CORE = 4
_ITEMS_PER_PARTITION = 25_000
#: The same for a direct job (a local master): its progress moves item by item whatever
#: a task's size, and each task costs the driver's JVM (~0.1 s of CPU): fewer, larger.
_ITEMS_PER_DIRECT_TASK = 100_000
_MAX_PARTITIONS = 10_000
#: Items at once in one partition, at most (threads of a python worker).
_MAX_IN_FLIGHT = 256
#: The lowest `spec.rate` (items/s): an item's slot must be a time a thread can wait.
_MIN_RATE = 1e-6


def run_spark_loop(
    runner: Any,
    step: Step,
    base: Mapping[str, Any],
    ctx: Mapping[str, Any],
    *,
    execution_id: int,
    cancelled: Callable[[], bool] | None = None,
    credentials: Any = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> Outcome:
    """Run the `mode: spark` loop `step` (one command): its items as Spark tasks, its
    outcome the loop's result reference with exact stats (see the module docstring).
    `progress`: told the items done while the job runs (`activity.ItemsWatch`), none
    as it starts; the outcome's `items` are the exact counts."""
    assert step.loop is not None
    # The registry's spark tool: `cancel_running` (a cancel, a worker's shutdown) stops
    # Spark work through it, this loop's job included.
    get_tool("spark")
    task = step.tasks[0]
    record = Record(time.time())
    scope = layered({"ctx": ctx, "vars": ctx}, base)
    secrets: set[str] = set()
    tctx = runner._tool_context(
        execution_id, step, task.name, scope, secrets, cancelled, None, 1, credentials
    )
    t0 = time.perf_counter()
    result: Any = None
    error: dict[str, Any] | None = None
    action = "continue"
    job: _LoopJob | None = None
    try:
        collection = render(step.loop.collection, scope, step=step.name, field="loop.in")
        if progress is not None and isinstance(collection, list | tuple):
            # None done yet: what an earlier attempt counted (before a resume, another
            # worker's before it died) is not this one's (a dataset's: once counted).
            progress({"done": 0, "total": len(collection), "per_second": 0.0})
        job = _LoopJob(
            runner.playbook,
            step,
            collection,
            base,
            ctx,
            execution_id,
            _in_flight(step, scope),
            progress=progress,
        )
        job.rate = _rate(step, scope)
        result = _SparkLoopTool(job).run({}, tctx)
        failure = job.failure
        if failure is not None:
            action, error = "fail", failure
    except (ToolError, TemplateError) as exc:
        action, error = "fail", error_dict(exc)
    except Exception as exc:  # noqa: BLE001 - a bug fails the step, never the worker
        action, error = "fail", error_dict(exc)
    record.calls.append(
        Call(
            task.name,
            1,
            error is None,
            round((time.perf_counter() - t0) * 1000, 3),
            time.time(),  # as the job ended, as any call's (its events stay in time order)
            error,
            "".join(tctx.stdout) or None,
            dict(tctx.call_meta),
        )
    )
    record.secrets |= secrets
    status = "ok" if error is None else "error"
    # A result over the inline limit (`results` of many items) is stored by reference,
    # as any step's is.
    outcome: Outcome = runner._by_reference(
        step, execution_id, record.outcome(status, result, action, error)
    )
    outcome.items = job.items if job is not None else None
    return outcome


@dataclass
class _LoopJob:
    """What the driver knows of one spark loop, and what it learnt (`failure`)."""

    playbook: Any
    step: Step
    collection: Any
    base: Mapping[str, Any]
    ctx: Mapping[str, Any]
    execution_id: int
    max_in_flight: int = 1
    progress: Callable[[dict[str, Any]], None] | None = None
    failure: dict[str, Any] | None = None
    rate: float | None = None
    #: The exact counts once the job ran: `{done, total, failed, per_second}`.
    items: dict[str, Any] | None = None


class _SparkLoopTool(SparkTool):
    """A spark step whose work is the loop's job: the session, cancellation, timeout,
    progress, `[spark]` log lines and error translation are the spark tool's."""

    def __init__(self, job: _LoopJob) -> None:
        super().__init__()
        self.job = job

    def run(self, config: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        with tracing.span("spark", {"flowtide.step": ctx.step}) as traceparent:
            return self._run(config, ctx, traceparent)

    def _work(  # type: ignore[override]
        self,
        spark: Any,
        config: Mapping[str, Any],
        ctx: ToolContext,
        run: Any,
        load_input: Any,
        write: Any,
        reference: Any,
    ) -> dict[str, Any]:

        from flowtide.spark.activity import ItemsWatch, say

        job = self.job
        loop = job.step.loop
        assert loop is not None
        # With a rate: one wave, a partition per task slot unless `spec.partitions` says.
        slots = _slots(spark) if job.rate else 0
        # A playbook's word is no reason for more tasks than any loop gets.
        parts = min(loop.partitions, _MAX_PARTITIONS) if loop.partitions else slots or None
        key = uuid.uuid4().hex
        marks = loopmarks.marks_for(key)
        # A local master writing to this disk: the python workers read the items and write
        # the rows themselves.
        local = marks is not None and _classic(spark)
        direct = direct_items(job.collection, local and _local_output(ctx))
        partitions: int | None = None
        tasks = 0
        try:
            if direct is not None:
                size = direct.size
                wanted = parts or _default_partitions(spark, size, _ITEMS_PER_DIRECT_TASK)
                tasks = partitions = max(1, min(wanted, size))
                frame: Any = spark.range(0, tasks, 1, tasks)
                columns = direct.columns
                unwrap = columns[0] if columns is not None and len(columns) == 1 else None
                shape = ItemShape(unwrap, tuple(columns) if columns is not None else None)
            else:
                frame, size, shape = items_frame(spark, job.collection, ctx, parts, load_input)
                partitions = _partitions_of(frame)
        except ToolError:
            raise
        except Exception as exc:  # a source that cannot be read: say it is `loop.in`'s
            raise _in_failed(exc, ctx.step) from None
        if job.progress is not None and not isinstance(job.collection, list | tuple):
            job.progress({"done": 0, "total": size, "per_second": 0.0})  # as for a list
        say(run, f"loop over {size:,} items in {partitions or 'its'} partitions")
        share = None
        if job.rate:
            share = share_of(job.rate, min(parts or 1, max(size, 1)), slots)
            say(run, f"rate {job.rate:g} items/s: {share:g} per partition, {slots} task slots")
        printed = LoopOutput(lambda line: say(run, line))
        output = printed.accumulator(spark)
        if output is None:
            say(run, "what the items print is not shown with Spark Connect")
        # Shipped once per task in the closure (pickled): the context as templates see it.
        plan = {
            "key": key,
            "marks": marks,
            "text": job.playbook.text,
            "file": job.playbook.file,
            "step": job.step.name,
            "iterator": loop.iterator,
            "size": size,
            "unwrap": shape.unwrap,
            "columns": list(shape.columns) if shape.columns is not None else None,
            "items": [plain(x) for x in job.collection]
            if isinstance(job.collection, list | tuple)
            else None,
            "base": dict(job.base),
            "ctx": dict(job.ctx),
            "execution_id": job.execution_id,
            "max_in_flight": job.max_in_flight,
            "share": share,
            "data_dir": str(ctx.data_dir) if ctx.data_dir is not None else None,
            # The items' code sees the environment a python step's would: on a worker
            # not the worker's (`partition.executor_environment`).
            "embedded": _embedded(),
            "output": output,
        }
        watch = ItemsWatch(size, partitions, job.progress, marks)
        run.items = watch
        if marks is not None:
            run.on_interrupt = lambda: loopmarks.stop(marks)
        try:
            if run.reason is not None:  # interrupted before the marker could be left
                raise ToolError(f"spark step '{ctx.step}' {run.reason}", kind=run.reason)
            if direct is not None:
                rows = direct_job(frame, plan, direct, tasks, ctx)
            else:
                rows = jvm_job(frame, plan, ctx, write, reference)
        finally:
            run.items = None
            run.on_interrupt = None
            if marks is not None:
                loopmarks.forget(marks)
            printed.finish()
        seconds = time.monotonic() - watch.started
        totals = rows.totals
        if totals.first_fail is not None:
            job.failure = _item_error(totals.first_fail, rows.first_error())
            if totals.fails > 1:
                more = totals.fails - 1
                job.failure["message"] += (
                    f" ({more:,} more item{'s' if more > 1 else ''} failed: "
                    f"their rows are in `flowtide data {job.execution_id} {job.step.name}`)"
                )
        result = rows.reference
        ran, ok = totals.ran, totals.ok
        result["row_count"] = ran
        result["stats"] = {"total": size, "success": ok, "failed": ran - ok}
        job.items = {
            "done": ran,
            "total": size,
            "failed": ran - ok,
            "per_second": ran / max(seconds, 1e-3),
        }
        if size <= loop.results_max:
            kept = _results(rows.results, totals.chars)
            if kept is not None:
                result["results"] = kept
            else:
                say(
                    run,
                    f"results not kept in the step's result ({totals.chars} characters, over"
                    " half of FLOWTIDE_MAX_RESULT_BYTES): read them from the dataset by"
                    " reference",
                )
        stats = result["stats"]
        say(run, f"items: {stats['success']:,} ok, {stats['failed']:,} failed of {size:,}")
        return result


def _local_output(ctx: ToolContext) -> bool:
    """Whether the loop's rows go to this machine's disk (not a configured `s3a://`,
    `hdfs://` or other data folder)."""
    from flowtide.spark.datasets import default_location

    return default_location(ctx).startswith("file:")


def _classic(spark: Any) -> bool:
    """Whether `spark` is a classic session (not Spark Connect's)."""
    try:
        spark.sparkContext  # noqa: B018 - Spark Connect has no SparkContext
    except Exception:  # noqa: BLE001
        return False
    return True


def _results(read: Callable[[], list[tuple[int, str]]], chars: int) -> list[Any] | None:
    """What every item returned, in index order (`read` gives the rows' (index, result)),
    from rows whose results take `chars` characters (each and a separator): None when
    they would not fit well inside what a result may hold inline (the stats and the
    reference must stay readable by the steps after it). Only rows that fit are read on
    the driver, whatever `results_max` says."""
    if chars > current(LimitsSection).max_result_bytes // 2:
        return None
    return [json.loads(raw) for _, raw in read()]


def _embedded() -> bool:
    """Whether this driver runs the user's own steps (embedded), not a worker's: a
    worker's python steps are not embedded (`Isolation.embedded`)."""
    isolation = getattr(get_tool("python"), "isolation", None)
    return bool(getattr(isolation, "embedded", False))


def _in_flight(step: Step, scope: Mapping[str, Any]) -> int:
    """`spec.max_in_flight` of a spark loop: items at once in each partition (default 1).

    Raises:
        ToolError: kind "loop_error" when it does not render to a positive integer.
    """
    assert step.loop is not None
    raw = step.loop.max_in_flight
    if raw is None:
        return 1
    value = render(raw, scope, step=step.name, field="loop.spec.max_in_flight")
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
        raise ToolError(
            f"loop 'spec.max_in_flight' rendered to {value!r}, expected a positive integer",
            kind="loop_error",
        )
    return max(1, min(int(value), _MAX_IN_FLIGHT))


def _rate(step: Step, scope: Mapping[str, Any]) -> float | None:
    """`spec.rate` of a spark loop: items started per second across the job, or None.

    Raises:
        ToolError: kind "loop_error" when it does not render to a positive number.
    """
    assert step.loop is not None
    raw = step.loop.rate
    if raw is None:
        return None
    value = render(raw, scope, step=step.name, field="loop.spec.rate")
    try:
        rate = float(value) if not isinstance(value, bool) else 0.0
    except (TypeError, ValueError):
        rate = 0.0
    if not rate >= _MIN_RATE or rate == float("inf"):
        raise ToolError(
            f"loop 'spec.rate' rendered to {value!r}, expected a positive number (items per"
            f" second) of at least {_MIN_RATE:g}",
            kind="loop_error",
        )
    return rate


def _partitions_of(frame: Any) -> int | None:
    """The partitions of `frame` (None with Spark Connect, which has no RDDs)."""
    try:
        return int(frame.rdd.getNumPartitions())
    except Exception:  # noqa: BLE001 - Spark Connect has no RDDs
        return None


def _item_error(index: int, raw: str | None) -> dict[str, Any]:
    """The loop's error: the first failing item's (by index), saying which it was."""
    error = json.loads(raw) if raw else {}
    if not isinstance(error, dict):
        error = {"message": str(error)}
    message = error.get("message") or "the item failed"
    return {
        **error,
        "kind": error.get("kind") or "error",
        "message": f"item {index}: {message}",
        "loop_index": index,
    }


#: Spark column types whose values Arrow hands over as JSON would (`int`, `float` of
#: a double, `str`, `bool`): a row of only these travels as its columns, any other as
#: its JSON text (`to_json`: dates as ISO text, decimals as numbers).
_ARROW_TYPES = frozenset({"bigint", "int", "smallint", "tinyint", "double", "string", "boolean"})


@dataclass(frozen=True)
class ItemShape:
    """How a partition makes an item of a dataset's row: `unwrap` names the one column
    whose value is the item (else the item is the row as a dict); `columns` lists the
    row's columns when they arrive as Arrow columns, else (None) the row is one `item`
    column of JSON text."""

    unwrap: str | None = None
    columns: tuple[str, ...] | None = None


def items_frame(
    spark: Any, value: Any, ctx: ToolContext, partitions: int | None, load_input: Any
) -> tuple[Any, int, ItemShape]:
    """The DataFrame of a rendered `in:` (`index long` for a list, whose items travel with
    the plan; for a dataset `index long` and the row, as `ItemShape` says), its size, and
    the shape of its items. A null column of a row is None in the item.

    Raises:
        ToolError: kind "loop_error" when `in:` is neither a list nor a dataset.
    """
    from pyspark.sql import functions as F

    if isinstance(value, list | tuple):
        # The indexes are a range split evenly into the partitions (no Spark job); the
        # items travel with the plan (`items`), each task picking its own.
        n = len(value)
        wanted = max(1, min(partitions or _default_partitions(spark, n), n))
        return spark.range(0, n, 1, wanted).withColumnRenamed("id", "index"), n, ItemShape()
    if not isinstance(value, Mapping):
        raise ToolError(
            f"loop 'in' of a spark loop rendered to {type(value).__name__}: expected a list, "
            "a spark step's result reference or a source {format, path}",
            kind="loop_error",
        )
    data = load_input(spark, "in", value, ctx)
    columns = list(data.columns)
    unwrap = columns[0] if len(columns) == 1 else None
    if all(t in _ARROW_TYPES for _, t in data.dtypes):
        shape = ItemShape(unwrap, tuple(columns))
        payload = [F.col(f"`{c}`").alias(f"c{i}") for i, c in enumerate(columns)]
    else:
        shape = ItemShape(unwrap, None)
        row = F.struct(*[F.col(f"`{c}`") for c in columns])
        payload = [F.to_json(row, {"ignoreNullFields": "false"}).alias("item")]
    # monotonically_increasing_id: the partition in the upper bits, the row within it in
    # the lower 33. Each partition's offset is the rows of the partitions before it.
    mid = data.select(F.monotonically_increasing_id().alias("_mid"), *payload)
    rest = mid.columns[1:]
    part = F.shiftright(F.col("_mid"), 33)
    counts = sorted(
        (int(r["p"]), int(r["n"]))
        for r in mid.groupBy(part.alias("p")).agg(F.count(F.lit(1)).alias("n")).collect()
    )
    offsets: list[Any] = []
    total = 0
    for p, n in counts:
        offsets += [F.lit(p), F.lit(total)]
        total += n
    if not counts:
        empty = mid.select(F.col("_mid").alias("index"), *rest).limit(0)
        return empty, 0, shape
    offset = F.create_map(*offsets)[part]
    index = (offset + F.col("_mid").bitwiseAND(F.lit((1 << 33) - 1))).alias("index")
    frame = mid.select(index, *rest)
    if partitions:
        frame = frame.repartitionByRange(min(partitions, max(total, 1)), "index")
    return frame, total, shape


def _in_failed(exc: BaseException, step: str) -> ToolError:
    """A ToolError for a loop's `in:` Spark could not read, naming the step and field."""
    from flowtide.tools.spark import _translate

    error = _translate(exc, step, None, None)
    detail = error.message.removeprefix(f"spark step '{step}': ")
    return ToolError(
        f"step '{step}', field 'loop.in': cannot read the items: {detail}",
        kind=error.kind,
        retryable=error.retryable,
        code=error.code,
    )


def _default_partitions(spark: Any, items: int, per_task: int = _ITEMS_PER_PARTITION) -> int:
    """Four per core of Spark's parallelism, and more for a large loop: at most
    `per_task` items each (a task Spark runs again runs its items again, and on a
    cluster progress moves a task at a time)."""
    cores = _slots(spark)
    by_size = -(-items // per_task)
    return min(max(max(1, cores) * _PARTITIONS_PER_CORE, by_size), _MAX_PARTITIONS)


def _slots(spark: Any) -> int:
    """The tasks Spark runs at once: its default parallelism (Spark Connect: a quarter
    of `spark.sql.shuffle.partitions`, at least 2)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
        return int(spark.conf.get("spark.sql.shuffle.partitions", "8") or 8) // 4 or 2
