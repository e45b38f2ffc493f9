"""The `spark` tool: a step's data work on Spark, through PySpark.

Config (templates already rendered):

* `inputs: {name: ...}` - records, an earlier spark step's result, or a source (see
  `flowtide.spark.datasets`). Each becomes a temp view `name` for `sql` and a DataFrame
  argument `name` for `code`.
* `sql:` Spark SQL over the inputs (several statements separated by `;` run in order; the
  last one's rows are the result), with values bound through `params:` - a mapping for
  `:name` placeholders (shared by every statement) or a list for `?` in a one-statement
  `sql` - which `spark.sql(text, args=...)` binds as typed literals, never as text; or
  `code:` Python defining
  `def main(spark, **inputs)` that returns a DataFrame, or None for side effects only
  (module-level `return` and a global `result` work as in the python tool). `code` also
  sees `F` (pyspark.sql.functions) and `Window`, and the task's `input:` values.
* `sink: {format, path | table + url/auth, mode, partition_by, options}` (optional).
  Without one, the result is written as parquet under the execution's data folder.
* `conf: {...}` runtime SQL conf for this step only; `timeout:` seconds.

The result is a reference, never the dataset: `{uri, format, schema, row_count, preview}`.
The call event records the session (master, app id), the step's Spark job ids (Connect:
operation ids), its duration and the rows written.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from flowtide import tracing
from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext

__all__ = ["SparkTool"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JVM_TRACE = re.compile(r"\n\s*(JVM stacktrace:|\tat |at org\.|at scala\.|at java\.).*", re.S)
_runs = itertools.count(1)


def _message(exc: BaseException) -> str:
    """Spark's message without the JVM stack trace."""
    text = str(exc)
    java = getattr(exc, "java_exception", None)
    if java is not None:  # py4j: str() is the whole Java trace; the message is enough
        try:
            text = str(java.toString())
        except Exception:
            pass
    text = _JVM_TRACE.sub("", text).strip()
    return text[:4000]


def shown_statement(statement: str, run: Any, ctx: ToolContext) -> str:
    """A SQL statement as its `[spark]` line shows it: masked first (the values the run's
    log masks and the call's secrets), then on one line and cut at 160 characters (a
    secret cut in two, or whose spaces were joined, would no longer be found)."""
    from flowtide.redaction import known, mask_text

    log = getattr(run, "log", None)
    secrets = log.known_secrets() if log is not None else set(known())
    shown = " ".join(mask_text(statement, secrets | ctx.secrets).split())
    return shown if len(shown) <= 160 else shown[:159] + "…"


def _connection_lost(exc: BaseException) -> bool:
    text = str(exc)
    return "UNAVAILABLE" in text or "Connection refused" in text or "failed to connect" in text


def _translate(
    exc: BaseException, step: str, reason: str | None, timeout: float | None
) -> ToolError:
    """A ToolError for anything Spark raised (nothing above this module sees py4j/grpc)."""
    if reason == "cancelled":
        return ToolError(
            f"spark step '{step}': cancelled, its Spark jobs were stopped", kind="cancelled"
        )
    if reason == "timeout":
        return ToolError(
            f"spark step '{step}': no result after {timeout:g} s, its Spark jobs were stopped",
            kind="timeout",
            retryable=True,
        )
    from pyspark.errors import AnalysisException, PySparkException

    code = None
    if isinstance(exc, PySparkException):
        try:
            code = exc.getCondition()
        except Exception:
            code = None
    if isinstance(exc, AnalysisException):
        return ToolError(f"spark step '{step}': {_message(exc)}", kind="analysis_error", code=code)
    if _connection_lost(exc):
        return ToolError(
            f"spark step '{step}': lost the Spark server: {_message(exc)}",
            kind="connection",
            retryable=True,
            code=code,
        )
    return ToolError(
        f"spark step '{step}': {type(exc).__name__}: {_message(exc)}",
        kind="spark_error",
        code=code or type(exc).__name__,
    )


def _check_config(config: Mapping[str, Any]) -> None:
    has_sql = config.get("sql") not in (None, "")
    has_code = config.get("code") not in (None, "")
    if has_sql == has_code:
        raise ToolError(
            "spark task needs exactly one of `sql` (Spark SQL over the inputs) or `code` "
            "(Python with def main(spark, **inputs))",
            kind="config_error",
        )
    inputs = config.get("inputs") or {}
    if not isinstance(inputs, Mapping):
        raise ToolError("spark `inputs` must be a mapping of name -> input", kind="config_error")
    for name in inputs:
        if not _NAME.match(str(name)):
            raise ToolError(
                f"spark input name {name!r} must be an identifier (letters, digits, _): it "
                "becomes a SQL view and a Python argument",
                kind="config_error",
            )
    for key in ("sink", "conf"):
        if config.get(key) is not None and not isinstance(config[key], Mapping):
            raise ToolError(f"spark `{key}` must be a mapping", kind="config_error")
    if config.get("params") is not None and not has_sql:
        raise ToolError(
            "spark `params` binds the placeholders of `sql`; `code` takes its values "
            "through `input` (and may call spark.sql(text, args=...) itself)",
            kind="config_error",
        )


def _params(
    config: Mapping[str, Any], step: str, statement_count: int
) -> list[Any] | dict[str, Any] | None:
    """`params` as spark.sql's `args`: Spark turns each value into a typed literal of the
    parsed plan (named `:name` for a mapping, `?` for a list), so no value is ever SQL."""
    from flowtide.tools.postgres import read_params

    params = read_params(config, "spark", step)
    if params is None:
        return None
    if isinstance(params, list) and statement_count > 1:
        # Each statement would count its ? from the first value again.
        raise ToolError(
            f"step '{step}': spark `params` is a list, which binds the ? placeholders of one "
            f"statement, and `sql` has {statement_count}: use a mapping (:name placeholders, "
            "shared by every statement)",
            kind="config_error",
        )
    values = params.items() if isinstance(params, dict) else enumerate(params, start=1)
    for key, value in values:
        # Spark has no literal for a Python mapping (UNSUPPORTED_FEATURE.LITERAL_TYPE).
        if isinstance(value, Mapping):
            raise ToolError(
                f"step '{step}': spark `params` value {key} is a mapping, which Spark cannot "
                "bind: pass its fields as separate parameters, or a JSON string "
                "(`| tojson`) to read with from_json",
                kind="config_error",
            )
    return params


def _is_frame(value: Any) -> bool:
    from pyspark.sql import DataFrame

    return isinstance(value, DataFrame)


class SparkTool:
    """Runs `kind: spark` tasks on the process's shared SparkSession."""

    kind = "spark"

    def __init__(self) -> None:
        self._warming: threading.Thread | None = None

    def warm(
        self,
        executor: Mapping[str, Any] | None = None,
        data_dir: Any = None,
        spark_loops: bool = False,
    ) -> None:
        """Start the shared session in the background while the first steps run (the JVM
        takes seconds); the first spark step waits for it. With `spark_loops` (the
        playbook has one), also start the session's python workers with flowtide loaded
        (`flowtide.spark.direct.warm_workers`), which a loop's first tasks would wait for.
        Errors are left for the steps to report."""
        from flowtide.spark.session import resolve_settings, sessions

        if self._warming is not None and self._warming.is_alive():
            return
        if sessions.active and not spark_loops:
            return
        try:
            settings = resolve_settings(executor)
        except ToolError:
            return
        log_dir = _log_dir(data_dir)

        def start() -> None:
            try:
                session = sessions.root(settings, log_dir)
                if spark_loops:
                    from flowtide.spark.direct import warm_workers

                    warm_workers(session)
            except Exception:
                pass

        self._warming = threading.Thread(target=start, name="flowtide-spark-start", daemon=True)
        self._warming.start()

    def cancel(self, execution_id: int | None = None) -> int:
        """Stop the Spark jobs of `execution_id` (every execution when None)."""
        from flowtide.spark import activity

        if execution_id is None:
            return activity.cancel_all()
        return activity.cancel_execution(execution_id)

    def run(self, config: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Run one spark task; returns the result reference.

        Raises:
            ToolError: kinds "config_error", "analysis_error" (bad SQL, missing column or
                path), "spark_error", "connection" (retryable), "timeout" (retryable),
                "cancelled", "python_error" (from `code`).
        """
        _check_config(config)
        # With traces on, the Spark work is a span under the command's, and its
        # traceparent goes to the driver with the run (flowtide.spark.activity).
        with tracing.span("spark", {"flowtide.step": ctx.step}) as traceparent:
            return self._run(config, ctx, traceparent)

    def _run(
        self, config: dict[str, Any], ctx: ToolContext, traceparent: str | None
    ) -> dict[str, Any]:
        from flowtide.spark import activity
        from flowtide.spark.datasets import empty_reference, load_input, reference, write
        from flowtide.spark.session import resolve_settings, sessions, shown_master

        settings = resolve_settings(ctx.executor)
        timeout = ctx.timeout
        meta: dict[str, Any] = {}
        ctx.call_meta["spark"] = meta
        t0 = time.monotonic()
        run: activity.SparkRun | None = None
        try:
            with sessions.step_session(
                settings, step_conf=config.get("conf"), log_dir=_log_dir(ctx.data_dir)
            ) as (spark, warnings):
                if sessions.info is not None:
                    meta.update(sessions.info.as_dict())
                # Sessions this process has started: 1 for the life of a worker.
                meta["session_starts"] = sessions.starts
                if warnings:
                    meta["warnings"] = warnings
                run = activity.SparkRun(
                    tag=f"flowtide-{ctx.execution_id}-{next(_runs)}",
                    execution_id=ctx.execution_id,
                    step=ctx.step,
                    session=spark,
                    connect=settings.connect,
                    cancelled=ctx.cancelled,
                    deadline=(time.monotonic() + timeout) if timeout else None,
                    traceparent=traceparent,
                    driver_log=sessions.info.log_file if sessions.info is not None else None,
                    stdout=ctx.stdout,
                )
                activity.begin(run)
                if sessions.info is not None:
                    i = sessions.info
                    activity.say(
                        run, f"session {shown_master(i.master)} ({i.mode}, Spark {i.version})"
                    )
                for warning in warnings or ():
                    activity.say(run, f"warning: {warning}")
                try:
                    result = self._work(spark, config, ctx, run, load_input, write, reference)
                    if result is None:
                        result = empty_reference()
                    meta["rows_written"] = result.get("row_count")
                    meta["uri"] = result.get("uri")
                    if result.get("uri"):
                        took = time.monotonic() - t0
                        n = result.get("row_count")
                        rows = f"{n} row{'' if n == 1 else 's'}"
                        activity.say(run, f"wrote {rows} to {result['uri']} ({took:.1f} s)")
                    return result
                finally:
                    meta["jobs"] = activity.end(run)
        except ToolError as exc:
            if run is not None and run.reason is not None:
                raise _translate(exc, ctx.step, run.reason, timeout) from None
            raise
        except Exception as exc:  # pyspark, py4j and grpc errors: translated here
            reason = run.reason if run is not None else None
            raise _translate(exc, ctx.step, reason, timeout) from None
        finally:
            meta["duration_ms"] = round((time.monotonic() - t0) * 1000, 3)

    @staticmethod
    def _work(
        spark: Any,
        config: Mapping[str, Any],
        ctx: ToolContext,
        run: Any,
        load_input: Any,
        write: Any,
        reference: Any,
    ) -> dict[str, Any] | None:
        phases: dict[str, float] = {}
        ctx.call_meta["spark"]["phases_ms"] = phases
        mark = [time.monotonic()]

        from flowtide.spark.activity import say

        def checkpoint(phase: str) -> None:
            now = time.monotonic()
            phases[phase] = round((now - mark[0]) * 1000, 1)
            if phase == "inputs" and frames:
                say(run, f"inputs {', '.join(frames)} read ({phases[phase]:.0f} ms)")
            mark[0] = now
            # Cancellation stops running jobs; this stops the next one from starting.
            if run.reason is not None:
                raise ToolError(f"spark step '{ctx.step}' {run.reason}", kind=run.reason)

        frames = {
            str(name): load_input(spark, str(name), spec, ctx)
            for name, spec in (config.get("inputs") or {}).items()
        }
        checkpoint("inputs")
        if config.get("sql") not in (None, ""):
            from flowtide.tools.postgres import split_sql

            for name, frame in frames.items():
                frame.createOrReplaceTempView(name)
            statements = split_sql(str(config["sql"]))
            if not statements:
                raise ToolError("spark `sql` holds no statement", kind="config_error")
            params = _params(config, ctx.step, len(statements))
            df = None
            for n, statement in enumerate(statements, 1):
                say(run, f"statement {n}/{len(statements)}: {shown_statement(statement, run, ctx)}")
                df = spark.sql(statement) if params is None else spark.sql(statement, args=params)
        else:
            df = SparkTool._run_code(spark, config, ctx, frames)
        checkpoint("plan")
        sink = config.get("sink")
        if df is None:
            if sink:
                raise ToolError(
                    "spark `code` returned no DataFrame but the step has a `sink`",
                    kind="config_error",
                )
            return None
        written = write(df, sink, ctx)
        checkpoint("write")
        result: dict[str, Any] = reference(written)
        checkpoint("preview")
        return result

    @staticmethod
    def _run_code(
        spark: Any, config: Mapping[str, Any], ctx: ToolContext, frames: dict[str, Any]
    ) -> Any:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        from flowtide.tools.python import run_user_code

        params = config.get("input") or {}
        if not isinstance(params, Mapping):
            params = {}
        clash = sorted(set(params) & set(frames))
        if clash:
            raise ToolError(
                f"spark `input` and `inputs` both define {', '.join(clash)}", kind="config_error"
            )
        value = run_user_code(
            str(config["code"]),
            ctx,
            inputs={**params, **frames},
            extra_globals={"spark": spark, "F": F, "Window": Window},
        )
        if value is not None and not _is_frame(value):
            raise ToolError(
                f"spark `code` must return a DataFrame or None, not {type(value).__name__} "
                "(use kind: python for plain values)",
                kind="config_error",
            )
        return value


def _log_dir(data_dir: Any) -> Any:
    from pathlib import Path

    if data_dir is None:
        return None
    return Path(data_dir).absolute().parent / "logs"
