"""The `transfer` tool: rows from a source to a target in chunks, with column mapping.

What NoETL does, read in its source: the Python executor (noetl/noetl,
noetl/tools/transfer/executor.py) takes `source` and `target`, each with its type in
`type` (or `tool`, `kind`); a database side has `auth` and `query`, an http source
`url`, `method`, `headers` and `data_path`; the target has `table` (or its own insert
`query`) and `mapping: {target column: source field}` (dotted paths reach nested
fields). `chunk_size` (default 1000) and `mode` sit on the task: `append` (the default)
inserts, `replace` truncates the table first, `upsert` inserts ON CONFLICT on the first
column. The Rust tool runner (noetl/tools, src/tools/transfer.rs) adds duckdb, returns
the same fields flat, and coerces each value to the target column's type by sending it
as text (`$n::text::<type>`). flowtide follows both:

    tool:
      kind: transfer
      source: {type: http | postgres | duckdb | parquet | csv | json, ...}
      target: {type: postgres | duckdb | parquet | csv | json, table | path, mapping}
      chunk_size: 1000
      mode: append | insert | replace | upsert      # also accepted on the target
      engine: spark                                  # optional: run it on Spark

The result (no credential, no DSN in it)::

    {"status": "success", "direction": "http_to_postgres", "source_type": "http",
     "target_type": "postgres", "mode": "append", "engine": "python",
     "rows_read": 100, "rows_written": 100, "rows_transferred": 100,
     "chunks_processed": 1, "seconds": 0.05, "target_table": "public.t",
     "columns": [...], "records_fetched": 100}

`data` is the result itself (NoETL's Python executor nested these fields under `data`).
The rows travel one chunk at a time (read by `flowtide.tools.transfer_sources`,
written by `flowtide.tools.transfer_targets`): memory holds one
chunk, except an http source, whose response is one JSON document. A PostgreSQL target
is written in one transaction (a failed transfer leaves the table as it was).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext
from flowtide.tools.builtin import (
    TRANSFER_ENGINES,
    TRANSFER_MODES,
    TRANSFER_SOURCE_TYPES,
    TRANSFER_TARGET_TYPES,
    TRANSFER_TYPE_ALIASES,
)

__all__ = ["MODES", "SOURCE_TYPES", "TARGET_TYPES", "Plan", "TransferTool"]

SOURCE_TYPES = TRANSFER_SOURCE_TYPES
TARGET_TYPES = TRANSFER_TARGET_TYPES
MODES = TRANSFER_MODES
ENGINES = TRANSFER_ENGINES
DEFAULT_CHUNK_SIZE = 1000
_TYPE_ALIASES = TRANSFER_TYPE_ALIASES


def endpoint_type(spec: Any, side: str) -> str:
    """The type of one side: `type`, `tool` or `kind`; `file` takes its `format`."""
    if not isinstance(spec, Mapping):
        raise ToolError(f"transfer `{side}` must be a mapping", kind="config_error")
    raw = spec.get("type") or spec.get("tool") or spec.get("kind")
    if str(raw or "").lower() == "file":
        raw = spec.get("format")
    kind = str(raw or "").strip().lower()
    kind = _TYPE_ALIASES.get(kind, kind)
    allowed = SOURCE_TYPES if side == "source" else TARGET_TYPES
    if kind not in allowed:
        raise ToolError(
            f"transfer {side}.type {raw!r}: expected one of {', '.join(allowed)}",
            kind="config_error",
        )
    return kind


@dataclass(frozen=True)
class Plan:
    """A checked transfer: both ends and their types, the mode, the mapping (None: the
    source's columns as they are) and the chunk size."""

    source: Mapping[str, Any]
    source_type: str
    target: Mapping[str, Any]
    target_type: str
    mode: str
    mapping: dict[str, str] | None
    chunk_size: int


def _chunk_size(config: Mapping[str, Any], target: Mapping[str, Any]) -> int:
    raw = config.get("chunk_size", target.get("chunk_size", target.get("batch_size")))
    if raw in (None, ""):
        return DEFAULT_CHUNK_SIZE
    try:
        size = int(raw)
    except (TypeError, ValueError):
        raise ToolError(
            f"transfer `chunk_size` must be a number, not {raw!r}", kind="config_error"
        ) from None
    if size < 1:
        raise ToolError("transfer `chunk_size` must be at least 1", kind="config_error")
    return size


def _mode(config: Mapping[str, Any], target: Mapping[str, Any], target_type: str) -> str:
    raw = config.get("mode") or target.get("mode")
    if raw in (None, ""):
        # Files are written whole unless asked otherwise; tables are appended to (NoETL).
        return "replace" if target_type in ("parquet", "csv", "json") else "append"
    mode = str(raw).strip().lower()
    if mode not in MODES:
        raise ToolError(
            f"transfer mode {raw!r}: expected one of {', '.join(MODES)}", kind="config_error"
        )
    return mode


def _mapping(target: Mapping[str, Any]) -> dict[str, str] | None:
    raw = target.get("mapping")
    if raw in (None, {}):
        return None
    if not isinstance(raw, Mapping):
        raise ToolError(
            "transfer target.mapping must be a mapping {target column: source field}",
            kind="config_error",
        )
    return {str(k): str(v) for k, v in raw.items()}


def lookup(record: Mapping[str, Any], path: str) -> Any:
    """A source field: the key itself, else a dotted path into nested objects (NoETL)."""
    if path in record:
        return record[path]
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
        if value is None:
            return None
    return value


def _check_engine(config: Mapping[str, Any]) -> str:
    engine = str(config.get("engine") or "python").strip().lower()
    if engine not in ENGINES:
        raise ToolError(
            f"transfer engine {engine!r}: expected one of {', '.join(ENGINES)}",
            kind="config_error",
        )
    return engine


class TransferTool:
    """Move rows from `source` to `target` (tool kind `transfer`)."""

    kind = "transfer"

    def run(self, config: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Run one transfer; returns NoETL's result fields (module docstring).

        Raises:
            ToolError: kinds "config_error" (shape, unknown type or mode, a mapped column
                the table lacks), "sql_error", "connection", "auth", "credential",
                "timeout", "cancelled", the http tool's kinds for an http source, and the
                spark tool's with `engine: spark`.
        """
        source = config.get("source")
        target = config.get("target")
        if not isinstance(source, Mapping) or not isinstance(target, Mapping):
            raise ToolError(
                "transfer needs `source` and `target` mappings, each with a `type`",
                kind="config_error",
            )
        source_type = endpoint_type(source, "source")
        target_type = endpoint_type(target, "target")
        chunk_size = _chunk_size(config, target)
        mode = _mode(config, target, target_type)
        mapping = _mapping(target)
        engine = _check_engine(config)
        if target_type in ("postgres", "duckdb") and not (
            target.get("table") or target.get("query")
        ):
            raise ToolError(
                f"transfer target ({target_type}) needs `table` (or its own insert `query`)",
                kind="config_error",
            )
        if target_type == "postgres" and not (
            target.get("auth") or target.get("credential") or target.get("dsn")
        ):
            raise ToolError(
                "transfer target (postgres) needs `auth` (a credential alias or a DSN)",
                kind="config_error",
            )
        result: dict[str, Any] = {
            "status": "success",
            "direction": f"{source_type}_to_{target_type}",
            "source_type": source_type,
            "target_type": target_type,
            "mode": "custom" if target.get("query") else mode,
            "engine": engine,
        }
        if target.get("table"):
            result["target_table"] = str(target["table"])
        t0 = time.monotonic()
        meta: dict[str, Any] = {"rows": 0, "chunks": 0}
        ctx.call_meta["transfer"] = meta
        plan = Plan(source, source_type, target, target_type, mode, mapping, chunk_size)
        if engine == "spark":
            from flowtide.tools.transfer_spark import transfer_on_spark

            counts = transfer_on_spark(plan, ctx)
        else:
            counts = self._pipe(plan, ctx, meta)
        result.update(counts)
        result["rows_transferred"] = result["rows_written"]
        result["seconds"] = round(time.monotonic() - t0, 3)
        meta.update(rows=result["rows_written"], chunks=result["chunks_processed"])
        return result

    @staticmethod
    def _pipe(plan: Plan, ctx: ToolContext, meta: dict[str, Any]) -> dict[str, Any]:
        from flowtide.tools import transfer_sources as sources
        from flowtide.tools import transfer_targets as targets

        source, source_type, target, target_type = (
            plan.source,
            plan.source_type,
            plan.target,
            plan.target_type,
        )
        mapping, chunk_size = plan.mapping, plan.chunk_size

        writer_class: type[targets.Writer]
        if target_type == "postgres":
            writer_class = targets.PostgresWriter
        elif target_type == "duckdb":
            writer_class = targets.DuckDBWriter
        else:
            writer_class = targets.FileWriter
        writer = writer_class(target, ctx, plan.mode)
        if isinstance(writer, targets.FileWriter):
            writer.fmt = target_type
        if source_type == "http":
            opened = sources.read_http(source, ctx, chunk_size)
        elif source_type == "postgres":
            opened = sources.read_postgres(source, ctx, chunk_size)
        elif source_type == "duckdb":
            opened = sources.read_duckdb(source, ctx, chunk_size)
        else:
            opened = sources.read_file(source, source_type, ctx, chunk_size)

        rows = chunks = 0
        columns: list[str] | None = None
        ok = False
        with opened as src:
            try:
                for chunk in src.chunks:
                    if ctx.cancelled is not None and ctx.cancelled():
                        raise ToolError("transfer cancelled", kind="cancelled")
                    if columns is None:
                        columns = list(mapping) if mapping else (src.columns or list(chunk[0]))
                        writer.open(columns)
                    fields = [mapping[c] for c in columns] if mapping else columns
                    writer.write([[lookup(r, f) for f in fields] for r in chunk])
                    rows += len(chunk)
                    chunks += 1
                    meta.update(rows=rows, chunks=chunks)
                if columns is None:  # no rows: the target is still opened (replace empties it)
                    columns = list(mapping) if mapping else list(src.columns or [])
                    if columns:
                        writer.open(columns)
                ok = True
            finally:
                writer.close(ok)
        out: dict[str, Any] = {
            "rows_read": rows,
            "rows_written": rows,
            "chunks_processed": chunks,
            "columns": columns or [],
            **writer.described,
        }
        if src.fetched is not None:
            out["records_fetched"] = src.fetched
        return out
