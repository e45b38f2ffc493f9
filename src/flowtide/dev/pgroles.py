"""Who may do what in a `LocalPostgres` cluster.

- The superuser `postgres` (the cluster's bootstrap role) logs in over the cluster's Unix
  socket only, by peer authentication: only the OS account running the server (and root,
  which runs it through that account) is let in as it; it has no password, and TCP
  refuses it.
- The login (`flowtide` by default) is what servers use over TCP with the password: with
  `login_superuser=False` (the dev stack) NOSUPERUSER NOCREATEDB NOCREATEROLE, owner of
  the databases the cluster creates for it, so migrations run through it and nothing
  else does (no COPY ... PROGRAM, no reading the server's files, no new databases).

A cluster made by an older flowtide had its login as the bootstrap superuser (initdb -U
flowtide, password, trust on the socket); `secure` turns it into the above: the
bootstrap role renamed `postgres` without a password, a new NOSUPERUSER login of the old
name and password, and the login's databases and their objects handed to it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowtide.dev.postgres import LocalPostgres

__all__ = ["ADMIN_ROLE", "LOGIN_LIMITS", "is_legacy", "secure", "write_auth"]

ADMIN_ROLE = "postgres"
#: A superuser that exists only while an older cluster's bootstrap role is renamed.
_MIGRATE_ROLE = "flowtide_migrate"
#: First line of the pg_hba.conf flowtide writes; its absence marks an older cluster.
_MARK = "# flowtide: superuser on the socket by peer, the login over TCP by password"
_MAP = "flowtide"
LOGIN_LIMITS = "NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
_SYSTEM_SCHEMAS = (
    "n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'"
)


def _os_accounts(pg: LocalPostgres) -> list[str]:
    """The OS accounts let in as the superuser: the server's, and ours when we run it
    through another account (root)."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    return sorted({pg.os_user or me, me})


def is_legacy(pg: LocalPostgres) -> bool:
    """Whether the cluster's authentication was set up by an older flowtide (no mark)."""
    try:
        return not (pg.datadir / "pg_hba.conf").read_text().startswith(_MARK)
    except FileNotFoundError:
        return False


def write_auth(pg: LocalPostgres, *, legacy: bool = False) -> None:
    """pg_hba.conf and pg_ident.conf: the socket takes the superuser by peer (the OS
    accounts of `_os_accounts`), TCP takes every role but the superuser by password (over
    TLS only when the cluster has a certificate). `legacy`: an older cluster before
    `secure` ran, whose superuser is still the login; the map lets us in as it."""
    roles = [ADMIN_ROLE, _MIGRATE_ROLE] + ([pg.user] if legacy else [])
    ident = [f"{_MAP} {account} {role}\n" for account in _os_accounts(pg) for role in roles]
    host = "hostssl" if pg.tls is not None else "host"
    hba = [
        "" if legacy else _MARK + "\n",
        f"local all all peer map={_MAP}\n",
        f"{host} all {ADMIN_ROLE} 127.0.0.1/32 reject\n",
        f"{host} all {ADMIN_ROLE} ::1/128 reject\n",
        f"{host} all all 127.0.0.1/32 scram-sha-256\n",
        f"{host} all all ::1/128 scram-sha-256\n",
    ]
    # Written in place: the files keep their owner (the server's account).
    for name, lines in (("pg_ident.conf", ident), ("pg_hba.conf", hba)):
        with open(pg.datadir / name, "w") as handle:
            handle.writelines(lines)


@contextlib.contextmanager
def admin(pg: LocalPostgres, *, role: str = ADMIN_ROLE, dbname: str = "postgres") -> Iterator[Any]:
    """A connection over the cluster's socket as the superuser (autocommit)."""
    import psycopg

    with psycopg.connect(
        host=str(pg.socket_dir), port=pg.port, user=role, dbname=dbname, autocommit=True
    ) as conn:
        yield conn


def secure(pg: LocalPostgres) -> str | None:
    """Make the running cluster's roles what this module says: the login exists with its
    password and its limits. For an older cluster (its login was the superuser), do the
    conversion and say so in one line; None otherwise."""
    note = None
    if is_legacy(pg):
        write_auth(pg, legacy=True)
        _reload(pg)
        _rename_bootstrap(pg)
        note = (
            f"made the login {pg.user!r} a plain owner of its databases (it was the"
            f" superuser, now {ADMIN_ROLE!r} on the socket only)"
        )
    with admin(pg) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{_MIGRATE_ROLE}"')
        _ensure_login(pg, conn)
        if note is not None:
            owned = conn.execute(
                "SELECT datname FROM pg_database WHERE datdba = 10 AND NOT datistemplate"
                " AND datname <> 'postgres'"
            ).fetchall()
            for (name,) in owned:
                conn.execute(f'ALTER DATABASE "{name}" OWNER TO "{pg.user}"')
                _hand_over_objects(pg, name)
    if note is not None:
        write_auth(pg)
        _reload(pg)
    return note


def _reload(pg: LocalPostgres) -> None:
    pg.reload()


def _rename_bootstrap(pg: LocalPostgres) -> None:
    """Rename an older cluster's bootstrap superuser (the login) to `postgres`, through a
    second superuser (a role cannot rename itself); no-op once done."""
    import psycopg

    conn = None
    for role in (ADMIN_ROLE, _MIGRATE_ROLE, pg.user):
        with contextlib.suppress(psycopg.OperationalError):
            conn = psycopg.connect(
                host=str(pg.socket_dir), port=pg.port, user=role, dbname="postgres", autocommit=True
            )
            break
    if conn is None:
        raise psycopg.OperationalError(f"cannot reach the superuser on {pg.socket_dir}")
    with conn:
        (boot,) = conn.execute("SELECT rolname FROM pg_roles WHERE oid = 10").fetchone() or ("",)
        if boot == ADMIN_ROLE:
            return
        conn.execute(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{_MIGRATE_ROLE}')"
            f' THEN CREATE ROLE "{_MIGRATE_ROLE}" SUPERUSER LOGIN; END IF; END $$'
        )
    with admin(pg, role=_MIGRATE_ROLE) as conn:
        conn.execute(f'ALTER ROLE "{boot}" RENAME TO "{ADMIN_ROLE}"')
        conn.execute(f'ALTER ROLE "{ADMIN_ROLE}" PASSWORD NULL')


def _ensure_login(pg: LocalPostgres, conn: Any) -> None:
    """The login role with the cluster's password and, unless `login_superuser`, its
    limits (also taken back from a role that was given more)."""
    from psycopg import sql

    limits = "SUPERUSER" if pg.login_superuser else LOGIN_LIMITS
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (pg.user,)).fetchone()
    verb = "ALTER" if exists else "CREATE"
    conn.execute(
        sql.SQL("{} ROLE {} LOGIN {} PASSWORD {}").format(
            sql.SQL(verb), sql.Identifier(pg.user), sql.SQL(limits), sql.Literal(pg.password)
        )
    )
    if not pg.login_superuser:
        for granted in (
            "pg_read_server_files",
            "pg_write_server_files",
            "pg_execute_server_program",
        ):
            conn.execute(
                sql.SQL("REVOKE {} FROM {}").format(
                    sql.Identifier(granted), sql.Identifier(pg.user)
                )
            )


def _hand_over_objects(pg: LocalPostgres, database: str) -> None:
    """Give the login what the superuser owns in `database` outside the system schemas:
    schemas, tables and views (their indexes and column sequences follow), the other
    sequences, routines and types."""
    login = f'"{pg.user}"'
    with admin(pg, dbname=database) as conn:
        for (name,) in conn.execute(
            f"SELECT quote_ident(n.nspname) FROM pg_namespace n WHERE n.nspowner = 10 AND {_SYSTEM_SCHEMAS}"
        ).fetchall():
            conn.execute(f"ALTER SCHEMA {name} OWNER TO {login}")
        for kind, relkinds in (("TABLE", "'r', 'p', 'v', 'm', 'f'"), ("SEQUENCE", "'S'")):
            for (name,) in conn.execute(
                "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n"
                f" ON n.oid = c.relnamespace WHERE c.relowner = 10 AND c.relkind IN ({relkinds})"
                f" AND {_SYSTEM_SCHEMAS}"
            ).fetchall():
                conn.execute(f"ALTER {kind} {name} OWNER TO {login}")
        for (name,) in conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n"
            f" ON n.oid = p.pronamespace WHERE p.proowner = 10 AND {_SYSTEM_SCHEMAS}"
        ).fetchall():
            conn.execute(f"ALTER ROUTINE {name} OWNER TO {login}")
        for (name,) in conn.execute(
            "SELECT t.oid::regtype::text FROM pg_type t JOIN pg_namespace n"
            f" ON n.oid = t.typnamespace WHERE t.typowner = 10 AND t.typtype IN ('e', 'd', 'r')"
            f" AND {_SYSTEM_SCHEMAS}"
        ).fetchall():
            conn.execute(f"ALTER TYPE {name} OWNER TO {login}")
