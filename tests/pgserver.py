"""A throw-away PostgreSQL server for tests: a `LocalPostgres` cluster in a temp dir on a
free loopback port, fsync off, deleted on stop.

    server = PgServer.start()
    ...server.dsn / server.host / server.port / server.user / server.password...
    server.stop()
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from flowtide.dev.postgres import LocalPostgres, find_pg_bin, free_port
from flowtide.dev.postgres import PostgresSetupError as PgServerError

__all__ = ["PgServer", "PgServerError", "find_pg_bin"]

DATABASE = "flowtide"


class PgServer(LocalPostgres):
    """A running throw-away cluster; `stop()` shuts it down and deletes its files."""

    database: str = DATABASE

    @property
    def dsn(self) -> str:
        """A postgresql:// URL with password, TCP on loopback, to the default database."""
        return self.url(self.database)

    def credential(self) -> dict[str, object]:
        """The body of a credential alias pointing at this server."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "database": self.database,
        }

    @classmethod
    def start(cls, *, attempts: int = 3) -> PgServer:  # type: ignore[override]
        """Create a cluster in a fresh temp dir, start it on a free port and wait ready."""
        if find_pg_bin() is None:
            raise PgServerError("initdb/pg_ctl not found; run scripts/ensure-postgres.sh")
        # As root, a root-only TMPDIR could be untraversable for the server's account.
        base = "/tmp" if os.geteuid() == 0 and os.path.isdir("/tmp") else None
        root = Path(tempfile.mkdtemp(prefix="flowtide-pg-", dir=base))
        # Its login is a superuser (tests create roles and databases through it); the dev
        # stack's is not.
        server = cls(
            root=root, port=0, password="pw-" + secrets.token_hex(12), login_superuser=True
        )
        try:
            server.init()
            last_error: Exception | None = None
            for _ in range(attempts):
                server.port = free_port()
                try:
                    LocalPostgres.start(server, durable=False)
                    break
                except PgServerError as exc:  # the port may have been taken meanwhile
                    last_error = exc
            else:
                raise last_error or PgServerError("PostgreSQL did not start")
            server.secure()
            server.create_database(server.database)
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self) -> None:  # type: ignore[override]
        """Stop the server (fast shutdown) and remove its directory. Safe to call twice."""
        with contextlib.suppress(Exception):
            LocalPostgres.stop(self)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
