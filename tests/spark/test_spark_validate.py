"""`kind: spark` in the loader: a broken spark step is rejected before anything runs,
with file:line, the step and the field."""

from __future__ import annotations

from textwrap import dedent

import pytest

from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook.loader import parse_playbook


def errors_of(tool: str) -> list[PlaybookError]:
    text = dedent(
        """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: t, path: t}
        workflow:
          - step: start
            tool:
        """
    ) + "\n".join("      " + line for line in dedent(tool).splitlines())
    with pytest.raises(PlaybookError) as info:
        parse_playbook(text + "\n", "pb.yaml")
    exc = info.value
    return exc.errors if isinstance(exc, PlaybookErrors) else [exc]


def test_a_valid_spark_step_loads() -> None:
    text = dedent(
        """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: t, path: t}
        workflow:
          - step: start
            tool:
              kind: spark
              inputs:
                orders: {format: csv, path: data/orders.csv}
              sql: SELECT count(*) AS n FROM orders
              sink: {format: parquet, path: out/n, mode: overwrite, partition_by: [n]}
        """
    )
    playbook = parse_playbook(text, "pb.yaml")
    task = playbook.steps["start"].tasks[0]
    assert task.kind == "spark"
    assert task.config["inputs"]["orders"]["format"] == "csv"


def test_spark_without_sql_or_code_names_the_field() -> None:
    [err] = errors_of("kind: spark\ninputs: {a: [1]}")
    assert (err.line, err.step, err.field) == (6, "start", "tool.sql")
    assert "'sql'" in err.message and "'code'" in err.message
    assert err.render().startswith("pb.yaml:6:")


def test_spark_with_both_sql_and_code_is_rejected() -> None:
    [err] = errors_of("kind: spark\nsql: SELECT 1\ncode: 'def main(spark): return None'")
    assert err.field == "tool.code"
    assert err.line == 9


def test_unknown_sink_format_and_mode_suggest_the_right_word() -> None:
    errs = errors_of(
        "kind: spark\nsql: SELECT 1\nsink: {format: parquett, path: x, mode: overwrit}"
    )
    by_field = {e.field: e for e in errs}
    assert "did you mean 'parquet'" in by_field["tool.sink.format"].message
    assert "did you mean 'overwrite'" in by_field["tool.sink.mode"].message


def test_sinks_need_their_location() -> None:
    [err] = errors_of("kind: spark\nsql: SELECT 1\nsink: {format: jdbc, auth: pg}")
    assert err.field == "tool.sink.table"
    [err] = errors_of("kind: spark\nsql: SELECT 1\nsink: {format: csv}")
    assert err.field == "tool.sink.path"


def test_input_names_must_be_sql_identifiers() -> None:
    [err] = errors_of("kind: spark\nsql: SELECT 1\ninputs: {my-orders: [1]}")
    assert err.field == "tool.inputs.my-orders"
    assert err.line == 9


def test_a_password_in_the_playbook_is_refused() -> None:
    [err] = errors_of(
        "kind: spark\nsql: SELECT 1\nsink: {format: jdbc, table: t, options: {password: hunter2}}"
    )
    assert err.field == "tool.sink.options.password"
    assert "credential" in (err.expected or "")


def test_templated_sink_fields_are_checked_at_run_time() -> None:
    text = dedent(
        """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: t, path: t}
        workload: {fmt: parquet}
        workflow:
          - step: start
            tool:
              kind: spark
              sql: SELECT 1 AS x
              sink: {format: "{{ fmt }}", path: out, mode: "{{ 'overwrite' }}"}
        """
    )
    assert parse_playbook(text, "pb.yaml").steps["start"].tasks[0].kind == "spark"
