"""A throw-away PostgreSQL server for tests: initdb + pg_ctl in a temp dir, loopback only.

    server = PgServer.start()
    ...server.dsn / server.host / server.port / server.user / server.password...
    server.stop()

Local (unix-socket) connections use trust auth; TCP connections need the password of user
`flowtide`. initdb refuses to run as root, so as root the cluster is created and run by an
unprivileged account (`postgres`, else `nobody`) through runuser/su.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PgServer", "PgServerError", "find_pg_bin"]

USER = "flowtide"
DATABASE = "flowtide"
_UNPRIVILEGED = ("postgres", "nobody")


class PgServerError(RuntimeError):
    """The test PostgreSQL server could not be created or started."""


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path)) or (0,)


def find_pg_bin() -> Path | None:
    """Directory holding initdb and pg_ctl: PATH first, then /usr/lib/postgresql/*/bin."""
    candidates: list[Path] = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).parent)
        # /usr/local/bin/initdb is often a symlink into the versioned directory.
        candidates.append(Path(found).resolve().parent)
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        candidates.append(Path(directory))
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as_user() -> str | None:
    """The account to run PostgreSQL as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in _UNPRIVILEGED:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise PgServerError("running as root and no unprivileged user (postgres/nobody) exists")


@dataclass
class PgServer:
    """A running throw-away cluster; `stop()` shuts it down and deletes its files."""

    root: Path
    bindir: Path
    port: int
    os_user: str | None
    host: str = "127.0.0.1"
    user: str = USER
    password: str = field(default_factory=lambda: "pw-" + secrets.token_hex(12))
    database: str = DATABASE
    _running: bool = False

    @property
    def datadir(self) -> Path:
        """The cluster's data directory."""
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        """Unix socket directory (inside the temp dir, never /var/run)."""
        return self.root / "sock"

    @property
    def dsn(self) -> str:
        """A postgresql:// URL with password, TCP on loopback."""
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"

    def credential(self) -> dict[str, object]:
        """The body of a credential alias pointing at this server."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "database": self.database,
        }

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def start(cls, *, attempts: int = 3) -> PgServer:
        """Create a cluster in a fresh temp dir, start it on a free port and wait ready."""
        bindir = find_pg_bin()
        if bindir is None:
            raise PgServerError("initdb/pg_ctl not found; run scripts/ensure-postgres.sh")
        os_user = _run_as_user()
        # As root, a root-only TMPDIR could be untraversable for the server's account.
        base = "/tmp" if os_user and os.path.isdir("/tmp") else None
        root = Path(tempfile.mkdtemp(prefix="flowtide-pg-", dir=base))
        server = cls(root=root, bindir=bindir, port=0, os_user=os_user)
        try:
            server._init_cluster()
            last_error: Exception | None = None
            for _ in range(attempts):
                server.port = _free_port()
                try:
                    server._start_server()
                    break
                except PgServerError as exc:  # the port may have been taken meanwhile
                    last_error = exc
            else:
                raise last_error or PgServerError("PostgreSQL did not start")
            server._create_database()
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory. Safe to call twice."""
        if self._running:
            self._running = False
            with contextlib.suppress(Exception):
                self._run(
                    [
                        str(self.bindir / "pg_ctl"),
                        "-D",
                        str(self.datadir),
                        "-m",
                        "fast",
                        "-w",
                        "-t",
                        "30",
                        "stop",
                    ],
                    timeout=60,
                )
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- steps -----------------------------------------------------------------------------

    def _command(self, argv: list[str]) -> list[str]:
        if self.os_user is None:
            return argv
        if shutil.which("runuser"):
            return ["runuser", "-u", self.os_user, "--", *argv]
        quoted = " ".join(_shell_quote(arg) for arg in argv)
        return ["su", "-s", "/bin/sh", self.os_user, "-c", quoted]

    def _run(self, argv: list[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        log = self.root / "commands.log"
        # Output goes to a file, not a pipe: pg_ctl's background postmaster would keep a
        # pipe open and make subprocess.run wait forever.
        with open(log, "a") as handle:
            handle.write(f"$ {' '.join(argv)}\n")
            handle.flush()
            proc = subprocess.run(
                self._command(argv),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                timeout=timeout,
                text=True,
                env={**os.environ, "LC_ALL": "C", "LANG": "C"},
                check=False,
            )
        if proc.returncode != 0:
            raise PgServerError(
                f"{Path(argv[0]).name} failed with exit code {proc.returncode}:\n" + _tail(log)
            )
        return proc

    def _chown(self, path: Path) -> None:
        if self.os_user is None:
            return
        entry = pwd.getpwnam(self.os_user)
        os.chown(path, entry.pw_uid, entry.pw_gid)

    def _init_cluster(self) -> None:
        self.socket_dir.mkdir()
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        (self.root / "commands.log").touch()
        for path in (self.root, self.socket_dir, pwfile, self.root / "commands.log"):
            self._chown(path)
        os.chmod(pwfile, 0o600)
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                self.user,
                "--pwfile",
                str(pwfile),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ]
        )
        pwfile.unlink()

    def _start_server(self) -> None:
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-p {self.port}",
                f"-k {self.socket_dir}",
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
            ]
        )
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.root / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ],
            timeout=90,
        )
        self._running = True
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            time.sleep(0.1)
        raise PgServerError(f"PostgreSQL is not accepting connections on port {self.port}")

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(self._admin_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')

    def create_database(self, name: str) -> str:
        """Create an empty database `name` (lowercase identifier) and return its DSN."""
        import psycopg

        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise PgServerError(f"not a plain database name: {name!r}")
        with psycopg.connect(self._admin_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{name}"

    def drop_database(self, name: str) -> None:
        """Drop database `name`, disconnecting whoever is still connected."""
        import psycopg

        with psycopg.connect(self._admin_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin_dsn(self, database: str) -> str:
        return (
            f"host={self.host} port={self.port} user={self.user} "
            f"password={self.password} dbname={database}"
        )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _shell_quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"
