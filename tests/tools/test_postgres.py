"""PostgresTool against a real server (tests/pgserver.py); split_sql as pure logic."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from flowtide.errors import ToolError
from flowtide.jsonvalues import to_json
from flowtide.tools import postgres as pgmod
from flowtide.tools.postgres import PostgresTool, split_sql


@pytest.fixture
def table() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def run(config: dict[str, Any], ctx: Any) -> Any:
    return PostgresTool().run({"kind": "postgres", **config}, ctx)


# ---------------------------------------------------------------------------------------
# split_sql (no server)
# ---------------------------------------------------------------------------------------


def test_split_basic_and_trailing_whitespace() -> None:
    assert split_sql("SELECT 1; SELECT 2;\n\n") == ["SELECT 1", "SELECT 2"]
    assert split_sql("SELECT 1") == ["SELECT 1"]
    assert split_sql(" ; ;\n") == []


def test_split_respects_quotes_and_identifiers() -> None:
    script = """INSERT INTO t VALUES ('a;b', 'it''s;'); SELECT "weird;col" FROM "x""y;z";"""
    assert split_sql(script) == [
        "INSERT INTO t VALUES ('a;b', 'it''s;')",
        'SELECT "weird;col" FROM "x""y;z"',
    ]


def test_split_escape_strings() -> None:
    script = r"SELECT E'a\';b'; SELECT 'c\'; SELECT 2"
    # In E'' a backslash escapes the quote; in a standard string it is a plain character.
    assert split_sql(script) == [r"SELECT E'a\';b'", r"SELECT 'c\'", "SELECT 2"]


def test_split_dollar_quoting() -> None:
    script = """
    DO $$ BEGIN RAISE NOTICE 'x;y'; END $$;
    SELECT $fn$ a ; b $fn$;
    SELECT $a$ $$ ; $a$;
    PREPARE q AS SELECT $1::int; SELECT price$ FROM t;
    """
    assert split_sql(script) == [
        "DO $$ BEGIN RAISE NOTICE 'x;y'; END $$",
        "SELECT $fn$ a ; b $fn$",
        "SELECT $a$ $$ ; $a$",
        "PREPARE q AS SELECT $1::int",
        "SELECT price$ FROM t",
    ]


def test_split_comments() -> None:
    script = """
    -- leading comment; with a semicolon
    SELECT 1; -- trailing; comment
    /* block ; /* nested ; */ still comment ; */
    SELECT 2;
    -- only a comment here;
    """
    statements = split_sql(script)
    assert len(statements) == 2
    assert statements[0].endswith("SELECT 1")
    assert statements[1].endswith("SELECT 2")


def test_split_unterminated_string_keeps_the_rest() -> None:
    assert split_sql("SELECT 'abc; SELECT 2") == ["SELECT 'abc; SELECT 2"]


def test_driver_values_become_json() -> None:
    # The rules themselves are tested in tests/unit/test_jsonvalues.py.
    import datetime as dt
    from decimal import Decimal

    value = {
        "d": Decimal("1.50"),
        "i": Decimal("600"),
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "date": dt.date(2024, 1, 2),
        "u": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "b": b"\x00\xff",
        "td": dt.timedelta(minutes=1),
        "nan": float("nan"),
        "nested": [(1, Decimal("2.5"))],
    }
    converted = to_json(value)
    assert converted == {
        "d": 1.5,
        "i": 600,
        "ts": "2024-01-02T03:04:05+00:00",
        "date": "2024-01-02",
        "u": "12345678-1234-5678-1234-567812345678",
        "b": "AP8=",
        "td": 60.0,
        "nan": None,  # JSON has no NaN (was "nan": README, Results as JSON)
        "nested": [[1, 2.5]],
    }
    json.dumps(converted, allow_nan=False)


def test_missing_sql_is_a_config_error(make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        run({"auth": "postgresql://u:p@127.0.0.1:1/db"}, make_ctx())
    assert info.value.kind == "config_error"
    assert "command" in info.value.message
    with pytest.raises(ToolError) as info:
        run({"auth": "x", "command": "-- nothing\n"}, make_ctx())
    assert info.value.kind == "config_error"


def test_missing_auth_is_a_config_error(make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        run({"command": "SELECT 1"}, make_ctx())
    assert info.value.kind == "config_error"


def test_unknown_alias_names_it_and_says_how_to_add_it(make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        run({"auth": "pg_nowhere", "command": "SELECT 1"}, make_ctx())
    assert info.value.kind == "credential"
    assert "pg_nowhere" in info.value.message
    assert "flowtide credential set pg_nowhere --json" in info.value.message


# ---------------------------------------------------------------------------------------
# Against the server
# ---------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_multi_statement_result_shape(pg_alias: str, make_ctx: Any, table: str) -> None:
    result = run(
        {
            "auth": pg_alias,
            "command": f"""
                CREATE TABLE {table} (id int PRIMARY KEY, name text);
                INSERT INTO {table} VALUES (1, 'a'), (2, 'b;c');
                SELECT id, name FROM {table} ORDER BY id;
                UPDATE {table} SET name = name || '!' WHERE id = 1;
            """,
        },
        make_ctx(),
    )
    assert set(result) == {
        "command_0",
        "command_1",
        "command_2",
        "command_3",
        "columns",
        "rows",
        "row_count",
    }
    assert result["command_0"] == {"columns": [], "rows": [], "row_count": 0, "status": "ok"}
    assert result["command_1"]["row_count"] == 2
    assert result["command_2"] == {
        "columns": ["id", "name"],
        "rows": [{"id": 1, "name": "a"}, {"id": 2, "name": "b;c"}],
        "row_count": 2,
        "status": "ok",
    }
    assert result["command_3"]["row_count"] == 1
    # The flat keys repeat the last statement that returned rows, not the trailing UPDATE.
    assert result["rows"] == result["command_2"]["rows"]
    assert result["columns"] == ["id", "name"]
    assert result["row_count"] == 2
    json.dumps(result)


@pytest.mark.postgres
def test_flat_keys_fall_back_to_last_statement(pg_alias: str, make_ctx: Any, table: str) -> None:
    result = run(
        {
            "credential": pg_alias,
            "query": f"CREATE TABLE {table} (a int); INSERT INTO {table} "
            "SELECT generate_series(1, 3)",
        },
        make_ctx(),
    )
    assert result["rows"] == []
    assert result["row_count"] == 3
    assert result["columns"] == []


@pytest.mark.postgres
def test_do_blocks_and_dollar_quoted_semicolons(pg_alias: str, make_ctx: Any, table: str) -> None:
    ctx = make_ctx()
    result = run(
        {
            "auth": pg_alias,
            "command": f"""
                -- a comment; with a semicolon
                CREATE TABLE {table} (v text);
                DO $$
                BEGIN
                    INSERT INTO {table} VALUES ('from do; block');
                    RAISE NOTICE 'inserted; one';
                END
                $$;
                DO $body$ BEGIN INSERT INTO {table} VALUES ($q$tagged;$$;$q$); END $body$;
                /* block ; comment */
                INSERT INTO {table} VALUES ('it''s; quoted'), (E'back\\'slash;');
                SELECT v FROM {table} WHERE v LIKE '%;%' ORDER BY v;
            """,
        },
        ctx,
    )
    assert [row["v"] for row in result["rows"]] == sorted(
        ["from do; block", "tagged;$$;", "it's; quoted", "back'slash;"]
    )
    assert any("inserted; one" in line for line in ctx.stdout)


@pytest.mark.postgres
def test_jsonb_and_value_types(pg_alias: str, make_ctx: Any, table: str) -> None:
    result = run(
        {
            "auth": pg_alias,
            "command": f"""
                CREATE TABLE {table} (id serial, profile jsonb, tags text[]);
                INSERT INTO {table} (profile, tags) VALUES
                    ('{{"name": "Ann", "prefs": {{"theme": "dark"}}, "n": [1, 2]}}'::jsonb,
                     ARRAY['x', 'y']);
                SELECT profile, profile->'prefs' AS prefs, profile->>'name' AS name, tags,
                       12.50::numeric AS price, 42::numeric AS whole,
                       '2024-05-06 07:08:09+00'::timestamptz AS at,
                       '2024-05-06'::date AS day,
                       'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS uid,
                       '\\x00ff'::bytea AS raw,
                       NULL::text AS nothing
                FROM {table};
            """,
        },
        make_ctx(),
    )
    row = result["rows"][0]
    assert row["profile"] == {"name": "Ann", "prefs": {"theme": "dark"}, "n": [1, 2]}
    assert row["prefs"] == {"theme": "dark"}
    assert row["name"] == "Ann"
    assert row["tags"] == ["x", "y"]
    assert row["price"] == 12.5 and isinstance(row["price"], float)
    assert row["whole"] == 42 and isinstance(row["whole"], int)
    assert row["at"].startswith("2024-05-06T07:08:09")
    assert row["day"] == "2024-05-06"
    assert row["uid"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert row["raw"] == "AP8="
    assert row["nothing"] is None
    json.dumps(result, allow_nan=False)


@pytest.mark.postgres
def test_sql_error_has_sqlstate_index_and_rolls_back(
    pg_alias: str, make_ctx: Any, table: str
) -> None:
    with pytest.raises(ToolError) as info:
        run(
            {
                "auth": pg_alias,
                "command": f"CREATE TABLE {table} (a int); SELECT * FROM no_such_table_here;",
            },
            make_ctx(),
        )
    error = info.value
    assert error.kind == "sql_error"
    assert error.code == "42P01"
    assert error.retryable is False
    assert "statement 1" in error.message
    assert "no_such_table_here" in error.message
    # The whole script is one transaction: the CREATE TABLE was rolled back.
    check = run(
        {"auth": pg_alias, "command": f"SELECT to_regclass('{table}') IS NULL AS gone"},
        make_ctx(),
    )
    assert check["rows"] == [{"gone": True}]


@pytest.mark.postgres
def test_error_in_do_block_reports_its_sqlstate(pg_alias: str, make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        run(
            {
                "auth": pg_alias,
                "command": "SELECT 1; DO $$ BEGIN RAISE EXCEPTION 'boom; %', 7 "
                "USING ERRCODE = '22012'; END $$;",
            },
            make_ctx(),
        )
    assert info.value.code == "22012"
    assert "boom; 7" in info.value.message
    assert "statement 1" in info.value.message


@pytest.mark.postgres
def test_wrong_password_is_auth_and_never_leaks(pg: Any, make_ctx: Any, vault: Any) -> None:
    secret = "Sup3r-Secret-Wrong-Pw"
    vault.set("pg_bad", {**pg.credential(), "password": secret}, kind="postgres")
    for auth in ("pg_bad", pg.dsn.replace(pg.password, secret)):
        ctx = make_ctx()
        with pytest.raises(ToolError) as info:
            run({"auth": auth, "command": "SELECT 1"}, ctx)
        error = info.value
        assert error.kind == "auth"
        assert error.retryable is False
        assert secret not in str(error)
        assert secret not in error.message
        assert secret in ctx.secrets


@pytest.mark.postgres
def test_password_not_in_sql_error_and_secrets_registered(pg: Any, make_ctx: Any) -> None:
    ctx = make_ctx()
    with pytest.raises(ToolError) as info:
        # A DSN as the auth value, and SQL that echoes nothing but fails.
        run({"auth": pg.dsn, "command": "SELECT 1/0"}, ctx)
    assert info.value.code == "22012"
    assert pg.password not in info.value.message
    assert pg.password in ctx.secrets
    assert pg.dsn in ctx.secrets


@pytest.mark.postgres
def test_dsn_forms(pg: Any, make_ctx: Any) -> None:
    key_value = (
        f"host={pg.host} port={pg.port} user={pg.user} password={pg.password} dbname={pg.database}"
    )
    inline = {
        "host": pg.host,
        "port": pg.port,
        "username": pg.user,
        "password": pg.password,
        "dbname": pg.database,
    }
    for auth in (pg.dsn, key_value, inline, {"dsn": pg.dsn}):
        result = run({"auth": auth, "command": "SELECT current_user AS who"}, make_ctx())
        assert result["rows"] == [{"who": pg.user}]


@pytest.mark.postgres
def test_alias_with_dsn_body(pg: Any, vault: Any, make_ctx: Any) -> None:
    vault.set("pg_dsn", {"connection_string": pg.dsn})
    result = run({"auth": "pg_dsn", "command": "SELECT 1 AS one"}, make_ctx())
    assert result["rows"] == [{"one": 1}]


@pytest.mark.postgres
def test_connection_refused_is_retryable(make_ctx: Any) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ToolError) as info:
        run(
            {"auth": f"postgresql://u:pw-xyz@127.0.0.1:{port}/db", "command": "SELECT 1"},
            make_ctx(),
        )
    assert info.value.kind == "connection"
    assert info.value.retryable is True
    assert "pw-xyz" not in info.value.message


@pytest.mark.postgres
def test_statement_timeout_from_ctx(pg_alias: str, make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        run({"auth": pg_alias, "command": "SELECT pg_sleep(3)"}, make_ctx(timeout=0.2))
    assert info.value.kind == "timeout"
    assert info.value.code == "57014"
    # The limit was transaction-local: the next task on the same pool is unaffected.
    result = run({"auth": pg_alias, "command": "SHOW statement_timeout"}, make_ctx())
    assert result["rows"][0]["statement_timeout"] == "0"


@pytest.mark.postgres
def test_list_of_commands(pg_alias: str, make_ctx: Any) -> None:
    result = run(
        {"auth": pg_alias, "command": ["SELECT 1 AS a", "SELECT 2 AS b; SELECT 3 AS c"]},
        make_ctx(),
    )
    assert [result[f"command_{i}"]["rows"][0] for i in range(3)] == [
        {"a": 1},
        {"b": 2},
        {"c": 3},
    ]


@pytest.mark.postgres
def test_pool_is_reused_across_parallel_tasks(pg: Any, pg_alias: str, make_ctx: Any) -> None:
    run({"auth": pg_alias, "command": "SELECT 1"}, make_ctx())
    pools_before = pgmod.pool_count()

    def task(_: int) -> int:
        result = run(
            {"auth": pg_alias, "command": "SELECT pg_backend_pid() AS pid, pg_sleep(0.02)"},
            make_ctx(),
        )
        return int(result["rows"][0]["pid"])

    with ThreadPoolExecutor(max_workers=32) as executor:
        pids = set(executor.map(task, range(100)))

    assert pgmod.pool_count() == pools_before
    assert 1 <= len(pids) <= pgmod.DEFAULT_POOL_MAX_SIZE
    sessions = run(
        {
            "auth": pg_alias,
            "command": "SELECT count(*) AS n FROM pg_stat_activity "
            "WHERE usename = current_user AND backend_type = 'client backend'",
        },
        make_ctx(),
    )
    assert sessions["rows"][0]["n"] <= pgmod.DEFAULT_POOL_MAX_SIZE + 2
