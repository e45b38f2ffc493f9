"""A spark loop's items in a Spark python worker (`flowtide.spark.loop`): the
`mapInArrow` function of its job runs each item of a partition through the step's
runner, as an iteration of any loop runs, and yields the rows `OUT_SCHEMA` says.

The plan (the playbook's text, the step, the execution's context, the items of a list)
arrives pickled with each task and is prepared once per python worker process: the
playbook parsed, the templates and the code compiled once. With a local master the
partition looks at the loop's marks (`flowtide.spark.loopmarks`) every `LOOK_SECONDS`:
it stops when the driver left the stop marker, and writes how many items it ran. The
first lines its items print go to the driver as it ends (`flowtide.spark.printed`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from flowtide.playbook.model import Step
from flowtide.redaction import mask_value
from flowtide.runtime.outcome import Outcome
from flowtide.spark import loopmarks
from flowtide.spark.pace import Pacer, burst_for
from flowtide.spark.printed import PartitionOutput

__all__ = [
    "LOOK_SECONDS",
    "ItemRunner",
    "elements",
    "executor_environment",
    "out_schema",
    "partition_function",
    "row_items",
    "run_partition",
]

#: Seconds between two looks at a loop's marks in a partition.
LOOK_SECONDS = 0.05


def _partition_id() -> int:
    """This task's partition (0 outside a Spark task: a test's direct call)."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except ImportError:
        return 0
    return int(context.partitionId()) if context is not None else 0


def partition_function(plan: dict[str, Any]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The `mapInArrow` function of a loop: a closure over its `plan` (shipped, pickled,
    once per task)."""

    def run_items(batches: Iterator[Any]) -> Iterator[Any]:
        return run_partition(plan, batches)

    return run_items


@dataclass
class _Prepared:
    runner: Any
    step: Step
    iterator: str
    size: int
    unwrap: str | None
    columns: list[str] | None
    items: list[Any] | None
    base: dict[str, Any]
    ctx: dict[str, Any]
    execution_id: int
    max_in_flight: int = 1
    share: float | None = None  # items/s of each partition (`spec.rate`), or None
    pacer: Pacer | None = None  # the pace of the task running now


_prepared_plans: dict[str, _Prepared] = {}


def _prepare(plan: dict[str, Any]) -> _Prepared:
    """The runner of `plan`, made once per python worker process and plan."""
    key = str(plan["key"])
    got = _prepared_plans.get(key)
    if got is not None:
        return got
    from pathlib import Path

    from flowtide.playbook.loader import parse_playbook
    from flowtide.runtime.pipeline import StepRunner
    from flowtide.tools.registry import warm_tools

    _executor_environment(bool(plan.get("embedded", False)))
    p = plan
    playbook = parse_playbook(p["text"], p["file"])
    runner = StepRunner(playbook, data_dir=Path(p["data_dir"]) if p["data_dir"] else None)
    # The first item is not the one that imports its tool (a rate paces from it).
    warm_tools({t.kind for t in playbook.steps[p["step"]].tasks})
    got = _Prepared(
        runner,
        playbook.steps[p["step"]],
        p["iterator"],
        int(p["size"]),
        p["unwrap"],
        p.get("columns"),
        p["items"],
        p["base"],
        p["ctx"],
        int(p["execution_id"]),
        int(p.get("max_in_flight") or 1),
        float(p["share"]) if p.get("share") else None,
    )
    _prepared_plans.clear()  # one loop at a time is what a python worker serves
    _prepared_plans[key] = got
    return got


#: flowtide settings an item's tools read that hold no secret (limits, file roots): kept.
_KEPT_SETTINGS = (
    "FLOWTIDE_FILE_ROOTS",
    "FLOWTIDE_HTTP_",
    "FLOWTIDE_MAX_",
    "FLOWTIDE_TEMPLATE_ENV",
)
#: What a process running a step's code has (`python_pool.child_environment`), and what
#: the items' http calls need of the worker's (its proxy, its certificates).
_KEPT_NAMES = frozenset(
    {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR"}
    | {"REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"}
)
_KEPT_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
#: The python worker's own variables (Spark reads them while it serves tasks)...
_SPARK_PREFIXES = ("SPARK_", "PYSPARK_", "PYTHON")
#: ... less any that may hold a secret: the python worker factory's and the py4j
#: gateway's keys would let an item speak to Spark's JVM as Spark does, a Connect URL
#: may carry its token.
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSW", "CREDENTIAL", "KEY", "AUTH_")
_SPARK_SECRETS = frozenset({"SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"})


def executor_environment(environ: Mapping[str, str], *, embedded: bool) -> dict[str, str]:
    """The environment an item's code may see in a Spark python worker whose own is
    `environ` (inherited from the driver: on a worker, the worker's). As a python step's
    child process (`python_pool.child_environment`): PATH, HOME, the locale, TMPDIR and
    the variables templates may see (`visible_env`: on a worker only those listed in
    FLOWTIDE_TEMPLATE_ENV, embedded the user's own; never FLOWTIDE_*); besides, the
    proxy and certificate variables, flowtide's limits and file roots, and Spark's own
    variables less those that may hold a secret (never Spark's keys, embedded or not)."""
    from flowtide.playbook.template import visible_env

    env = {
        k: v
        for k, v in environ.items()
        if k in _KEPT_NAMES
        or k.startswith("LC_")
        or k.upper() in _KEPT_PROXIES
        or (k.startswith(_KEPT_SETTINGS + _SPARK_PREFIXES) and not _secret_name(k))
    }
    env.update(visible_env(environ, embedded=embedded))
    return {k: v for k, v in env.items() if not (_spark_secret(k) or k.startswith("_PYSPARK"))}


def _secret_name(name: str) -> bool:
    return name in _SPARK_SECRETS or any(w in name.upper() for w in _SECRET_WORDS)


def _spark_secret(name: str) -> bool:
    return name.startswith(_SPARK_PREFIXES) and _secret_name(name)


def _executor_environment(embedded: bool) -> None:
    """A Spark python worker inherits the driver's environment: before user code runs
    here it keeps only what `executor_environment` says (a worker's secrets, flowtide's
    and Spark's go), and python bodies run in this process (the worker is already a
    process apart from flowtide's)."""
    kept = executor_environment(dict(os.environ), embedded=embedded)
    for name in [n for n in os.environ if n not in kept]:
        del os.environ[name]
    from flowtide.tools.python_pool import Isolation
    from flowtide.tools.registry import get_tool

    get_tool("python").configure(Isolation(mode="thread"))


def out_schema() -> Any:
    """The rows a spark loop writes, as Arrow types (`loopjobs.OUT_SCHEMA`)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("index", pa.int64()),
            ("status", pa.string()),
            ("result", pa.string()),
            ("error", pa.string()),
            ("action", pa.string()),
        ]
    )


class ItemRunner:
    """Runs a partition's items, a batch at a time, into the columns of `OUT_SCHEMA`
    rows; looks at the loop's marks between items (`LOOK_SECONDS`). With `max_in_flight`
    > 1 the items run that many at a time on threads (an http body's calls overlap); an
    item whose rules say `break` stops the partition once the items beside it are done.
    `close()` when the partition is over."""

    def __init__(self, plan: dict[str, Any], partition: int) -> None:
        prep = _prepare(plan)
        s = prep.share
        prep.pacer = Pacer(s, burst=burst_for(s, prep.max_in_flight)) if s else None
        self.prep = prep
        self.marks: str | None = plan.get("marks")
        self.partition = partition
        self.ran = 0
        self.look_at = 0.0  # when to look at the marks next (`_look`)
        self.pool = ThreadPoolExecutor(prep.max_in_flight) if prep.max_in_flight > 1 else None
        self.printed = PartitionOutput()  # what its items print, sent as it ends (`printed`)
        self.output = plan.get("output")  # the loop's accumulator (None: Spark Connect)

    def run(self, indexes: list[int], raws: list[Any]) -> tuple[tuple[list[Any], ...], bool]:
        """The rows of the items `raws` (at `indexes`), and whether one said `break`
        (the rows stop with the items that ran beside it).

        Raises:
            RuntimeError: the driver left the loop's stop marker (cancelled, timed out):
                no more items start, and the task fails rather than commit its rows.
        """
        prep, pool = self.prep, self.pool
        cols: tuple[list[Any], ...] = ([], [], [], [], [])
        stop = False
        if pool is None:
            # One item at a time (the common case): no windows to make per item.
            for index, raw in zip(indexes, raws, strict=True):
                self._look()
                outcome = _run_item(prep, index, raw)
                self._add(cols, index, outcome)
                self.ran += 1
                if outcome.action == "break":
                    return cols, True
            return cols, False
        width = prep.max_in_flight
        for at in range(0, len(indexes), width):
            self._look()
            window = list(zip(indexes[at : at + width], raws[at : at + width], strict=True))
            outcomes = list(pool.map(lambda w: _run_item(prep, *w), window))
            for (index, _), outcome in zip(window, outcomes, strict=True):
                self._add(cols, index, outcome)
                stop = stop or outcome.action == "break"
            self.ran += len(window)
            if stop:
                break
        return cols, stop

    def _look(self) -> None:
        """Every `LOOK_SECONDS`: write the items done, stop if the marker is there (a
        stat per item would cost as much as one)."""
        if self.marks and time.monotonic() >= self.look_at:
            loopmarks.write_done(self.marks, self.partition, self.ran)
            if loopmarks.stopped(self.marks):
                raise RuntimeError("the loop was stopped (cancelled or timed out)")
            self.look_at = time.monotonic() + LOOK_SECONDS

    def _add(self, cols: tuple[list[Any], ...], index: int, outcome: Outcome) -> None:
        """The row of item `index`, and what it printed."""
        for call in outcome.calls:
            if call.stdout:
                self.printed.add(index, call.stdout, outcome.secrets)
        cols[0].append(index)
        cols[1].append(outcome.status)
        text, error = outcome.text, outcome.error
        if outcome.secrets:
            # What the item's tools took for secrets: the dataset cannot seal them as the
            # event log does.
            text = json.dumps(mask_value(outcome.result, outcome.secrets))
            error = mask_value(error, outcome.secrets)
        cols[2].append(text if text is not None else json.dumps(outcome.result))
        cols[3].append(None if error is None else json.dumps(error, default=str))
        cols[4].append(outcome.action)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        if self.marks:
            loopmarks.write_done(self.marks, self.partition, self.ran)
        report = self.printed.report(self.partition)
        if self.output is not None and report is not None:
            self.output.add([report])  # a failed task's updates never reach the driver


def run_partition(plan: dict[str, Any], batches: Iterator[Any]) -> Iterator[Any]:
    """Run the items of one partition (Arrow batches of `index`, and the item's columns
    for a dataset), yielding batches of `OUT_SCHEMA` rows (see `ItemRunner`).

    Raises:
        RuntimeError: the driver left the loop's stop marker (cancelled, timed out).
    """
    import pyarrow as pa

    runner = ItemRunner(plan, _partition_id())
    schema = out_schema()
    try:
        for batch in batches:
            indexes = batch.column(0).to_pylist()
            raws = elements(runner.prep, batch, indexes)
            cols, stop = runner.run(indexes, raws)
            arrays = [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)
            if stop:
                return
    finally:
        runner.close()


def elements(prep: _Prepared, batch: Any, indexes: list[int]) -> list[Any]:
    """The items of a batch of rows (`index` and the row): the plan's list's, or the
    rows' (Arrow columns, or JSON text), each a dict, or the one column's value
    (`ItemShape`)."""
    if prep.items is not None:
        return [prep.items[i] for i in indexes]
    if prep.columns is not None:
        return row_items(prep, [batch.column(i + 1) for i in range(len(prep.columns))])
    out = [json.loads(raw) for raw in batch.column(1).to_pylist()]
    if prep.unwrap is not None:
        key = prep.unwrap
        return [e.get(key) if isinstance(e, dict) else e for e in out]
    return out


def row_items(prep: _Prepared, columns: list[Any]) -> list[Any]:
    """The items of rows whose values are the Arrow `columns` (`prep.columns`' order)."""
    values = [c.to_pylist() for c in columns]
    if prep.unwrap is not None:
        return list(values[0])
    names = prep.columns
    assert names is not None
    return [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]


def _run_item(prep: _Prepared, index: int, element: Any) -> Outcome:
    """One item through the step's runner, as an iteration of any loop runs."""
    if prep.pacer is not None:
        prep.pacer.wait()  # `spec.rate`: the item starts in its slot
    outcome: Outcome = prep.runner.run(
        prep.step,
        prep.base,
        prep.ctx,
        execution_id=prep.execution_id,
        iterator=prep.iterator,
        element=element,
        index=index,
        size=prep.size,
    )
    return outcome
