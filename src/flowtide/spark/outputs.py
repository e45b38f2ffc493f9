"""A spark step's output read back without Spark: the rows of a result reference
(`datasets.reference`), read by DuckDB from the files it names. No JVM starts.

Readable here: parquet (hive partitions included), csv and json on this machine's disk,
which is where a step without a sink writes (`datasets.default_location`). Anything else
(jdbc, orc, text, s3a://, hdfs://) is for Spark to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowtide.errors import DatasetError

__all__ = ["OutputRows", "output_reference", "read_output"]

_READERS = {"parquet": "read_parquet", "csv": "read_csv_auto", "json": "read_json_auto"}


@dataclass(frozen=True)
class OutputRows:
    """Rows of a step's output: `rows` (JSON-ready, at most the limit asked for) and
    `row_count`, the number of rows the output holds."""

    uri: str
    format: str
    columns: list[str]
    rows: list[dict[str, Any]]
    row_count: int


def output_reference(result: Any) -> dict[str, Any] | None:
    """The dataset reference in a spark step's result (a spark loop's own; a loop of
    spark steps: its first iteration's), or None when the result is not one."""
    ref = result
    if isinstance(ref, dict) and "uri" in ref and "format" in ref:
        return ref
    if isinstance(ref, dict) and isinstance(ref.get("results"), list) and ref["results"]:
        ref = ref["results"][0]
    if isinstance(ref, dict) and "uri" in ref and "format" in ref:
        return ref
    return None


def _source(path: Path, fmt: str) -> str:
    """The DuckDB table function that reads `path` (a file, or a folder of part files)."""
    pattern = str(path / "**" / "*") if path.is_dir() else str(path)
    if fmt == "parquet" and path.is_dir():
        pattern = str(path / "**" / "*.parquet")
    options = ", hive_partitioning = true" if fmt == "parquet" else ""
    quoted = pattern.replace("'", "''")
    return f"{_READERS[fmt]}('{quoted}'{options})"


def read_output(reference: Mapping[str, Any], *, limit: int = 0) -> OutputRows:
    """Read the rows `reference` names.

    Args:
        reference: a result reference (`{uri, format, ...}`).
        limit: rows to return (0: all); `row_count` counts them all either way.
    Returns:
        The columns, the rows and how many there are.
    Raises:
        DatasetError: reason "not_local" when the output is not parquet, csv or json on
            this machine's disk; "unreadable" when DuckDB cannot read it.
    """
    uri, fmt = reference.get("uri"), str(reference.get("format"))
    if not isinstance(uri, str) or not uri.startswith(("file:", "/")) or fmt not in _READERS:
        raise DatasetError(
            "only parquet, csv and json on this machine's disk can be read here; "
            "read it with Spark",
            reason="not_local",
            uri=uri,
            format=fmt,
        )
    import duckdb

    source = _source(Path(uri.removeprefix("file://")), fmt)
    con = duckdb.connect()
    try:
        total = con.execute(f"SELECT count(*) FROM {source}").fetchone()
        cursor = con.execute(f"SELECT * FROM {source}" + (f" LIMIT {limit}" if limit else ""))
        columns = [d[0] for d in cursor.description]
        fetched = cursor.fetchall()
    except duckdb.Error as exc:
        raise DatasetError(
            f"cannot read {uri}: {exc}", reason="unreadable", uri=uri, format=fmt
        ) from exc
    finally:
        con.close()
    from flowtide.errors import ToolError
    from flowtide.jsonvalues import records

    try:
        rows = records(columns, fetched, root="rows")
    except ToolError as exc:
        raise DatasetError(
            f"cannot show {uri}: {exc.message}", reason="unreadable", uri=uri, format=fmt
        ) from None
    count = int(total[0]) if total else len(rows)
    return OutputRows(uri, fmt, columns, rows, count)
