"""A distributed flowtide stack for tests, all real processes on loopback: a PostgreSQL
database (the session's server), a nats-server, `flowtide server` and `flowtide worker`s.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from flowtide.dev.nats import SERVER_USER, NatsUser, worker_user_name


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.cache
def _python_user() -> dict[str, str]:
    """As root, workers run python steps as nobody (through the system's interpreter
    when this one is under /root); only where nobody can start none do they refuse to
    start unless told to run them as root, and the tests say so (`pyuser`)."""
    from pyuser import PYTHON_USER

    return {} if PYTHON_USER is None else {"FLOWTIDE_PYTHON_USER": PYTHON_USER}


def flowtide_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTIDE_")}
    env["FLOWTIDE_HOME"] = str(home)
    env["FLOWTIDE_NO_PROGRESS"] = "1"
    env.update(_python_user())
    return env


@dataclass
class Stack:
    db: str
    nats: str
    root: Path
    port: int = field(default_factory=_free_port)
    server: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[Any]] = field(default_factory=list)
    lease: float = 3.0
    kv: str = "memory://"
    master_key: str | None = None
    #: API tokens by role (created in the database before the server starts): admin,
    #: operator, reader, and worker (any pool; the workers' and the tests' own).
    tokens: dict[str, str] = field(default_factory=dict)
    #: NATS users by name (NatsServer.start_secured): the server and each worker get
    #: their own through the environment, as `flowtide dev up` hands them out.
    nats_users: dict[str, NatsUser] = field(default_factory=dict)
    #: The server's name (its log file) and where its databases are (default `--db db`).
    name: str = "server"
    db_args: tuple[str, ...] = ()
    #: Settings every process of the stack gets (FLOWTIDE_* variables).
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of the stack's processes and CLI runs (admin token)."""
        env = flowtide_env(self.root / "home")
        if self.master_key:
            env["FLOWTIDE_MASTER_KEY"] = self.master_key
        if "admin" in self.tokens:
            env["FLOWTIDE_TOKEN"] = self.tokens["admin"]
        env.update(self.extra_env)
        return env

    def headers(self, role: str = "admin") -> dict[str, str]:
        return {"authorization": f"Bearer {self.tokens[role]}"}

    def client(self, role: str = "admin", **kwargs: Any) -> httpx.Client:
        """An HTTP client of the API with the token of `role`."""
        kwargs.setdefault("timeout", 30)
        return httpx.Client(base_url=self.url, headers=self.headers(role), **kwargs)

    def worker_client(self, *worker_ids: str, pool: str = "default", **kwargs: Any) -> httpx.Client:
        """A client with the worker token, `worker_ids` registered under it (a test that
        claims and reports as these workers)."""
        with self.client("worker") as first:
            for worker_id in worker_ids:
                r = first.post(
                    "/api/worker/pool/register", json={"worker_id": worker_id, "pool": pool}
                )
                assert r.status_code == 200, r.text
        # Unopened: usable in a `with` as well as directly.
        return self.client("worker", **kwargs)

    def ensure_tokens(self) -> None:
        """Create the tokens (once per database: a restarted server keeps them)."""
        if self.tokens:
            return
        from flowtide.auth.tokens import TokenStore
        from flowtide.store.postgres import PostgresStore

        with PostgresStore(self.db, max_size=2) as store:
            tokens = TokenStore(store)
            for role in ("admin", "operator", "reader", "worker"):
                self.tokens[role], _ = tokens.create(role=role, name=f"test-{role}-{self.port}")

    def nats_env(self, user: str) -> dict[str, str]:
        """FLOWTIDE_NATS_USER/PASSWORD of NATS user `user` (nothing on an open server)."""
        found = self.nats_users.get(user)
        return found.auth().env() if found is not None else {}

    def _spawn(
        self, name: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        return subprocess.Popen(
            [sys.executable, "-m", "flowtide.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**self.env, **(env or {})},
            cwd=self.root,
        )

    def start_server(self) -> None:
        self.ensure_tokens()
        self.server = self._spawn(
            self.name,
            "server",
            *(self.db_args or ("--db", self.db)),
            "--nats",
            self.nats,
            "--port",
            str(self.port),
            "--lease",
            str(self.lease),
            "--kv",
            self.kv,
            env=self.nats_env(SERVER_USER),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"server exited: {self.log(self.name)}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready: {self.log(self.name)}")

    def kill_server(self) -> None:
        """SIGKILL the server process: no shutdown, no goodbye to anyone."""
        assert self.server is not None
        self.server.send_signal(signal.SIGKILL)
        self.server.wait()

    def start_worker(
        self,
        concurrency: int = 8,
        pool: str = "default",
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        server: str | None = None,
    ) -> subprocess.Popen[bytes]:
        n = len(self.workers)
        proc = self._spawn(
            f"worker{n}",
            "worker",
            "--server",
            server or self.url,
            "--nats",
            self.nats,
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--worker-id",
            f"w{n}",
            *args,
            env={
                "FLOWTIDE_TOKEN": self.tokens["worker"],
                **self.nats_env(worker_user_name(pool)),
                **(env or {}),
            },
        )
        self.workers.append(proc)
        return proc

    def wait_workers(self, count: int, pool: str = "default", timeout: float = 60) -> None:
        """Wait until `count` workers of `pool` are registered and alive."""
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while True:
                pools = client.get("/api/worker/pools").json()["pools"]
                live = [
                    w
                    for p in pools
                    if p["pool"] == pool
                    for w in p["workers"]
                    if w["status"] not in ("stopped", "lost")
                ]
                if len(live) >= count:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{len(live)} of {count} workers of {pool!r} live: {pools}"
                    )
                time.sleep(0.1)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def run(self, *args: Any, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flowtide.cli", *map(str, args), "--server", self.url],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.root,
            timeout=timeout,
        )

    def stop(self) -> None:
        procs = [p for p in [*self.workers, self.server] if p is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()


def sharded(
    cluster_db: str,
    shard_dbs: list[str],
    *,
    nats: str,
    root: Path,
    roles: tuple[str, ...] = ("admin", "operator", "reader", "worker"),
    **kwargs: Any,
) -> list[Stack]:
    """One Stack per shard of a cluster over `cluster_db` and `shard_dbs` (migrated here,
    tokens made in the cluster database and shared): stack i is shard i's server, to be
    started by the caller; the stacks' `db` is the cluster database."""
    env = flowtide_env(root / "home")
    if kwargs.get("master_key"):
        env["FLOWTIDE_MASTER_KEY"] = kwargs["master_key"]
    shard_list = ";".join(shard_dbs)
    proc = subprocess.run(
        [sys.executable, "-m", "flowtide.cli", "db", "upgrade"]
        + ["--shards", shard_list, "--cluster-db", cluster_db],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    from flowtide.auth.tokens import TokenStore
    from flowtide.store.postgres import PostgresStore

    tokens: dict[str, str] = {}
    with PostgresStore(shard_dbs[0], cluster_dsn=cluster_db, max_size=2) as store:
        for role in roles:
            tokens[role], _ = TokenStore(store).create(role=role, name=f"shards-{role}")
    return [
        Stack(
            db=cluster_db,
            nats=nats,
            root=root,
            tokens=tokens,
            name=f"server{i}",
            db_args=("--shards", shard_list, "--cluster-db", cluster_db, "--shard-index", str(i)),
            **kwargs,
        )
        for i in range(len(shard_dbs))
    ]
