"""Real Spark servers for tests, started from the pip pyspark distribution on loopback only.

    with ConnectServer(tmp_path) as server:        # Spark Connect, local[*] inside
        SparkSession.builder.remote(server.url).getOrCreate()
    with StandaloneCluster(tmp_path) as cluster:   # one Master + one Worker
        SparkSession.builder.master(cluster.master_url)...

Both need `java` on PATH (scripts/ensure-spark.sh installs it). Every JVM is stopped by
`stop()`, by leaving the `with` block, or at interpreter exit as a last resort.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Self

import pyspark

__all__ = ["SPARK_HOME", "ConnectServer", "StandaloneCluster", "free_port"]

SPARK_HOME = Path(pyspark.__file__).resolve().parent
START_TIMEOUT = 180.0
_CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_CONNECT_STARTED = "Spark Connect server started"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    # The daemonised JVM is not our child: once dead it stays a zombie until init reaps it,
    # so look for a live thread rather than trusting kill(pid, 0).
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    except OSError:
        tasks = None
    if tasks is not None:
        for task in tasks:
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    if stat.read().rpartition(")")[2].split()[0] != "Z":
                        return True
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.exists():
        return f"(no log at {path})"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- last {len(text)} lines of {path} ---\n" + "\n".join(text)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _base_env(workdir: Path) -> dict[str, str]:
    conf_dir = workdir / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        # An inherited SPARK_HOME/SPARK_CONF_DIR would point the scripts at another install.
        SPARK_HOME=str(SPARK_HOME),
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_LOCAL_IP="127.0.0.1",
        # Scratch space under workdir, so even a SIGKILLed JVM leaves nothing in /tmp.
        SPARK_LOCAL_DIRS=str(workdir / "local"),
        PYSPARK_PYTHON=sys.executable,
    )
    env.pop("SPARK_ENV_LOADED", None)
    env.pop("SPARK_MASTER", None)  # spark-daemon.sh would rsync from it
    return env


class ConnectServer:
    """A Spark Connect server (local mode) run by sbin/start-connect-server.sh."""

    def __init__(
        self,
        workdir: Path,
        jars: Iterable[str] = (),
        conf: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.jars = list(jars)
        self.conf = dict(conf or {})
        self.port = 0
        self.ui_port = 0
        self.pid: int | None = None
        self._ident = f"flowtide-{os.getpid()}-{secrets.token_hex(4)}"
        self._env: dict[str, str] = {}
        self._log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    @property
    def log_path(self) -> Path | None:
        """The server's stdout/stderr log (spark-<ident>-<class>-1-<host>.out)."""
        if self._log_path is None:
            found = sorted(self.workdir.glob(f"spark-{self._ident}-{_CONNECT_CLASS}-1-*.out"))
            self._log_path = found[0] if found else None
        return self._log_path

    @property
    def _pid_file(self) -> Path:
        return self.workdir / f"spark-{self._ident}-{_CONNECT_CLASS}-1.pid"

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port, self.ui_port = free_port(), free_port()
        self._env = _base_env(self.workdir)
        self._env.update(
            SPARK_LOG_DIR=str(self.workdir),
            SPARK_PID_DIR=str(self.workdir),
            SPARK_IDENT_STRING=self._ident,
        )
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.port": str(self.ui_port),
            "spark.ui.enabled": "true",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            **self.conf,
        }
        args = [str(SPARK_HOME / "sbin" / "start-connect-server.sh")]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        if self.jars:
            args += ["--jars", ",".join(self.jars)]
        atexit.register(self.stop)
        # cwd=workdir: the server drops metastore_db/, derby.log and spark-warehouse/ there.
        result = subprocess.run(
            args,
            cwd=self.workdir,
            env=self._env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        try:
            if result.returncode != 0:
                raise RuntimeError(
                    f"start-connect-server.sh exited {result.returncode}: "
                    f"{result.stdout}{result.stderr}"
                )
            self._wait_started()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.pid is None and self._pid_file.exists():
                with contextlib.suppress(ValueError):
                    self.pid = int(self._pid_file.read_text().strip())
            log = self.log_path
            started = log is not None and _CONNECT_STARTED in log.read_text(errors="replace")
            if started and _port_open(self.port):
                # Spark moves the UI to the next port when ours was taken meanwhile.
                assert log is not None
                match = re.search(
                    r"service 'SparkUI' on port (\d+)", log.read_text(errors="replace")
                )
                if match:
                    self.ui_port = int(match.group(1))
                return
            if self.pid is not None and not _alive(self.pid):
                raise RuntimeError(f"Spark Connect server exited early\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Spark Connect server not up on port {self.port} after "
                    f"{START_TIMEOUT:.0f}s\n{_tail(log)}"
                )
            time.sleep(0.25)

    def running_jobs(self) -> list[dict[str, Any]]:
        """Jobs the server's Spark UI reports as RUNNING, across its applications."""
        jobs: list[dict[str, Any]] = []
        for app in _get_json(f"{self.ui_url}/api/v1/applications"):
            for job in _get_json(f"{self.ui_url}/api/v1/applications/{app['id']}/jobs"):
                if job.get("status") == "RUNNING":
                    jobs.append(job)
        return jobs

    def stop(self) -> None:
        """Stop the server and wait until its JVM is gone (SIGKILL after 20 s)."""
        atexit.unregister(self.stop)
        if not self._env:
            return
        # The stop script deletes the pid file, so read it first.
        if self.pid is None and self._pid_file.exists():
            with contextlib.suppress(ValueError):
                self.pid = int(self._pid_file.read_text().strip())
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(
                [str(SPARK_HOME / "sbin" / "stop-connect-server.sh")],
                cwd=self.workdir,
                env=self._env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=60,
            )
        if self.pid is not None:
            deadline = time.monotonic() + 20
            while _alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _alive(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while _alive(self.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
        self._env = {}
        self.pid = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class StandaloneCluster:
    """A standalone Spark cluster: one Master and one Worker, both bound to 127.0.0.1."""

    def __init__(self, workdir: Path, cores: int = 2, memory: str = "2g") -> None:
        self.workdir = Path(workdir)
        self.cores = cores
        self.memory = memory
        self.port = 0
        self.ui_port = 0
        self.worker_ui_port = 0
        self.master_log = self.workdir / "master.log"
        self.worker_log = self.workdir / "worker.log"
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    def _spawn(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own process group: stop() signals spark-class and its JVM together.
                start_new_session=True,
            )
        self._procs.append(proc)

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "work").mkdir(exist_ok=True)
        self.port, self.ui_port, self.worker_ui_port = free_port(), free_port(), free_port()
        env = _base_env(self.workdir)
        # The REST submission server would bind the fixed port 6066, and a taken port would
        # silently move the master to port+1, where the worker would never find it.
        master_opts = env.get("SPARK_MASTER_OPTS", "")
        env["SPARK_MASTER_OPTS"] = (
            f"{master_opts} -Dspark.master.rest.enabled=false -Dspark.port.maxRetries=0".strip()
        )
        atexit.register(self.stop)
        try:
            self._spawn(
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host", "127.0.0.1",
                    "--port", str(self.port),
                    "--webui-port", str(self.ui_port),
                ],
                self.master_log,
                env,
            )  # fmt: skip
            self._spawn(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    self.master_url,
                    "--host", "127.0.0.1",
                    "--webui-port", str(self.worker_ui_port),
                    "--cores", str(self.cores),
                    "--memory", self.memory,
                    "--work-dir", str(self.workdir / "work"),
                ],
                self.worker_log,
                env,
            )  # fmt: skip
            self._wait_started()
        except BaseException:
            self.stop()
            raise
        return self

    def _tails(self) -> str:
        return f"{_tail(self.master_log)}\n{_tail(self.worker_log)}"

    def _wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with contextlib.suppress(OSError, ValueError):
                state = self.state()
                alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) == 1:
                    return
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{proc.args[1]} exited early with {proc.returncode}\n{self._tails()}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"standalone cluster had no ALIVE worker after {START_TIMEOUT:.0f}s\n"
                    f"{self._tails()}"
                )
            time.sleep(0.5)

    def state(self) -> dict[str, Any]:
        """The master's /json/ status document."""
        result: dict[str, Any] = _get_json(f"{self.ui_url}/json/")
        return result

    def active_apps(self) -> list[dict[str, Any]]:
        return list(self.state().get("activeapps", []))

    def completed_apps(self) -> list[dict[str, Any]]:
        return list(self.state().get("completedapps", []))

    def stop(self) -> None:
        """SIGTERM the worker then the master (whole process groups); SIGKILL after 15 s."""
        atexit.unregister(self.stop)
        # Worker first, so it does not spend the grace period retrying a vanished master.
        procs = list(reversed(self._procs))
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            # Also reaps executors the worker spawned in its group but left behind.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._procs = []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
