"""A spark step's data: inputs to DataFrames, DataFrames to sinks, result references.

Input shapes (`inputs: {name: ...}`):

- a list of records (`"{{ start.orders }}"`), or `{records: [...], schema: "DDL"}`, or a
  SQL tool result `{rows: [...]}`;
- a result reference of an earlier spark step (`"{{ totals }}"`): `{uri, format, ...}`;
- a source `{format: parquet|csv|json|orc|text|jdbc, path | url, table | query, options,
  schema, auth}`; `{table: name}` alone reads a catalog table. A jdbc `query` is sent to
  the database as text (Spark's JDBC source has no bind parameters): values belong in the
  step's `sql` with `params`, never in the `query`.

A step's result is never the dataset itself but a reference:
`{uri, format, schema: [{name, type}], row_count, preview: [first 20 rows]}` (JDBC results
add `table` and the credential alias `auth`, never the password).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from flowtide.errors import ToolError
from flowtide.home import find_home
from flowtide.jsonvalues import to_json
from flowtide.spark.records import records_frame
from flowtide.tools.base import ToolContext

__all__ = [
    "FILE_FORMATS",
    "SINK_MODES",
    "Written",
    "default_location",
    "load_input",
    "reference",
    "write",
]

FILE_FORMATS = ("parquet", "csv", "json", "orc", "text")
SOURCE_FORMATS = (*FILE_FORMATS, "jdbc")
SINK_MODES = ("overwrite", "append", "error", "errorifexists", "ignore")
PREVIEW_ROWS = 20
_SAFE = re.compile(r"[^A-Za-z0-9_.=-]")


def _source_hint() -> str:
    return (
        "a list of records, a spark step's result ({{ step }}), or a source "
        "{format: parquet|csv|json|orc|text|jdbc, path|url, table, options}"
    )


def resolve_path(path: str, base_dir: Path) -> str:
    """A path as Spark should read it: URLs as they are, files absolute (relative ones
    against the playbook's folder), so a Connect server or cluster finds the same file."""
    if "://" in path or path.startswith("file:"):
        return path
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = base_dir / p
    return str(p)


ENV_DATA_DIR = "FLOWTIDE_SPARK_DATA_DIR"


def _folder_name(step: str) -> str:
    """A step's folder in its execution's, its own whatever its name: the name when it
    is only `_SAFE` characters and not "." or ".." (`<eid>/..` is the whole data folder,
    which an overwrite deletes), else those characters and a digest of the name (steps
    `a b` and `a_b` must not replace each other's output)."""
    safe = _SAFE.sub("_", step)
    if safe == step and safe.strip("."):
        return safe
    return f"{safe}-{hashlib.sha256(step.encode()).hexdigest()[:12]}"


def default_location(ctx: ToolContext) -> str:
    """Where a step's result goes when it has no sink:
    `<data_dir>/<execution_id>/<step>/` (plus `i<index>/` inside a loop).

    `data_dir` is `FLOWTIDE_SPARK_DATA_DIR`, else the playbook's `executor.spark.data_dir`,
    else the runtime's data folder (`.flowtide/data`). A cluster or a remote Spark Connect
    server needs storage every node sees: set it to an `s3a://`, `hdfs://` or shared path.
    """
    spark = (ctx.executor or {}).get("spark") or {}
    from flowtide.settings import SparkSection, read

    configured = read(SparkSection).data_dir or (
        spark.get("data_dir") if isinstance(spark, Mapping) else None
    )
    leaf = f"{ctx.execution_id}/{_folder_name(ctx.step)}"
    if ctx.loop_index is not None:
        leaf += f"/i{ctx.loop_index}"
    if configured and "://" in str(configured):
        return f"{str(configured).rstrip('/')}/{leaf}"
    if configured:
        root = Path(resolve_path(str(configured), ctx.base_dir))
    else:
        root = Path(ctx.data_dir or find_home() / "data").absolute()
    return (root / leaf).as_uri()


# -- credentials --------------------------------------------------------------------------


def _jdbc_from_dsn(dsn: str) -> tuple[str, dict[str, str]]:
    parsed = urlparse(dsn)
    host = parsed.hostname or "localhost"
    port = parsed.port or 5432
    db = parsed.path.lstrip("/") or "postgres"
    props = {}
    if parsed.username:
        props["user"] = unquote(parsed.username)
    if parsed.password:
        props["password"] = unquote(parsed.password)
    return f"jdbc:postgresql://{host}:{port}/{db}", props


def jdbc_connection(spec: Mapping[str, Any], ctx: ToolContext) -> tuple[str, dict[str, str]]:
    """(JDBC url, connection properties) for a jdbc source or sink.

    `auth` is a credential alias whose body has `host, port, database, user, password`
    (or `url`/`jdbc_url`), or a postgresql:// DSN; an explicit `url` wins over the alias's
    host. Passwords in `options` are refused: they would sit in the playbook and events.

    Raises:
        ToolError: kind "config_error" / "credential".
    """
    options = spec.get("options") or {}
    if isinstance(options, Mapping) and "password" in options:
        raise ToolError(
            "a JDBC password in `options` would be stored with the playbook and its "
            "events: use `auth: <credential alias>` (flowtide credential set NAME ...)",
            kind="config_error",
        )
    url = spec.get("url") or spec.get("uri")
    props: dict[str, str] = {}
    auth = spec.get("auth") or spec.get("credential")
    if isinstance(auth, str) and auth.strip():
        auth = auth.strip()
        if auth.startswith(("postgresql://", "postgres://")):
            ctx.add_secret(auth)
            dsn_url, props = _jdbc_from_dsn(auth)
            url = url or dsn_url
        else:
            body = ctx.resolve_credential(auth)
            given = body.get("jdbc_url") or body.get("url")
            if isinstance(given, str) and given.startswith("jdbc:"):
                url = url or given
            elif isinstance(given, str) and given.startswith(("postgresql://", "postgres://")):
                ctx.add_secret(given)
                dsn_url, props = _jdbc_from_dsn(given)
                url = url or dsn_url
            elif not url:
                host = body.get("host") or body.get("hostname") or "localhost"
                port = body.get("port") or 5432
                db = body.get("database") or body.get("dbname") or body.get("db") or "postgres"
                url = f"jdbc:postgresql://{host}:{port}/{db}"
            user = body.get("user") or body.get("username")
            if user:
                props["user"] = str(user)
            if body.get("password") not in (None, ""):
                props["password"] = str(body["password"])
    elif auth not in (None, ""):
        raise ToolError(
            "JDBC `auth` must be a credential alias or a postgresql:// DSN", kind="config_error"
        )
    if not url:
        raise ToolError(
            "a jdbc source or sink needs `url` (jdbc:postgresql://host:port/db) or `auth` "
            "(a credential alias)",
            kind="config_error",
        )
    url = str(url)
    if url.startswith(("postgresql://", "postgres://")):
        url, dsn_props = _jdbc_from_dsn(url)
        props = {**dsn_props, **props}
    if url.startswith("jdbc:postgresql:"):
        props.setdefault("driver", "org.postgresql.Driver")
    if props.get("password"):
        ctx.add_secret(props["password"])
    return url, props


# -- inputs -------------------------------------------------------------------------------


def _apply_options(reader: Any, options: Mapping[str, Any]) -> Any:
    for key, value in options.items():
        reader = reader.option(str(key), _opt(value))
    return reader


def _opt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _read_source(session: Any, name: str, spec: Mapping[str, Any], ctx: ToolContext) -> Any:
    fmt = str(spec.get("format") or "").lower()
    options = dict(spec.get("options") or {})
    if not isinstance(spec.get("options") or {}, Mapping):
        raise ToolError(f"input '{name}': `options` must be a mapping", kind="config_error")
    if fmt == "jdbc":
        if spec.get("params") is not None:
            # Spark's JDBC source sends `query` to the database as text inside its own
            # SELECT: it has no bind parameters, and pretending otherwise would mean pasting.
            raise ToolError(
                f"input '{name}': a jdbc source cannot bind `params` (Spark sends its `query` "
                "as text); read the table or a value-free `query`, and filter in the step's "
                "`sql` with `params` (Spark pushes simple filters down to the database)",
                kind="config_error",
            )
        url, props = jdbc_connection(spec, ctx)
        reader = session.read.format("jdbc").option("url", url)
        for key, value in props.items():
            reader = reader.option(key, value)
        if spec.get("query"):
            reader = reader.option("query", str(spec["query"]))
        elif spec.get("table"):
            reader = reader.option("dbtable", str(spec["table"]))
        else:
            raise ToolError(
                f"input '{name}': a jdbc source needs `table` or `query`", kind="config_error"
            )
        return _apply_options(reader, options).load()
    if not fmt and spec.get("table"):
        return session.table(str(spec["table"]))
    if fmt not in FILE_FORMATS:
        raise ToolError(
            f"input '{name}': unsupported format {fmt or '(none)'!r}; expected one of "
            + ", ".join(SOURCE_FORMATS),
            kind="config_error",
        )
    location = spec.get("path") or spec.get("uri") or spec.get("url")
    if not location:
        raise ToolError(f"input '{name}': a {fmt} source needs `path`", kind="config_error")
    paths = location if isinstance(location, list) else [location]
    paths = [resolve_path(str(p), ctx.base_dir) for p in paths]
    if fmt == "csv":
        options.setdefault("header", "true")
        if not spec.get("schema"):
            options.setdefault("inferSchema", "true")
    reader = _apply_options(session.read.format(fmt), options)
    if spec.get("schema"):
        reader = reader.schema(str(spec["schema"]))
    return reader.load(paths if len(paths) > 1 else paths[0])


def _read_reference(session: Any, name: str, ref: Mapping[str, Any], ctx: ToolContext) -> Any:
    if not ref.get("uri"):
        raise ToolError(
            f"input '{name}' is a spark result without data (its step returned no DataFrame)",
            kind="config_error",
        )
    fmt = str(ref.get("format") or "parquet").lower()
    if fmt == "jdbc":
        return _read_source(session, name, {**ref, "url": ref["uri"]}, ctx)
    reader = _apply_options(session.read.format(fmt), dict(ref.get("options") or {}))
    if fmt in ("csv", "json") and ref.get("schema"):
        ddl = ", ".join(f"`{c['name']}` {c['type']}" for c in ref["schema"])
        reader = reader.schema(ddl)
    return reader.load(str(ref["uri"]))


def load_input(session: Any, name: str, spec: Any, ctx: ToolContext) -> Any:
    """The DataFrame for input `name` (see the module docstring for the shapes).

    Raises:
        ToolError: kind "config_error" for a shape flowtide does not know; Spark's own
            errors (missing path, bad JDBC table) propagate for the caller to translate.
    """
    if isinstance(spec, list | tuple):
        return records_frame(session, list(spec), name=name)
    if isinstance(spec, Mapping):
        if "uri" in spec and ("row_count" in spec or "schema" in spec or "format" in spec):
            return _read_reference(session, name, spec, ctx)
        if "records" in spec:
            records = spec["records"]
            if not isinstance(records, list | tuple):
                raise ToolError(
                    f"input '{name}': `records` must be a list, got {type(records).__name__}",
                    kind="config_error",
                )
            return records_frame(session, list(records), name=name, schema=spec.get("schema"))
        if "format" in spec or "table" in spec:
            return _read_source(session, name, spec, ctx)
        if isinstance(spec.get("rows"), list):
            return records_frame(session, spec["rows"], name=name)
        keys = ", ".join(sorted(map(str, spec))[:8])
        raise ToolError(
            f"input '{name}' is a mapping with keys [{keys}]; expected " + _source_hint(),
            kind="config_error",
        )
    raise ToolError(
        f"input '{name}' is {type(spec).__name__} {str(spec)[:80]!r}; expected " + _source_hint(),
        kind="config_error",
    )


# -- sinks and references -----------------------------------------------------------------


@dataclass
class Written:
    """Where a result went and what it holds."""

    uri: str
    format: str
    schema: list[dict[str, str]]
    rows: int
    preview: Any  # a DataFrame of at most PREVIEW_ROWS rows, read back from the sink
    table: str | None = None
    auth: str | None = None
    options: dict[str, str] | None = None


def _schema(df: Any) -> list[dict[str, str]]:
    return [{"name": f.name, "type": f.dataType.simpleString()} for f in df.schema.fields]


def _counted(df: Any) -> tuple[Any, Any]:
    """`df` with a row counter that the write itself fills in (an observed metric): no
    second pass over the data to learn how many rows were written."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation()
    return df.observe(observation, F.count(F.lit(1)).alias("rows")), observation


def write(df: Any, sink: Mapping[str, Any] | None, ctx: ToolContext) -> Written:
    """Write `df` to `sink` (or to the execution's data folder as parquet) and describe it.

    Raises:
        ToolError: kind "config_error" for a malformed sink; Spark errors propagate.
    """
    sink = sink or {"format": "parquet", "path": default_location(ctx), "mode": "overwrite"}
    fmt = str(sink.get("format") or "parquet").lower()
    mode = str(sink.get("mode") or "error").lower()
    if mode not in SINK_MODES:
        raise ToolError(
            f"sink mode {mode!r}; expected one of {', '.join(SINK_MODES)}", kind="config_error"
        )
    options = {str(k): _opt(v) for k, v in dict(sink.get("options") or {}).items()}
    partition_by = sink.get("partition_by") or []
    if isinstance(partition_by, str):
        partition_by = [partition_by]
    schema = _schema(df)
    # `ignore` onto existing data runs nothing, so the counter would never be filled.
    counted, observation = (df, None) if mode == "ignore" else _counted(df)
    session = df.sparkSession
    if fmt == "jdbc":
        table = sink.get("table")
        if not table:
            raise ToolError("a jdbc sink needs `table`", kind="config_error")
        url, props = jdbc_connection(sink, ctx)
        writer = counted.write.format("jdbc").mode(mode).option("url", url)
        writer = writer.option("dbtable", str(table))
        for key, value in {**props, **options}.items():
            writer = writer.option(key, value)
        writer.save()
        reader = session.read.format("jdbc").option("url", url).option("dbtable", str(table))
        for key, value in props.items():
            reader = reader.option(key, value)
        back = reader.load()
        auth = sink.get("auth") if isinstance(sink.get("auth"), str) else None
        if auth and auth.startswith(("postgresql://", "postgres://")):
            auth = None  # a DSN is a secret: never part of a result
        rows = _rows(observation, back)
        return Written(
            url, "jdbc", schema, rows, back.limit(PREVIEW_ROWS), table=str(table), auth=auth
        )
    if fmt not in FILE_FORMATS:
        raise ToolError(
            f"sink format {fmt!r}; expected one of {', '.join((*FILE_FORMATS, 'jdbc'))}",
            kind="config_error",
        )
    location = sink.get("path") or sink.get("uri")
    if not location:
        raise ToolError(f"a {fmt} sink needs `path`", kind="config_error")
    uri = resolve_path(str(location), ctx.base_dir)
    if fmt == "csv":
        options.setdefault("header", "true")
    writer = counted.write.format(fmt).mode(mode)
    if partition_by:
        writer = writer.partitionBy(*[str(c) for c in partition_by])
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(uri)
    read_options = {"header": options["header"]} if fmt == "csv" else None
    reader = _apply_options(session.read.format(fmt), read_options or {})
    if fmt in ("csv", "json") or (fmt in ("parquet", "orc") and not partition_by):
        # The schema is known: reading it back from the files would cost a Spark job.
        # (Partitioned outputs keep inference: partition columns come from folder names.)
        reader = reader.schema(df.schema)
    back = reader.load(uri)
    return Written(
        uri, fmt, schema, _rows(observation, back), back.limit(PREVIEW_ROWS), options=read_options
    )


def _rows(observation: Any, written: Any) -> int:
    if observation is not None:
        return int(observation.get["rows"])
    return int(written.count())


def _row(row: Any, index: int) -> dict[str, Any]:
    value: dict[str, Any] = to_json(
        row.asDict(recursive=True), root=f"result['preview'][{index}]", kind="spark_error"
    )
    return value


def reference(written: Written) -> dict[str, Any]:
    """The step result for `written`: uri, format, schema, row_count, preview."""
    out: dict[str, Any] = {
        "uri": written.uri,
        "format": written.format,
        "schema": written.schema,
        "row_count": written.rows,
        "preview": [_row(r, i) for i, r in enumerate(written.preview.collect())],
    }
    if written.table:
        out["table"] = written.table
    if written.auth:
        out["auth"] = written.auth
    if written.options:
        out["options"] = written.options
    return out


def empty_reference() -> dict[str, Any]:
    """The result of a `code:` step that returned no DataFrame (side effects only)."""
    return {"uri": None, "format": None, "schema": [], "row_count": None, "preview": []}
