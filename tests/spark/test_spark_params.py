"""`params` on spark steps: values bound by spark.sql(text, args=...), never pasted; a jdbc
source, which has no bind parameters, refuses them. Real local Spark (and PostgreSQL)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import Runner

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

# Pasted into '...', this would close the literal and add statements of its own.
ATTACK = "x'; DROP VIEW o; SELECT 'y"


def test_named_and_positional_params_are_bound_as_values(run_playbook: Runner) -> None:
    result = run_playbook(
        """\
        workload: {name: "", min_id: 0}
        workflow:
          - step: start
            tool:
              kind: spark
              inputs: {o: [{"id": 1, "label": "a"}, {"id": 2, "label": "b"}, {"id": 3, "label": "c"}]}
              sql: |
                CREATE OR REPLACE TEMP VIEW picked AS SELECT * FROM o WHERE id > :min_id;
                SELECT :name AS name, count(*) AS n, array_contains(:labels, 'c') AS has_c
                FROM picked
              params: {name: "{{ name }}", min_id: "{{ min_id }}", labels: ["c"], unused: 1}
            next: [positional]
          - step: positional
            tool:
              kind: spark
              inputs: {o: [{"id": 1}, {"id": 2}]}
              sql: SELECT ? AS name, count(*) AS n FROM o WHERE id >= ?
              params: ["{{ name }}", 2]
        """,
        workload={"name": ATTACK, "min_id": 1},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    assert result.step("start")["result"]["preview"] == [{"name": ATTACK, "n": 2, "has_c": True}]
    assert result.step("positional")["result"]["preview"] == [{"name": ATTACK, "n": 1}]


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        (
            '{kind: spark, sql: "SELECT ? AS a; SELECT ? AS b", params: [1]}',
            "binds the ? placeholders of one statement, and `sql` has 2",
        ),
        (
            '{kind: spark, sql: "SELECT :a AS a", params: {a: {k: 1}}}',
            "value a is a mapping, which Spark cannot bind",
        ),
        (
            "{kind: spark, sql: SELECT * FROM src, inputs: {src: {format: jdbc, "
            'url: "jdbc:postgresql://127.0.0.1:1/x", query: "SELECT 1", params: [1]}}}',
            "a jdbc source cannot bind `params`",
        ),
    ],
    ids=["list-over-statements", "mapping-value", "jdbc-source"],
)
def test_params_spark_cannot_bind_are_config_errors(
    run_playbook: Runner, tool: str, message: str
) -> None:
    result = run_playbook(
        f"""\
        workflow:
          - step: start
            tool: {tool}
        """
    )
    assert result.doc["status"] == "failed"
    error = result.doc["error"]
    assert error["step"] == "start" and error["kind"] == "config_error"
    assert message in error["message"]


@pytest.mark.postgres
def test_jdbc_values_go_through_the_steps_sql_params(run_playbook: Runner, pg_server: Any) -> None:
    import psycopg

    table = f"spark_params_{int(time.time() * 1000)}"
    with psycopg.connect(pg_server.dsn) as conn:
        conn.execute(f"CREATE TABLE public.{table} (id int, name text)".encode())
        conn.execute(
            f"INSERT INTO public.{table} VALUES (1, %s), (2, 'bob')".encode(),
            ["o'brien"],
        )
    result = run_playbook(
        f"""\
        workload: {{who: ""}}
        workflow:
          - step: start
            tool:
              kind: spark
              inputs: {{people: {{format: jdbc, auth: pg_test, table: public.{table}}}}}
              sql: SELECT id, name FROM people WHERE name = :who
              params: {{who: "{{{{ who }}}}"}}
        """,
        workload={"who": "o'brien"},
        credentials={"pg_test": pg_server.credential()},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    assert result.step("start")["result"]["preview"] == [{"id": 1, "name": "o'brien"}]
    with psycopg.connect(pg_server.dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM public.{table}".encode()).fetchone() == (2,)
