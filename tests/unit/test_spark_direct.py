"""`flowtide.spark.direct` without Spark: how a loop's rows are split into tasks, and
how the tasks' answers are committed."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowtide.spark.direct import DirectItems, commit, direct_items


@given(
    groups=st.lists(st.integers(1, 40), max_size=12),
    tasks=st.integers(1, 30),
)
def test_slices_cover_every_row_once_in_order_and_evenly(groups: list[int], tasks: int) -> None:
    items = DirectItems(sum(groups), groups=[(i // 3, i % 3, n) for i, n in enumerate(groups)])
    slices = items.slices(tasks)
    assert len(slices) == tasks
    # Walking the tasks in order reads every row of every group once, in order.
    seen: list[tuple[int, int, int]] = []
    index = 0
    for pieces in slices:
        for first, file, group, start, rows in pieces:
            assert first == index and rows > 0
            seen += [(file, group, start + r) for r in range(rows)]
            index += rows
    assert seen == [(i // 3, i % 3, r) for i, n in enumerate(groups) for r in range(n)]
    # Shares differ by one row at most.
    sizes = [sum(p[4] for p in pieces) for pieces in slices]
    assert max(sizes) - min(sizes) <= 1


def test_what_a_task_may_read_itself() -> None:
    assert direct_items([1, 2], local=True) == DirectItems(2, groups=[(-1, 0, 2)])
    assert direct_items([], local=True) == DirectItems(0)
    # Another master, a source with options or of another format, a remote or relative
    # path, a glob: the JVM reads them.
    assert direct_items([1], local=False) is None
    assert direct_items({"format": "csv", "path": "/x"}, local=True) is None
    assert direct_items({"format": "parquet", "path": "rel/x"}, local=True) is None
    assert direct_items({"format": "parquet", "path": "/x/*.parquet"}, local=True) is None
    assert direct_items({"uri": "s3a://b/x", "format": "parquet"}, local=True) is None
    ref = {"uri": "file:///nowhere", "format": "parquet", "options": {"mergeSchema": "true"}}
    assert direct_items(ref, local=True) is None
    assert direct_items({"uri": "file:///nowhere/at/all", "format": "parquet"}, local=True) is None


def test_only_what_the_jvm_path_takes_for_a_reference_is_read_directly(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"v": [1, 2]}), tmp_path / "a.parquet")
    ref = {"uri": tmp_path.as_uri(), "row_count": 2}
    assert direct_items(ref, local=True) == DirectItems(
        2, [str(tmp_path / "a.parquet")], [(0, 0, 2)], ["v"]
    )
    # A file still being copied in is not read (Spark skips it too).
    pq.write_table(pa.table({"v": [3]}), tmp_path / "b.parquet._COPYING_")
    assert direct_items(ref, local=True) == DirectItems(
        2, [str(tmp_path / "a.parquet")], [(0, 0, 2)], ["v"]
    )
    # A bare `{uri}` is no reference `load_input` reads (it says so): not read here either.
    assert direct_items({"uri": tmp_path.as_uri()}, local=True) is None


def test_a_footer_pyarrow_cannot_take_leaves_the_items_to_the_jvm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"v": [1]}), tmp_path / "a.parquet")

    def unsupported(path: str) -> None:
        raise pa.ArrowNotImplementedError("a type pyarrow does not read")

    monkeypatch.setattr(pq, "read_metadata", unsupported)
    assert direct_items({"format": "parquet", "path": str(tmp_path)}, local=True) is None


class _Row:
    def __init__(self, **values: Any) -> None:
        self.values = values

    def asDict(self) -> dict[str, Any]:  # noqa: N802 - Spark's Row
        return dict(self.values)


def _answer(task: int, file: str, ran: int) -> _Row:
    return _Row(
        task=task, file=file, ran=ran, ok=ran, fails=0, first_fail=None, first_error=None, chars=0
    )


def test_commit_keeps_the_answered_attempts_files_and_replaces_the_old_output(
    tmp_path: Path,
) -> None:
    staging = tmp_path / ".out.key"
    staging.mkdir()
    for name in ("part-00000-7.parquet", "part-00001-8.parquet", "part-00001-9.parquet"):
        (staging / name).write_text(name)
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.parquet").write_text("old")
    # Task 1 ran twice (8 died after writing, 9 answered): 9's file is the one kept.
    answers = commit(
        [_answer(1, "part-00001-9.parquet", 2), _answer(0, "part-00000-7.parquet", 3)],
        2,
        staging,
        final,
    )
    assert [a.task for a in answers] == [0, 1]
    assert sorted(p.name for p in final.iterdir()) == [
        "_SUCCESS",
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    assert (final / "part-00001.parquet").read_text() == "part-00001-9.parquet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_commit_refuses_a_job_that_did_not_answer_for_every_task(tmp_path: Path) -> None:
    staging = tmp_path / ".out.key"
    staging.mkdir()
    (staging / "part-00000-1.parquet").write_text("x")
    final = tmp_path / "out"
    with pytest.raises(RuntimeError, match="answered for 1 of 2 tasks"):
        commit([_answer(0, "part-00000-1.parquet", 1)], 2, staging, final)
    assert not final.exists() and not staging.exists()


def test_a_data_folder_elsewhere_keeps_the_rows_to_spark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The direct job writes with python on this disk: a configured `s3a://` (or any
    # remote) data folder must be written by Spark.
    from flowtide.spark.loop import _local_output
    from flowtide.tools.base import ToolContext

    ctx = ToolContext(execution_id=1, step="s", data_dir=tmp_path)
    monkeypatch.delenv("FLOWTIDE_SPARK_DATA_DIR", raising=False)
    assert _local_output(ctx)
    monkeypatch.setenv("FLOWTIDE_SPARK_DATA_DIR", "s3a://bucket/flowtide")
    assert not _local_output(ctx)
    monkeypatch.setenv("FLOWTIDE_SPARK_DATA_DIR", str(tmp_path / "shared"))
    assert _local_output(ctx)


def _parquet_plan(tmp_path: Path, values: list[int], group_rows: int) -> tuple[Any, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "items"
    data.mkdir()
    pq.write_table(pa.table({"v": values}), data / "a.parquet", row_group_size=group_rows)
    items = direct_items({"format": "parquet", "path": str(data)}, local=True)
    assert items is not None and items.columns == ["v"]
    prep = SimpleNamespace(items=None, columns=["v"], unwrap="v")
    return items, SimpleNamespace(prep=prep)


def _read(plan: dict[str, Any], tasks: int, runner: Any) -> list[tuple[int, Any]]:
    from flowtide.spark.direct import _chunks

    out: list[tuple[int, Any]] = []
    for task in range(tasks):
        for indexes, items in _chunks(plan, task, runner):
            out += zip(indexes, items, strict=True)
    return out


def test_a_file_with_fewer_rows_than_its_footer_said_fails_the_task(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    items, runner = _parquet_plan(tmp_path, list(range(10)), 10)
    # Rewritten between the driver's look at the footers and the tasks' reads: the tasks
    # must not answer for rows they never ran.
    pq.write_table(pa.table({"v": list(range(4))}), items.files[0])
    plan = {"key": "changed", "files": items.files, "slices": items.slices(2)}
    with pytest.raises(RuntimeError, match="items changed while it ran: row group 0 of"):
        _read(plan, 2, runner)


def test_a_large_row_group_is_read_a_chunk_at_a_time_and_not_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flowtide.spark import direct

    items, runner = _parquet_plan(tmp_path, [v * 10 for v in range(50)], 20)
    monkeypatch.setattr(direct, "CHUNK_ROWS", 3)
    monkeypatch.setattr(direct, "_last_group", None)
    # Every group is "large": read by batches, the rows before a slice dropped.
    monkeypatch.setattr(direct, "WHOLE_GROUP_BYTES", 0)
    plan = {"key": "large", "files": items.files, "slices": items.slices(7)}
    chunks = [indexes for t in range(7) for indexes, _ in _read_task(plan, t, runner)]
    assert max(map(len, chunks)) <= 3
    assert [x for _, x in _read(plan, 7, runner)] == [v * 10 for v in range(50)]
    assert [i for i, _ in _read(plan, 7, runner)] == list(range(50))
    assert direct._last_group is None
    # A small group is read whole once and kept for the next slice of it.
    monkeypatch.setattr(direct, "WHOLE_GROUP_BYTES", 64 << 20)
    assert [x for _, x in _read(plan, 7, runner)] == [v * 10 for v in range(50)]
    assert direct._last_group is not None and direct._last_group[0] == ("large", 0, 2)


def _read_task(plan: dict[str, Any], task: int, runner: Any) -> list[tuple[list[int], Any]]:
    from flowtide.spark.direct import _chunks

    return list(_chunks(plan, task, runner))


@pytest.mark.parametrize("step", ["..", ".", "", "a/../..", "../x", "a b"])
def test_a_steps_folder_is_inside_its_executions_whatever_its_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, step: str
) -> None:
    # A loop's (or any spark step's) output folder is replaced as a whole: a step named
    # ".." must not make it the data folder, nor "." the execution's.
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    from flowtide.spark.datasets import default_location
    from flowtide.tools.base import ToolContext

    monkeypatch.delenv("FLOWTIDE_SPARK_DATA_DIR", raising=False)
    ctx = ToolContext(execution_id=7, step=step, data_dir=tmp_path)
    where = Path(url2pathname(urlparse(default_location(ctx)).path))
    assert os.path.normpath(where).startswith(str(tmp_path / "7") + os.sep)
    assert where.parent == tmp_path / "7" and where.name not in ("", ".", "..")
    # Nor do two steps share one: each replaces its own.
    twin_name = re.sub("[^A-Za-z0-9_=-]", "_", step) or "_"
    twin = ToolContext(execution_id=7, step=twin_name, data_dir=tmp_path)
    assert default_location(twin) != default_location(ctx)
    plain = ToolContext(execution_id=7, step="load_2.x-y=z", data_dir=tmp_path)
    assert default_location(plain) == (tmp_path / "7" / "load_2.x-y=z").as_uri()


def test_what_a_killed_drivers_job_left_is_cleared_before_the_next(tmp_path: Path) -> None:
    from flowtide.spark.direct import clear_left

    key, other = "1f2e" * 8, "9a0b" * 8
    final = tmp_path / "work"
    (tmp_path / f".work.{key}").mkdir()
    (tmp_path / f".work.{key}" / "part-00000-7.parquet").write_text("x")
    (tmp_path / f".work.{key}.commit").mkdir()
    # Another step's (`work.x` may be running beside it), and the output itself, stay.
    kept = [f".work.x.{other}", f".work2.{other}", ".workx", "work"]
    for name in kept:
        (tmp_path / name).mkdir()
    clear_left(final)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
