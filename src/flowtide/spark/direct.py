"""A spark loop's job with a local master: the python workers read the items and write
the rows themselves (`flowtide.spark.loop`).

With a local master the driver and its python workers share this machine's disk, so the
job needs nothing of the JVM but its tasks: a task per slice of the items, each reading
its slice (from the plan's list, or the row groups of the dataset's parquet files, whose
footers the driver read to number the rows: no counting job), running it through an
`ItemRunner` and writing its rows to a parquet file of its attempt's own, then answering
one summary row. `collect()` keeps one answer per task (Spark's result stage: the first
attempt to succeed), and the driver moves the files those answers name into the loop's
output folder: a task run again (failed, killed, speculative) counts once, and the stats
are the sums of the answers, exact without reading the rows back.

Used when the items are a list or parquet files on this disk whose columns are of plain
types (`_PLAIN`), which is the common case (a spark step's result); a source of another
format or with options, nested or dated columns, or another master take the JVM's path
(`loop.items_frame`). Indexes count files in name order, rows in file order.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from flowtide.spark.partition import ItemRunner, out_schema, row_items

__all__ = [
    "DirectItems",
    "Summary",
    "clear_left",
    "commit",
    "direct_function",
    "direct_items",
    "preview",
    "read_results",
]

#: Rows a task reads and runs before it writes them (its memory is about this many).
CHUNK_ROWS = 8192
#: The summary row of a task: its rows' file and what they hold.
SUMMARY_SCHEMA = (
    "task long, file string, ran long, ok long, fails long, first_fail long,"
    " first_error string, chars long"
)


@dataclass
class DirectItems:
    """The items of a loop as its tasks read them: the plan's list (`files` empty) or
    the row groups of parquet `files` (`groups`: file, row group, rows), `size` in all."""

    size: int
    files: list[str] = field(default_factory=list)
    groups: list[tuple[int, int, int]] = field(default_factory=list)
    columns: list[str] | None = None

    def slices(self, tasks: int) -> list[list[tuple[int, int, int, int, int]]]:
        """Per task, the pieces of its even share of the rows: (first index, file, row
        group, first row in the group, rows)."""
        bounds = [self.size * t // tasks for t in range(tasks + 1)]
        out: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(tasks)]
        task, at = 0, 0
        for file, group, rows in self.groups:
            start = 0
            while start < rows:
                while task < tasks - 1 and at >= bounds[task + 1]:
                    task += 1
                take = min(rows - start, bounds[task + 1] - at)
                out[task].append((at, file, group, start, take))
                start += take
                at += take
        return out


def _plain(t: Any) -> bool:
    """Whether a column of Arrow type `t` is read here: the types Spark hands over as
    JSON would (`loop._ARROW_TYPES`: bigint, int, smallint, tinyint, double, string,
    boolean)."""
    import pyarrow as pa

    return bool(
        pa.types.is_signed_integer(t)
        or pa.types.is_float64(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_boolean(t)
    )


def direct_items(value: Any, local: bool) -> DirectItems | None:
    """How the tasks read the rendered `in:` `value` themselves, or None when the JVM
    must (another master, a source it alone reads as asked, or columns not plain)."""
    if not local:
        return None
    if isinstance(value, list | tuple):
        # One group of the plan's list (file -1): its rows are the items.
        return DirectItems(len(value), groups=[(-1, 0, len(value))] if value else [])
    if not isinstance(value, Mapping):
        return None
    reference = "uri" in value and bool({"format", "schema", "row_count"} & set(value))
    if reference and str(value.get("format") or "parquet").lower() == "parquet":
        # A spark step's result, as `datasets.load_input` takes one.
        if value.get("options") or not isinstance(value.get("uri"), str):
            return None
        where = value["uri"]
    elif set(value) == {"format", "path"} and str(value["format"]).lower() == "parquet":
        where = value["path"]
        if not isinstance(where, str) or not os.path.isabs(where):
            return None  # a relative path is the playbook's folder's: Spark resolves it
    else:
        return None
    path = _local_path(where)
    return _parquet_items(path) if path is not None else None


def _local_path(where: str) -> Path | None:
    if where.startswith("file:"):
        parsed = urlparse(where)
        if parsed.netloc not in ("", "localhost"):
            return None
        where = unquote(parsed.path)
    elif "://" in where:
        return None
    if any(c in where for c in "*?[{"):
        return None  # a glob: Spark's
    return Path(where)


def _skipped(name: str) -> bool:
    return name.startswith(("_", ".")) or name.endswith("._COPYING_")


def _parquet_items(path: Path) -> DirectItems | None:
    """The row groups of the parquet files at `path` (a file, or a folder of files with
    no folders in it), or None when they are not all plain and alike."""
    import pyarrow.parquet as pq

    try:
        if path.is_dir():
            entries = sorted(os.scandir(path), key=lambda e: e.name)
            if any(e.is_dir() for e in entries):
                return None  # partitioned folders: their columns are in the names
            # What Spark skips too: hidden files, markers, a file still being copied.
            files = [e.path for e in entries if not _skipped(e.name)]
        elif path.is_file():
            files = [str(path)]
        else:
            return None
        items = DirectItems(0, files)
        schema = None
        for i, file in enumerate(files):
            meta = pq.read_metadata(file)
            arrow = meta.schema.to_arrow_schema()
            if schema is None:
                schema = arrow
                if not all(_plain(f.type) for f in arrow) or len(set(arrow.names)) < len(
                    arrow.names
                ):
                    return None
            elif not arrow.equals(schema):
                return None
            for g in range(meta.num_row_groups):
                rows = meta.row_group(g).num_rows
                if rows:
                    items.groups.append((i, g, rows))
                    items.size += rows
    except (OSError, ValueError, NotImplementedError, ImportError):
        return None  # not parquet that pyarrow reads: the JVM reads it, or says why not
    if schema is None or not schema.names:
        return None
    items.columns = list(schema.names)
    return items


def direct_function(plan: dict[str, Any]) -> Any:
    """The `mapInArrow` function of a direct job: each row of its input is a task number;
    it answers the task's summary row."""

    def run_tasks(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            for task in batch.column(0).to_pylist():
                yield _run_task(plan, int(task))

    return run_tasks


def _attempt() -> int:
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except ImportError:
        return os.getpid()
    return int(context.taskAttemptId()) if context is not None else os.getpid()


def _run_task(plan: dict[str, Any], task: int) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    runner = ItemRunner(plan, task)
    schema = out_schema()
    name = f"part-{task:05d}-{_attempt()}.parquet"
    staging = Path(plan["staging"])
    aside = staging / f".{name}"
    counts = Summary(task, name)
    try:
        # Dictionaries for the few-valued columns only (a result's text is rarely repeated).
        with pq.ParquetWriter(aside, schema, use_dictionary=["status", "action"]) as writer:
            for indexes, raws in _chunks(plan, task, runner):
                cols, stop = runner.run(indexes, raws)
                counts.add(cols)
                arrays = [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)]
                writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
                if stop:
                    break
        os.replace(aside, staging / name)
    except BaseException:
        with contextlib.suppress(OSError):
            aside.unlink()
        raise
    finally:
        runner.close()
    return counts.batch()


def _chunks(plan: dict[str, Any], task: int, runner: ItemRunner) -> Iterator[Any]:
    """(indexes, items) of task `task`, `CHUNK_ROWS` at a time."""

    prep = runner.prep
    pieces = plan["slices"][task]
    if prep.items is not None:
        for first, _f, _g, start, rows in pieces:
            for at in range(start, start + rows, CHUNK_ROWS):
                stop = min(at + CHUNK_ROWS, start + rows)
                yield list(range(first + at - start, first + stop - start)), prep.items[at:stop]
        return
    for first, f, group, start, rows in pieces:
        at = first
        for part in _group_rows(plan, f, group, start, rows, prep.columns):
            indexes = list(range(at, at + part.num_rows))
            at += part.num_rows
            yield indexes, row_items(prep, [part.column(c) for c in range(part.num_columns)])
        if at != first + rows:
            # Never fewer rows than the footer the driver read said: an item lost.
            raise RuntimeError(
                f"the loop's items changed while it ran: row group {group} of"
                f" {plan['files'][f]} has fewer rows than its footer said as the loop"
                f" started ({start + rows} or more)"
            )


#: A row group whose data is larger than this (uncompressed, as its footer says) is read
#: `CHUNK_ROWS` at a time, never whole nor kept: a task's memory stays about a chunk's.
WHOLE_GROUP_BYTES = 64 << 20

#: The row group this python worker read last: (plan key, file, group) and its rows. A
#: row group (of at most `WHOLE_GROUP_BYTES`) is read whole, and a task often has a slice
#: of one that the task before it on this worker read too: kept, one group at a time.
_last_group: tuple[tuple[str, int, int], Any] | None = None


def _group_rows(
    plan: dict[str, Any], f: int, group: int, start: int, rows: int, columns: list[str] | None
) -> Iterator[Any]:
    """Rows `start` to `start + rows` of row group `group` of file `f`, in tables or
    batches of at most `CHUNK_ROWS` rows (fewer rows in all if the file has fewer)."""
    import pyarrow.parquet as pq

    global _last_group
    key = (str(plan["key"]), f, group)
    if _last_group is not None and _last_group[0] == key:
        table = _last_group[1]
    else:
        _last_group = None  # the old group goes before the new one is read
        file = pq.ParquetFile(plan["files"][f], buffer_size=1 << 20)
        if file.metadata.row_group(group).total_byte_size > WHOLE_GROUP_BYTES:
            yield from _streamed(file, group, start, rows, columns)
            return
        table = file.read_row_group(group, columns=columns)
        _last_group = (key, table)
    table = table.slice(start, rows)
    for at in range(0, table.num_rows, CHUNK_ROWS):
        yield table.slice(at, CHUNK_ROWS)


def _streamed(file: Any, group: int, start: int, rows: int, columns: list[str] | None) -> Any:
    """`_group_rows` of a large row group: its batches read in turn (those before `start`
    read and dropped), none kept."""
    skip, left = start, rows
    for batch in file.iter_batches(batch_size=CHUNK_ROWS, row_groups=[group], columns=columns):
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        part = batch.slice(skip, left)
        skip, left = 0, left - part.num_rows
        yield part
        if not left:
            return


@dataclass
class Summary:
    """What one task's rows hold (the summary row it answers)."""

    task: int
    file: str
    ran: int = 0
    ok: int = 0
    fails: int = 0
    first_fail: int | None = None
    first_error: str | None = None
    chars: int = 0

    def add(self, cols: tuple[list[Any], ...]) -> None:
        indexes, statuses, results, errors, actions = cols
        self.ran += len(indexes)
        self.ok += statuses.count("ok")
        self.chars += sum(map(len, results)) + len(results)
        if "fail" in actions:
            for i, action in enumerate(actions):
                if action == "fail":
                    self.fails += 1
                    if self.first_fail is None:
                        self.first_fail, self.first_error = indexes[i], errors[i]

    def batch(self) -> Any:
        import pyarrow as pa

        values = [
            self.task,
            self.file,
            self.ran,
            self.ok,
            self.fails,
            self.first_fail,
            self.first_error,
            self.chars,
        ]
        types = [pa.int64(), pa.string()] + [pa.int64()] * 4 + [pa.string(), pa.int64()]
        names = ["task", "file", "ran", "ok", "fails", "first_fail", "first_error", "chars"]
        arrays = [pa.array([v], type=t) for v, t in zip(values, types, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, names=names)


def commit(rows: list[Any], tasks: int, staging: Path, final: Path) -> list[Summary]:
    """Move the files the tasks' answers `rows` name into `final` (replacing what was
    there) as `part-NNNNN.parquet`, in task order; the other attempts' files go."""
    answers = sorted((Summary(**row.asDict()) for row in rows), key=lambda s: s.task)
    ready = staging.with_name(staging.name + ".commit")
    try:
        if [s.task for s in answers] != list(range(tasks)):
            raise RuntimeError(f"the loop's job answered for {len(answers)} of {tasks} tasks")
        ready.mkdir(parents=True)
        for s in answers:
            os.replace(staging / s.file, ready / f"part-{s.task:05d}.parquet")
        (ready / "_SUCCESS").touch()
        if final.exists():
            shutil.rmtree(final)
        os.replace(ready, final)
    finally:
        shutil.rmtree(ready, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
    return answers


def clear_left(final: Path) -> None:
    """Remove what a killed driver's job for the output folder `final` left beside it
    (its attempts' folder, a commit half done): a step runs once at a time in its
    execution, so none of it is another job's."""
    # `.<name>.<key>` and `.<name>.<key>.commit` (`loopjobs.direct_job`), a key being 32
    # hex digits: never a folder of a step whose name goes on after this one's.
    mine = re.compile(rf"\.{re.escape(final.name)}\.[0-9a-f]{{32}}(\.commit)?")
    with contextlib.suppress(OSError):
        for entry in os.scandir(final.parent):
            if mine.fullmatch(entry.name):
                shutil.rmtree(entry.path, ignore_errors=True)


def read_results(final: Path) -> list[tuple[int, str]]:
    """Every row's (index, result) of a committed loop, in index order."""
    import pyarrow.parquet as pq

    out: list[tuple[int, str]] = []
    for file in sorted(final.glob("part-*.parquet")):
        table = pq.read_table(file, columns=["index", "result"])
        out += zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True)
    out.sort()
    return out


def preview(final: Path, rows: int) -> list[dict[str, Any]]:
    """The first `rows` rows of a committed loop, as a reference's preview holds them."""
    import pyarrow.parquet as pq

    out: list[dict[str, Any]] = []
    for file in sorted(final.glob("part-*.parquet")):
        if len(out) >= rows:
            break
        table = pq.read_table(file).slice(0, rows - len(out))
        out += table.to_pylist()
    return out


def warm_workers(spark: Any) -> None:
    """Start a local session's python workers with what a loop's task imports loaded: a
    job of a task per slot, run while the playbook's first steps run. Spark keeps idle
    python workers for the next tasks (a minute), so the loop's first tasks start at
    once. Nothing for Spark Connect or another master (their workers are elsewhere)."""
    from flowtide.spark.session import sessions

    info = sessions.info
    if info is None or not info.master.startswith("local"):
        return
    slots = max(1, int(spark.sparkContext.defaultParallelism))
    spark.range(0, slots, 1, slots).mapInArrow(_warm_worker, "ready long").collect()


def _warm_worker(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet  # noqa: F401 - what a task reading items imports

    import flowtide.playbook.loader  # noqa: F401
    import flowtide.runtime.pipeline  # noqa: F401
    from flowtide.tools.registry import get_tool

    get_tool("python")
    for batch in batches:
        yield pa.RecordBatch.from_arrays([pa.array([1] * batch.num_rows, pa.int64())], ["ready"])
