"""flowtide.spark.outputs: a spark step's output read back with DuckDB, no JVM. The files
are written by DuckDB here, in the layouts Spark writes (a folder of part files, hive
partitions)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from flowtide.errors import DatasetError
from flowtide.spark.outputs import output_reference, read_output


def _write(sql: str) -> None:
    con = duckdb.connect()
    try:
        con.execute(sql)
    finally:
        con.close()


def test_reference_of_a_step_and_of_a_loop_of_steps() -> None:
    ref = {"uri": "/x", "format": "parquet", "row_count": 1}
    assert output_reference(ref) is ref
    assert output_reference({"results": [ref, {"uri": "/y", "format": "csv"}]}) is ref
    assert output_reference({"rows": []}) is None
    assert output_reference({"results": []}) is None
    assert output_reference([1, 2]) is None
    # A spark loop's result is a reference that also holds its items' `results`.
    loop = {"uri": "/loop", "format": "parquet", "results": [{"sq": 1}], "stats": {}}
    assert output_reference(loop) is loop


def test_a_partitioned_parquet_folder_reads_with_its_partition_column(tmp_path: Path) -> None:
    out = tmp_path / "it's here"  # a quote in the path must not break the SQL
    _write(
        "COPY (SELECT range AS n, range % 2 AS odd FROM range(5)) "
        f"TO '{str(out).replace(chr(39), chr(39) * 2)}' (FORMAT parquet, PARTITION_BY (odd))"
    )
    rows = read_output({"uri": f"file://{out}", "format": "parquet"}, limit=2)
    assert rows.row_count == 5
    assert len(rows.rows) == 2
    assert set(rows.columns) == {"n", "odd"}
    everything = read_output({"uri": str(out), "format": "parquet"})
    assert sorted(r["n"] for r in everything.rows) == [0, 1, 2, 3, 4]


def test_a_csv_file(tmp_path: Path) -> None:
    out = tmp_path / "part-0.csv"
    out.write_text("region,total\neu,3\nus,4\n", encoding="utf-8")
    rows = read_output({"uri": str(out), "format": "csv"})
    assert (rows.uri, rows.format, rows.row_count) == (str(out), "csv", 2)
    assert rows.rows == [{"region": "eu", "total": 3}, {"region": "us", "total": 4}]


@pytest.mark.parametrize(
    "ref",
    [
        {"uri": "s3a://bucket/out", "format": "parquet"},
        {"uri": "/data/out", "format": "orc"},
        {"uri": "postgresql://db/x", "format": "jdbc"},
        {"uri": None, "format": None},
    ],
)
def test_what_only_spark_reads_is_refused_before_reading(ref: dict[str, object]) -> None:
    with pytest.raises(DatasetError) as info:
        read_output(ref)
    assert info.value.reason == "not_local"
    assert info.value.uri == ref["uri"]
    assert info.value.format == str(ref["format"])


def test_missing_files_are_unreadable(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        read_output({"uri": str(tmp_path / "gone"), "format": "parquet"})
    assert info.value.reason == "unreadable"
    assert str(info.value).startswith(f"cannot read {tmp_path / 'gone'}: ")
