"""A PostgreSQL cluster that flowtide runs itself: initdb into a directory, pg_ctl start and
stop, databases created on demand. `flowtide dev up` keeps one under `.flowtide/dev/pg`;
the test suite makes throw-away ones (tests/pgserver.py).

    cluster = LocalPostgres(Path(".flowtide/dev/pg"), port=55432, password="...")
    cluster.init()          # once; no-op when the data directory exists
    cluster.start()         # pg_ctl start -w; TCP on 127.0.0.1 only
    cluster.secure()        # the login role, with its password and limits
    cluster.ensure_database("flowtide")
    cluster.stop()          # fast shutdown; the data stays

The login (`user`, with `password`) is reached over TCP; unless `login_superuser` (the test
suite's throw-away clusters) it is no superuser, only the owner of the databases the
cluster makes (flowtide.dev.pgroles); the superuser `postgres` is reached over the Unix
socket only, as the server's OS account (peer), without a password. initdb refuses to run as root, so as root the cluster is created and run by an
unprivileged account (`postgres`, else `nobody`) through runuser/su: that account must be
able to reach the directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from flowtide.dev import pgroles
from flowtide.errors import FlowtideError

__all__ = ["LocalPostgres", "PostgresSetupError", "find_pg_bin", "free_port"]

DEFAULT_USER = "flowtide"
_UNPRIVILEGED = ("postgres", "nobody")
_INSTALL_HINT = (
    "PostgreSQL's server programs (initdb, pg_ctl) are not installed: "
    "`apt-get install postgresql` (Debian/Ubuntu) or `bash scripts/ensure-postgres.sh`"
)


class PostgresSetupError(FlowtideError, RuntimeError):
    """The cluster could not be created, started or stopped; the message says why."""


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path)) or (0,)


def find_pg_bin() -> Path | None:
    """Directory holding initdb and pg_ctl: PATH first, then /usr/lib/postgresql/*/bin
    (newest version first)."""
    candidates: list[Path] = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).parent)
        # /usr/local/bin/initdb is often a symlink into the versioned directory.
        candidates.append(Path(found).resolve().parent)
    for versioned in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        candidates.append(Path(versioned))
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _os_user() -> str | None:
    """The account PostgreSQL runs as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in _UNPRIVILEGED:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise PostgresSetupError("running as root and no unprivileged user (postgres/nobody) exists")


@dataclass
class LocalPostgres:
    """One cluster living in `root` (data/, sock/, server.log, commands.log)."""

    root: Path
    port: int
    password: str
    user: str = DEFAULT_USER
    host: str = "127.0.0.1"
    bindir: Path | None = None
    os_user: str | None = None
    #: (certificate, key, CA) in PEM: the server then takes TCP connections over TLS
    #: only (`hostssl` in pg_hba.conf) and its URLs verify it (sslmode=verify-full).
    tls: tuple[Path, Path, Path] | None = None
    #: The login is a superuser too (throw-away test clusters only).
    login_superuser: bool = False

    def __post_init__(self) -> None:
        self.root = Path(self.root).absolute()
        if self.bindir is None:
            self.bindir = find_pg_bin()
        if self.os_user is None:
            self.os_user = _os_user()

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        """Unix socket directory (inside root, never /var/run)."""
        return self.root / "sock"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str) -> str:
        """A postgresql:// URL with password, TCP on loopback (over verified TLS when the
        cluster has a certificate)."""
        url = f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{database}"
        if self.tls is not None:
            url += f"?sslmode=verify-full&sslrootcert={quote(str(self.tls[2]), safe='/')}"
        return url

    @property
    def initialized(self) -> bool:
        return (self.datadir / "PG_VERSION").is_file()

    # -- lifecycle -------------------------------------------------------------------------

    def init(self) -> bool:
        """Create the cluster unless it exists; True when it was created now."""
        if self.initialized:
            return False
        self._need_bin()
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        (self.root / "commands.log").touch()
        for path in (self.root, self.socket_dir, self.root / "commands.log"):
            self._chown(path)
        self._check_reachable()
        # The bootstrap superuser has no password: it logs in on the socket only (peer).
        self._run(
            [
                "initdb",
                "-D",
                str(self.datadir),
                "-U",
                pgroles.ADMIN_ROLE,
                "--auth-local=peer",
                "--auth-host=reject",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ]
        )
        pgroles.write_auth(self)
        return True

    def start(self, *, durable: bool = True, timeout: float = 60.0) -> None:
        """Start the server on 127.0.0.1:`port` and wait until it accepts connections.

        `durable=False` turns fsync off (test clusters: fast, lost on a machine crash).
        """
        self._need_bin()
        if self.is_running():
            return
        if not _port_free(self.port):
            raise PostgresSetupError(
                f"port {self.port} on 127.0.0.1 is in use; choose another one for PostgreSQL"
            )
        options = [
            "-c listen_addresses=127.0.0.1",
            f"-p {self.port}",
            f"-k {self.socket_dir}",
            "-c unix_socket_permissions=0700",
            "-c max_connections=200",
        ]
        if not durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._configure_tls()
        os.chmod(self.socket_dir, 0o700)  # older clusters made it world-readable
        pgroles.write_auth(self, legacy=pgroles.is_legacy(self))
        if self.tls is not None:
            # Relative to the data directory, where _configure_tls put them.
            options += ["-c ssl=on", "-c ssl_cert_file=server.crt", "-c ssl_key_file=server.key"]
        self._run(
            [
                "pg_ctl",
                "-D",
                str(self.datadir),
                "-l",
                str(self.log_path),
                "-o",
                " ".join(options),
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ],
            timeout=timeout + 30,
            log_tail=self.log_path,
        )
        self._wait_ready(timeout)

    def stop(self, *, timeout: float = 30.0, mode: str = "fast") -> None:
        """Shut down (sessions are disconnected, the data stays). No-op when stopped.

        `mode` is pg_ctl's: `fast` (the default) or `immediate` (no checkpoint: the next
        start recovers from the WAL, as after a crash).
        """
        if mode not in ("fast", "immediate"):
            raise PostgresSetupError(f"pg_ctl stop mode {mode!r}: fast or immediate")
        if self.bindir is None or not self.is_running():
            return
        self._run(
            [
                "pg_ctl",
                "-D",
                str(self.datadir),
                "-m",
                mode,
                "-w",
                "-t",
                str(int(timeout)),
                "stop",
            ],
            timeout=timeout + 30,
        )

    def is_running(self) -> bool:
        """Whether the postmaster of this data directory is alive."""
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def pid(self) -> int | None:
        """The postmaster's pid from postmaster.pid, if the file exists."""
        try:
            first = (self.datadir / "postmaster.pid").read_text().splitlines()[0]
            return int(first)
        except (OSError, IndexError, ValueError):
            return None

    # -- databases -------------------------------------------------------------------------

    def secure(self) -> str | None:
        """The login role with its password and limits (flowtide.dev.pgroles.secure); a
        line saying what changed when an older cluster's superuser login was demoted."""
        return pgroles.secure(self)

    def reload(self) -> None:
        """Have the running server read its configuration files again."""
        self._run(["pg_ctl", "-D", str(self.datadir), "reload"])

    def ensure_database(self, name: str) -> str:
        """Create database `name`, owned by the login, unless it exists; its DSN."""
        _check_db_name(name)
        with pgroles.admin(self) as conn:
            owner = conn.execute(
                "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if owner is None:
                conn.execute(f'CREATE DATABASE "{name}" OWNER "{self.user}" TEMPLATE template0')
            elif owner[0] != self.user:
                conn.execute(f'ALTER DATABASE "{name}" OWNER TO "{self.user}"')
        return self.url(name)

    def create_database(self, name: str) -> str:
        """Create an empty database `name` (lowercase identifier) owned by the login; its
        DSN."""
        _check_db_name(name)
        with pgroles.admin(self) as conn:
            conn.execute(f'CREATE DATABASE "{name}" OWNER "{self.user}" TEMPLATE template0')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database `name`, disconnecting whoever is still connected."""
        _check_db_name(name)
        with pgroles.admin(self) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _configure_tls(self) -> None:
        """Put the certificate and key in the data directory (the key readable by the
        server's account only, as PostgreSQL demands); pgroles.write_auth makes TCP take
        TLS only then (`hostssl`)."""
        if self.tls is None:
            return
        for name, source, mode in (
            ("server.crt", self.tls[0], 0o644),
            ("server.key", self.tls[1], 0o600),
        ):
            target = self.datadir / name
            target.unlink(missing_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as handle:
                handle.write(Path(source).read_bytes())
            self._chown(target)

    # -- steps -----------------------------------------------------------------------------

    def _need_bin(self) -> Path:
        if self.bindir is None:
            raise PostgresSetupError(_INSTALL_HINT)
        return self.bindir

    def _command(self, argv: list[str]) -> list[str]:
        """A PostgreSQL program's argv, run as the server's account."""
        return self._as_user([str(self._need_bin() / argv[0]), *argv[1:]])

    def _as_user(self, argv: list[str]) -> list[str]:
        if self.os_user is None:
            return argv
        if shutil.which("runuser"):
            return ["runuser", "-u", self.os_user, "--", *argv]
        quoted = " ".join(_shell_quote(arg) for arg in argv)
        return ["su", "-s", "/bin/sh", self.os_user, "-c", quoted]

    def _run(self, argv: list[str], *, timeout: float = 120, log_tail: Path | None = None) -> None:
        log = self.root / "commands.log"
        # Output goes to a file, not a pipe: pg_ctl's background postmaster would keep a
        # pipe open and make subprocess.run wait forever.
        with open(log, "a") as handle:
            handle.write(f"$ {' '.join(argv)}\n")
            handle.flush()
            try:
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
            except subprocess.TimeoutExpired:
                raise PostgresSetupError(
                    f"{argv[0]} did not finish in {timeout:.0f} s:\n{_tail(log)}"
                ) from None
        if proc.returncode != 0:
            detail = _tail(log)
            if log_tail is not None:
                detail += "\n" + _tail(log_tail, 15)
            raise PostgresSetupError(
                f"{argv[0]} failed with exit code {proc.returncode} (log {log}):\n{detail}"
            )

    def _chown(self, path: Path) -> None:
        if self.os_user is None:
            return
        entry = pwd.getpwnam(self.os_user)
        os.chown(path, entry.pw_uid, entry.pw_gid)

    def _check_reachable(self) -> None:
        """As root, the server's account must be able to enter every parent of root."""
        if self.os_user is None:
            return
        probe = self._as_user(["test", "-w", str(self.root)])
        if subprocess.run(probe, check=False, capture_output=True).returncode != 0:
            raise PostgresSetupError(
                f"PostgreSQL runs as {self.os_user!r} (initdb refuses root) and cannot write "
                f"{self.root}: let it traverse the parent directories (chmod o+x) or choose "
                "a directory it can reach"
            )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            time.sleep(0.1)
        raise PostgresSetupError(
            f"PostgreSQL is not accepting connections on port {self.port}:\n" + _tail(self.log_path)
        )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers do: a port whose last connections linger in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _check_db_name(name: str) -> None:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise PostgresSetupError(f"not a plain database name: {name!r}")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _shell_quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"
