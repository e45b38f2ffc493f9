"""`kind: transfer` with `engine: spark`: PostgreSQL read over JDBC, mapped, written as
parquet by Spark (the shared local session)."""

from __future__ import annotations

import json
from typing import Any

import duckdb
import psycopg
import pytest

from .conftest import Runner

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def test_postgres_to_parquet_on_spark(run_playbook: Runner, pg_server: Any, tmp_path: Any) -> None:
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS spark_src")
        conn.execute("CREATE TABLE spark_src (id int, label text, amount numeric(8,2))")
        conn.execute(
            "INSERT INTO spark_src SELECT g, 'row ' || g, g * 0.5 FROM generate_series(1, 25) g"
        )
        conn.execute("DROP TABLE IF EXISTS spark_dst")
        conn.execute("CREATE TABLE spark_dst (item text, name text, at timestamptz DEFAULT now())")
        conn.execute("INSERT INTO spark_dst (item, name) VALUES ('old', 'replaced')")
    out = tmp_path / "out.parquet"
    result = run_playbook(
        f"""
        workflow:
          - step: start
            tool:
              kind: transfer
              engine: spark
              chunk_size: 10
              source: {{type: postgres, auth: pg, query: "SELECT id, label, amount FROM spark_src"}}
              target:
                type: parquet
                path: {out}
                mapping: {{item: id, name: label}}
            next: {{arcs: [{{step: back}}]}}
          - step: back
            tool:
              kind: transfer
              engine: spark
              mode: replace
              source: {{type: parquet, path: {out}}}
              target: {{type: postgres, auth: pg, table: public.spark_dst}}
        """,
        credentials={"pg": pg_server.credential()},
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    transfer = result.step("start")["result"]
    assert transfer["engine"] == "spark" and transfer["direction"] == "postgres_to_parquet"
    assert transfer["rows_written"] == 25 and transfer["chunks_processed"] == 3
    assert transfer["columns"] == ["item", "name"]
    rows = duckdb.sql(
        f"SELECT item, name FROM read_parquet('{out}/*.parquet') ORDER BY item"
    ).fetchall()
    assert rows[0] == (1, "row 1") and len(rows) == 25
    back = result.step("back")["result"]
    assert back["direction"] == "parquet_to_postgres" and back["rows_written"] == 25
    with psycopg.connect(pg_server.dsn) as conn:
        # replace emptied the table and kept it (its default still fills `at`)
        assert conn.execute(
            "SELECT count(*), min(item::int), count(at) FROM spark_dst"
        ).fetchone() == (25, 1, 25)
    # The step's Spark jobs are in its call event; the password in no result or call
    # (only in the secrets.added event, which is what seals it at rest).
    (call,) = result.calls("start")
    assert call["payload"]["spark"]["rows_written"] == 25
    shown = [e for e in result.events if e["type"] != "secrets.added"]
    assert pg_server.password not in json.dumps(shown) + json.dumps(result.doc)
