"""TransferTool against a real PostgreSQL, the HTTP stub, DuckDB and files on disk."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from flowtide.errors import PlaybookErrors, ToolError
from flowtide.playbook import parse_playbook
from flowtide.tools import transfer_sources, transfer_targets
from flowtide.tools.transfer import TransferTool, endpoint_type

pytestmark = pytest.mark.postgres


def run(config: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return TransferTool().run({"kind": "transfer", **config}, ctx)


@pytest.fixture
def table() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


def sql(pg: Any, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        cur = conn.execute(statement.encode(), params or None)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def source_table(pg: Any, table: str) -> str:
    """20 rows: id, name (with a quote), amount numeric, meta jsonb, created timestamptz."""
    name = f"src_{table}"
    sql(
        pg,
        f"CREATE TABLE {name} (id int, name text, amount numeric(10,2), meta jsonb, "
        "created timestamptz DEFAULT '2024-05-01 10:00:00+00')",
    )
    sql(
        pg,
        f"INSERT INTO {name} (id, name, amount, meta) SELECT g, 'it''s ' || g, g * 1.5, "
        "jsonb_build_object('g', g) FROM generate_series(1, 20) g",
    )
    return name


def test_http_to_postgres_maps_nested_fields_and_coerces_types(
    make_ctx: Any, pg: Any, pg_alias: str, http_stub: Any, table: str
) -> None:
    # Columns whose types differ from the JSON values: id arrives as a number into text,
    # the user id into smallint, tags (a list) into jsonb.
    sql(
        pg,
        f"CREATE TABLE {table} (pk serial, item_id text, user_id smallint, title text, tags jsonb)",
    )
    ctx = make_ctx()
    result = run(
        {
            "source": {
                "type": "http",
                "url": f"{http_stub.url}/records?n=25",
                "data_path": "data.items",
            },
            "target": {
                "type": "postgres",
                "auth": pg_alias,
                "table": f"public.{table}",
                "mapping": {
                    "item_id": "id",
                    "user_id": "user.id",
                    "title": "title",
                    "tags": "tags",
                },
            },
            "chunk_size": 10,
        },
        ctx,
    )
    assert result["status"] == "success"
    assert result["direction"] == "http_to_postgres"
    assert result["rows_transferred"] == result["rows_written"] == result["rows_read"] == 25
    assert result["records_fetched"] == 25
    assert result["chunks_processed"] == 3
    assert result["columns"] == ["item_id", "user_id", "title", "tags"]
    assert result["mode"] == "append" and result["engine"] == "python"
    rows = sql(pg, f"SELECT item_id, user_id, title, tags FROM {table} ORDER BY pk LIMIT 2")
    assert rows == [("1", 1, "it's 1", ["a"]), ("2", 2, "it's 2", ["a"])]
    # No credential in what the step records.
    password = pg.credential()["password"]
    assert password not in json.dumps(result)
    assert ctx.call_meta["transfer"] == {"rows": 25, "chunks": 3}


def test_postgres_to_postgres_append_then_replace(
    make_ctx: Any, pg: Any, pg_alias: str, source_table: str, table: str
) -> None:
    sql(
        pg,
        f"CREATE TABLE {table} (id bigint, name varchar(40), amount text, meta jsonb, created timestamptz)",
    )
    config = {
        "source": {
            "type": "postgres",
            "auth": pg_alias,
            "query": f"SELECT * FROM {source_table} WHERE id > %(min)s",
            "params": {"min": 5},
        },
        "target": {"type": "postgres", "auth": pg_alias, "table": table},
        "chunk_size": 4,
    }
    first = run(config, make_ctx())
    assert first["rows_written"] == 15 and first["chunks_processed"] == 4
    assert first["columns"] == ["id", "name", "amount", "meta", "created"]
    run(config, make_ctx())
    assert sql(pg, f"SELECT count(*) FROM {table}") == [(30,)]
    replaced = run({**config, "mode": "replace"}, make_ctx())
    assert replaced["mode"] == "replace"
    assert sql(pg, f"SELECT count(*) FROM {table}") == [(15,)]
    row = sql(pg, f"SELECT id, name, amount, meta, created::text FROM {table} ORDER BY id LIMIT 1")
    assert row == [(6, "it's 6", "9.00", {"g": 6}, "2024-05-01 10:00:00+00")]


def test_upsert_on_the_first_column(
    make_ctx: Any, pg: Any, pg_alias: str, source_table: str, table: str
) -> None:
    sql(pg, f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
    sql(pg, f"INSERT INTO {table} VALUES (1, 'old'), (99, 'kept')")
    result = run(
        {
            "source": {
                "type": "postgres",
                "auth": pg_alias,
                "query": f"SELECT id, name FROM {source_table}",
            },
            "target": {"type": "postgres", "auth": pg_alias, "table": table, "mode": "upsert"},
        },
        make_ctx(),
    )
    assert result["mode"] == "upsert" and result["rows_written"] == 20
    assert sql(pg, f"SELECT count(*) FROM {table}") == [(21,)]
    assert sql(pg, f"SELECT name FROM {table} WHERE id IN (1, 99) ORDER BY id") == [
        ("it's 1",),
        ("kept",),
    ]


def test_a_failed_write_leaves_the_target_as_it_was(
    make_ctx: Any, pg: Any, pg_alias: str, http_stub: Any, table: str
) -> None:
    sql(pg, f"CREATE TABLE {table} (id int, title int)")
    sql(pg, f"INSERT INTO {table} VALUES (0, 0)")
    with pytest.raises(ToolError) as info:
        run(
            {
                "source": {
                    "type": "http",
                    "url": f"{http_stub.url}/records?n=5",
                    "data_path": "data.items",
                },
                "target": {
                    "type": "postgres",
                    "auth": pg_alias,
                    "table": table,
                    "mapping": {"id": "id", "title": "title"},
                },
                "mode": "replace",
            },
            make_ctx(),
        )
    assert info.value.kind == "sql_error" and info.value.code == "22P02"  # "it's 1" is no int
    assert sql(pg, f"SELECT * FROM {table}") == [(0, 0)]


def test_a_mapped_column_the_table_lacks_is_a_config_error(
    make_ctx: Any, pg: Any, pg_alias: str, http_stub: Any, table: str
) -> None:
    sql(pg, f"CREATE TABLE {table} (id int)")
    with pytest.raises(ToolError) as info:
        run(
            {
                "source": {
                    "type": "http",
                    "url": f"{http_stub.url}/records?n=2",
                    "data_path": "data.items",
                },
                "target": {
                    "type": "postgres",
                    "auth": pg_alias,
                    "table": table,
                    "mapping": {"id": "id", "nope": "title"},
                },
            },
            make_ctx(),
        )
    assert info.value.kind == "config_error" and "no column nope" in info.value.message


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_postgres_to_files(
    make_ctx: Any, pg_alias: str, source_table: str, tmp_path: Path, fmt: str
) -> None:
    result = run(
        {
            "source": {
                "type": "postgres",
                "auth": pg_alias,
                "query": f"SELECT id, name, amount, meta FROM {source_table} ORDER BY id",
            },
            "target": {"type": fmt, "path": f"out/data.{fmt}"},
            "chunk_size": 6,
        },
        make_ctx(),
    )
    path = tmp_path / "out" / f"data.{fmt}"
    assert result["target_path"] == str(path) and result["format"] == fmt
    assert result["chunks_processed"] == 4 and result["rows_written"] == 20
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no staging left
    reader = {"parquet": "read_parquet", "csv": "read_csv_auto", "json": "read_json_auto"}[fmt]
    rows = duckdb.sql(f"SELECT id, name, amount FROM {reader}('{path}') ORDER BY id").fetchall()
    assert len(rows) == 20 and rows[0] == (1, "it's 1", 1.5)


def test_files_and_duckdb_both_ways(
    make_ctx: Any, pg: Any, pg_alias: str, source_table: str, tmp_path: Path, table: str
) -> None:
    db = str(tmp_path / "local.duckdb")
    # postgres -> duckdb: the table does not exist yet and is created from the data.
    to_duck = run(
        {
            "source": {
                "type": "postgres",
                "auth": pg_alias,
                "query": f"SELECT id, name FROM {source_table}",
            },
            "target": {"type": "duckdb", "database": db, "table": "items"},
            "chunk_size": 8,
        },
        make_ctx(),
    )
    assert to_duck["chunks_processed"] == 3
    # duckdb -> parquet -> postgres
    run(
        {
            "source": {
                "type": "duckdb",
                "database": db,
                "query": "SELECT id, name FROM items WHERE id <= $n",
                "params": {"n": 10},
            },
            "target": {"type": "file", "format": "parquet", "path": str(tmp_path / "ten.parquet")},
        },
        make_ctx(),
    )
    sql(pg, f"CREATE TABLE {table} (id int, name text)")
    back = run(
        {
            "source": {"type": "parquet", "path": "ten.parquet"},
            "target": {"type": "postgres", "auth": pg_alias, "table": table},
            "chunk_size": 3,
        },
        make_ctx(),
    )
    assert back["direction"] == "parquet_to_postgres" and back["chunks_processed"] == 4
    assert sql(pg, f"SELECT count(*), max(id) FROM {table}") == [(10, 10)]


def test_memory_holds_one_chunk(
    make_ctx: Any, pg_alias: str, source_table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded memory by design: the source is a server-side cursor read chunk_size rows
    at a time, and each chunk is written before the next is fetched."""
    events: list[tuple[str, int]] = []
    real_write = transfer_targets.FileWriter.write

    def write(self: Any, rows: list[list[Any]]) -> None:
        events.append(("write", len(rows)))
        real_write(self, rows)

    real_records = transfer_sources.as_records

    def counted(columns: Any, batch: Any) -> Any:
        events.append(("fetch", len(batch)))
        return real_records(columns, batch)

    monkeypatch.setattr(transfer_targets.FileWriter, "write", write)
    monkeypatch.setattr(transfer_sources, "as_records", counted)
    run(
        {
            "source": {
                "type": "postgres",
                "auth": pg_alias,
                "query": f"SELECT * FROM {source_table}",
            },
            "target": {"type": "json", "path": "all.json"},
            "chunk_size": 7,
        },
        make_ctx(),
    )
    assert events == [
        ("fetch", 7),
        ("write", 7),
        ("fetch", 7),
        ("write", 7),
        ("fetch", 6),
        ("write", 6),
    ]


def test_config_errors(make_ctx: Any) -> None:
    with pytest.raises(ToolError, match="source.type 'ftp'"):
        run({"source": {"type": "ftp"}, "target": {"type": "json", "path": "x"}}, make_ctx())
    with pytest.raises(ToolError, match="mode 'merge'"):
        run(
            {
                "source": {"type": "json", "path": "x"},
                "target": {"type": "json", "path": "y"},
                "mode": "merge",
            },
            make_ctx(),
        )
    with pytest.raises(ToolError, match="needs `table`"):
        run(
            {"source": {"type": "json", "path": "x"}, "target": {"type": "postgres", "auth": "a"}},
            make_ctx(),
        )


def test_the_loader_checks_a_transfer() -> None:
    text = """\
workflow:
  - step: start
    tool:
      kind: transfer
      source: {type: ftp, url: x}
      target: {table: t}
      mode: merge
"""
    with pytest.raises(PlaybookErrors) as info:
        parse_playbook(text, "pb.yaml")
    found = [(e.line, e.step, e.field) for e in info.value.errors]
    assert found == [
        (5, "start", "tool.source.type"),
        (6, "start", "tool.target.type"),
        (7, "start", "tool.mode"),
    ]
    assert "pb.yaml:5" in str(info.value)


def test_the_loader_takes_every_spelling_the_tool_runs() -> None:
    # What `endpoint_type` accepts when the step runs, `validate` accepts too: NoETL's
    # other names of a type, and `type: file` with its `format`.
    text = """\
workflow:
  - step: start
    tool:
      kind: transfer
      source: {type: pg, auth: a, query: "SELECT 1"}
      target: {type: file, format: ndjson, path: out.json}
  - step: again
    tool:
      kind: transfer
      source: {type: postgresql, auth: a, query: "SELECT 1"}
      target: {type: file, format: xlsx, path: out.xlsx}
"""
    assert endpoint_type({"type": "pg"}, "source") == "postgres"
    assert endpoint_type({"type": "file", "format": "ndjson"}, "target") == "json"
    with pytest.raises(PlaybookErrors) as info:
        parse_playbook(text, "pb.yaml")
    found = [(e.line, e.step, e.field) for e in info.value.errors]
    assert found == [(11, "again", "tool.target.format")]
