"""The dev stack's database login is no superuser: it owns the stack's databases (so
migrations run through it) and nothing more; the superuser is reached on the cluster's
Unix socket only, as the OS account running PostgreSQL. A cluster made by an older
flowtide, whose login was the superuser, is converted on `up`, saying so in one line."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from flowtide.dev.postgres import LocalPostgres, find_pg_bin, free_port
from flowtide.dev.stack import DevStack

pytestmark = pytest.mark.skipif(find_pg_bin() is None, reason="PostgreSQL server not installed")

#: What the login must not be able to do, and the words PostgreSQL refuses it with.
FORBIDDEN = [
    ("COPY (SELECT 1) TO PROGRAM 'true'", "pg_execute_server_program"),
    ("SELECT pg_read_file('/etc/passwd')", "permission denied"),
    ("CREATE DATABASE x", "permission denied to create database"),
    ("CREATE ROLE x", "permission denied to create role"),
]


def assert_plain_owner(dsn: str) -> None:
    """Connected as `dsn`'s user: no superuser, none of the forbidden powers."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == (False, False, False)
        for statement, refusal in FORBIDDEN:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=refusal):
                conn.execute(statement)


@pytest.fixture
def home() -> Iterator[Path]:
    # Under /tmp, world-traversable: as root, PostgreSQL runs as another account.
    base = Path(tempfile.mkdtemp(prefix="flowtide-roles-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base / ".flowtide"
    finally:
        stack = DevStack(base / ".flowtide")
        for part in stack.pg_parts():
            part.pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def _old_cluster(pg: LocalPostgres) -> None:
    """initdb as flowtide did before: the login is the bootstrap superuser, with the
    password, trust on the socket."""
    pg.root.mkdir(parents=True)
    pg.socket_dir.mkdir()
    pwfile = pg.root / "pwfile"
    pwfile.write_text(pg.password + "\n")
    (pg.root / "commands.log").touch()
    for path in (pg.root, pg.socket_dir, pwfile, pg.root / "commands.log"):
        pg._chown(path)
    pg._run(
        ["initdb", "-D", str(pg.datadir), "-U", pg.user, "--pwfile", str(pwfile)]
        + ["--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale"]
    )


def test_an_older_stacks_superuser_login_is_demoted_on_up(home: Path) -> None:
    stack = DevStack(home)
    stack.config.pg_port = free_port()
    stack.config.tls = False
    pg = stack.postgres
    _old_cluster(pg)
    pg.start(durable=False)
    # The old stack's data: its database, owned by the login, with a table, a sequence
    # of its own and a view.
    with psycopg.connect(pg.url("postgres"), autocommit=True) as conn:
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'flowtide'").fetchone()
        conn.execute("CREATE DATABASE flowtide")
    with psycopg.connect(pg.url("flowtide"), autocommit=True) as conn:
        conn.execute("CREATE TABLE item (id bigserial PRIMARY KEY, v text)")
        conn.execute("CREATE SEQUENCE ticket")
        conn.execute("CREATE VIEW items AS SELECT * FROM item")
        conn.execute("INSERT INTO item (v) VALUES ('kept')")

    lines: list[str] = []
    stack._up_postgres(lines.append, timeout=60)
    notes = [line for line in lines if "superuser" in line]
    assert notes == [
        "postgres: made the login 'flowtide' a plain owner of its databases (it was the"
        " superuser, now 'postgres' on the socket only)"
    ], lines
    assert_plain_owner(pg.url("flowtide"))
    # Same password, and what it had is its own still: a migration can change it.
    with psycopg.connect(pg.url("flowtide"), autocommit=True) as conn:
        conn.execute("ALTER TABLE item ADD COLUMN w int")
        conn.execute("INSERT INTO item (v) VALUES ('new')")
        assert conn.execute("SELECT v FROM items ORDER BY id").fetchall() == [("kept",), ("new",)]
        conn.execute("ALTER SEQUENCE ticket RESTART")
        conn.execute("DROP VIEW items")
    # The superuser has no password and TCP refuses it.
    with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects"):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{pg.port}/postgres").close()

    # Once converted, `up` says nothing more, after a restart too.
    pg.stop()
    again: list[str] = []
    stack._up_postgres(again.append, timeout=60)
    assert not [line for line in again if "superuser" in line], again
    assert_plain_owner(pg.url("flowtide"))


def test_the_socket_lets_in_only_the_servers_account(home: Path) -> None:
    stack = DevStack(home)
    stack.config.pg_port = free_port()
    stack.config.tls = False
    stack._up_postgres(lambda _: None, timeout=60)
    pg = stack.postgres
    assert pg.socket_dir.stat().st_mode & 0o077 == 0
    if os.geteuid() != 0 or pg.os_user is None:
        pytest.skip("needs root: another OS account to be refused")
    psql = Path(pg.bindir or "").joinpath("initdb").resolve().parent / "psql"
    assert psql.is_file()
    # `nobody` (the account python steps run as) cannot connect to the socket as the
    # superuser, nor as the login.
    probe = [
        "runuser",
        "-u",
        "nobody",
        "--",
        str(psql),
        "-h",
        str(pg.socket_dir),
        "-p",
        str(pg.port),
        "-U",
        "postgres",
        "-c",
        "SELECT 1",
    ]
    import subprocess

    done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode != 0, done.stdout
    assert "Permission denied" in done.stderr, done.stderr
