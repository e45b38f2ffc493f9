"""A `transfer` with `engine: spark`: the data pipeline runs on Spark, not in the worker.

The transfer becomes a spark task that `flowtide.tools.spark` runs on the process's one
session (`flowtide.spark.session`: local, Spark Connect or a cluster, and the PostgreSQL
JDBC driver scripts/ensure-spark.sh installs): the source is its one input (`jdbc` with
`fetchsize = chunk_size` for postgres, Spark's file readers for parquet/csv/json, the
records of one request for http), the mapping is a SELECT over it, and the target is its
sink (`jdbc` with `batchsize = chunk_size` and `stringtype=unspecified`, so PostgreSQL
parses each text value as its column's type as on the python engine; `replace` is
Spark's overwrite with `truncate`, which empties the table and keeps it; files are
written as Spark writes them, a folder of part files at `path`).

Not on Spark: duckdb ends, `upsert` and a target's own `query` (the python engine has
them). Rows are counted by the write itself; `chunks_processed` is the number of
`chunk_size` batches those rows make.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext

if TYPE_CHECKING:
    from flowtide.tools.transfer import Plan

__all__ = ["transfer_on_spark"]


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _field(path: str) -> str:
    """A source field as Spark SQL: a dotted path reaches into structs."""
    return ".".join(_quote(part) for part in path.split("."))


def _auth(spec: Mapping[str, Any], side: str) -> Any:
    auth = spec.get("auth") or spec.get("credential") or spec.get("dsn")
    if isinstance(auth, Mapping):
        auth = auth.get("credential") or auth.get("key") or auth.get("alias")
    if not isinstance(auth, str) or not auth.strip():
        raise ToolError(
            f"a postgres {side} on spark needs `auth`: a credential alias or a DSN",
            kind="config_error",
        )
    return auth


def _input(
    source: Mapping[str, Any], source_type: str, chunk_size: int, ctx: ToolContext
) -> tuple[Any, int | None]:
    if source_type == "http":
        from flowtide.tools.transfer_sources import read_http

        with read_http(source, ctx, chunk_size) as src:
            records = [record for chunk in src.chunks for record in chunk]
        if not records:
            raise ToolError("the http source returned no records", kind="config_error")
        return records, src.fetched
    if source_type == "postgres":
        if source.get("params") is not None:
            raise ToolError(
                "a postgres source on spark cannot bind `params` (Spark's JDBC reader sends "
                "its query as text): use engine: python, or a query without values",
                kind="config_error",
            )
        query = source.get("query") or source.get("sql")
        spec: dict[str, Any] = {
            "format": "jdbc",
            "auth": _auth(source, "source"),
            "options": {"fetchsize": chunk_size},
        }
        if query:
            spec["query"] = str(query).strip().rstrip(";")
        elif source.get("table"):
            spec["table"] = str(source["table"])
        else:
            raise ToolError("a postgres source needs `query` or `table`", kind="config_error")
        return spec, None
    return {
        "format": source_type,
        "path": source.get("path") or source.get("uri"),
        "options": dict(source.get("options") or {}),
    }, None


def _sink(
    target: Mapping[str, Any], target_type: str, mode: str, chunk_size: int
) -> dict[str, Any]:
    spark_mode = "overwrite" if mode == "replace" else "append"
    if target_type == "postgres":
        return {
            "format": "jdbc",
            "table": str(target.get("table")),
            "auth": _auth(target, "target"),
            "mode": spark_mode,
            "options": {"batchsize": chunk_size, "truncate": "true", "stringtype": "unspecified"},
        }
    return {
        "format": target_type,
        "path": target.get("path") or target.get("uri"),
        "mode": spark_mode,
        "options": dict(target.get("options") or {}),
    }


def transfer_on_spark(plan: Plan, ctx: ToolContext) -> dict[str, Any]:
    """Run the transfer as a spark task; the counts for the transfer's result.

    Raises:
        ToolError: kind "config_error" for what Spark does not do here (module
            docstring), and the spark tool's kinds.
    """
    from flowtide.tools.spark import SparkTool

    source, source_type, target, target_type = (
        plan.source,
        plan.source_type,
        plan.target,
        plan.target_type,
    )
    mode, mapping, chunk_size = plan.mode, plan.mapping, plan.chunk_size

    if "duckdb" in (source_type, target_type):
        raise ToolError("duckdb ends of a transfer run on engine: python", kind="config_error")
    if mode == "upsert" or target.get("query"):
        raise ToolError(
            "upsert and a target `query` run on engine: python (Spark's JDBC writer appends "
            "or overwrites)",
            kind="config_error",
        )
    spec, fetched = _input(source, source_type, chunk_size, ctx)
    if mapping:
        select = ", ".join(f"{_field(path)} AS {_quote(col)}" for col, path in mapping.items())
    else:
        select = "*"
    reference = SparkTool().run(
        {
            "kind": "spark",
            "inputs": {"source": spec},
            "sql": f"SELECT {select} FROM source",
            "sink": _sink(target, target_type, mode, chunk_size),
        },
        ctx,
    )
    rows = int(reference.get("row_count") or 0)
    out: dict[str, Any] = {
        "rows_read": rows,
        "rows_written": rows,
        "chunks_processed": math.ceil(rows / chunk_size),
        "columns": [column["name"] for column in reference.get("schema") or []],
    }
    if target_type != "postgres":
        out["target_path"] = reference.get("uri")
        out["format"] = target_type
    if fetched is not None:
        out["records_fetched"] = fetched
    return out
