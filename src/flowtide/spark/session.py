"""Which Spark to use, and the one SparkSession a process holds for its whole life.

The master comes from, in order: `flowtide run --spark-master` (`set_master`), the
`FLOWTIDE_SPARK_MASTER` environment variable, the playbook's `executor.spark.master`,
else `local[*]`. The operator's choice wins over the playbook's, so the same playbook
runs embedded, on Spark Connect (`sc://host:15002`) or on a cluster (`spark://`,
`k8s://`, `yarn`) without an edit.

Starting a session costs seconds (a JVM in classic mode, a gRPC session with Spark
Connect), so it is done once, lazily, by the first spark step, and reused by every later
step and execution in the process; it is stopped at exit. Each step *run* gets a child
session (`newSession()`: same SparkContext or server, its own temp views and SQL conf), so
parallel steps cannot see each other's input views and a step's `conf:` ends with it.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from flowtide.errors import ToolError

__all__ = [
    "DEFAULT_MASTER",
    "SessionHolder",
    "SparkSettings",
    "resolve_settings",
    "sessions",
    "set_master",
    "shown_master",
]

DEFAULT_MASTER = "local[*]"
ENV_MASTER = "FLOWTIDE_SPARK_MASTER"
ENV_JARS = "FLOWTIDE_SPARK_JARS"
# Debian's libpostgresql-jdbc-java; the project's setup scripts install it.
POSTGRES_JAR = Path("/usr/share/java/postgresql.jar")
_MASTER_PREFIXES = ("local", "sc://", "spark://", "k8s://", "yarn", "mesos://")
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}

_master_override: str | None = None


def set_master(master: str | None) -> None:
    """The master for this process, above the environment and the playbook (CLI flag)."""
    global _master_override
    _master_override = master or None


def _as_conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class SparkSettings:
    """What a spark step asks for: resolved from the CLI, environment and playbook."""

    master: str
    source: str  # where the master came from: --spark-master | env | playbook | default
    conf: tuple[tuple[str, str], ...] = ()
    jars: tuple[str, ...] = ()
    app_name: str = "flowtide"

    @property
    def connect(self) -> bool:
        return self.master.startswith("sc://")

    @property
    def local(self) -> bool:
        return self.master.startswith("local")


def _split_jars(text: str) -> list[str]:
    return [p.strip() for p in text.replace(os.pathsep, ",").split(",") if p.strip()]


def resolve_settings(executor: Mapping[str, Any] | None) -> SparkSettings:
    """The settings for a step of a playbook whose `executor:` block is `executor`.

    Raises:
        ToolError: kind "config_error" for a master of an unknown form or a malformed
            `executor.spark` block.
    """
    spec = (executor or {}).get("spark") or {}
    if not isinstance(spec, Mapping):
        raise ToolError("executor.spark must be a mapping", kind="config_error")
    from flowtide.settings import SparkSection, read

    tree = read(SparkSection)
    if _master_override:
        master, source = _master_override, "--spark-master"
    elif tree.master:
        master, source = tree.master, ENV_MASTER
    elif spec.get("master"):
        master, source = str(spec["master"]), "executor.spark.master"
    else:
        master, source = DEFAULT_MASTER, "default"
    master = master.strip()
    if not master.startswith(_MASTER_PREFIXES):
        raise ToolError(
            f"spark master {shown_master(master)!r} (from {source}) is not one of local[*], local[N], "
            "sc://host:port (Spark Connect), spark://host:port, k8s://..., yarn",
            kind="config_error",
        )
    conf = spec.get("conf") or {}
    if not isinstance(conf, Mapping):
        raise ToolError("executor.spark.conf must be a mapping", kind="config_error")
    jars: list[str] = []
    if tree.jars:
        jars.extend(_split_jars(tree.jars))
    elif POSTGRES_JAR.is_file():
        jars.append(str(POSTGRES_JAR))
    extra = spec.get("jars") or []
    jars.extend(_split_jars(extra) if isinstance(extra, str) else [str(j) for j in extra])
    return SparkSettings(
        master=master,
        source=source,
        conf=tuple((str(k), _as_conf_value(v)) for k, v in conf.items()),
        jars=tuple(dict.fromkeys(jars)),
        app_name=str(spec.get("app_name") or "flowtide"),
    )


#: A Spark Connect URL's parameters whose value is a credential (`sc://h:15002/;token=…`).
_MASTER_SECRET = re.compile(r"(;\s*(?:token|password|secret)\s*=)[^;]*", re.IGNORECASE)
_MASTER_USERINFO = re.compile(r"^([a-z0-9+.-]+://[^/@:;]*):[^/@]*@", re.IGNORECASE)


def shown_master(master: str) -> str:
    """`master` as logs, events and messages show it: the value of a Spark Connect
    `token` (or `password`, `secret`) parameter and a URL's password as `***` (the
    master may come from the worker's environment: its token is no value of an
    execution's secret set)."""
    return _MASTER_USERINFO.sub(r"\1:***@", _MASTER_SECRET.sub(r"\1***", master))


def _loopback_master(master: str) -> bool:
    if master.startswith("local"):
        return True
    host = urlparse(master).hostname
    return host in _LOOPBACK


def _quiet_python_loggers() -> None:
    # The Connect client logs every analysis error as a JSON line on stderr; flowtide
    # reports the same error in the call.error event, and stderr belongs to the progress
    # display.
    for name in ("SQLQueryContextLogger", "pyspark", "py4j"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


@dataclass
class SessionInfo:
    """Facts about the running session, recorded in every spark call event."""

    master: str
    mode: str  # classic | connect
    app_id: str | None
    version: str
    started: float
    start_seconds: float
    ui_url: str | None = None
    log_file: str | None = None
    ignored_conf: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "master": shown_master(self.master),
            "mode": self.mode,
            "app_id": self.app_id,
            "version": self.version,
        }
        if self.ui_url:
            out["ui_url"] = self.ui_url
        return out


class SessionHolder:
    """The process's SparkSession: created on first use, shared, stopped at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root: Any = None
        self._settings: SparkSettings | None = None
        self._children: dict[int, Any] = {}  # live Connect child sessions, by id()
        self._children_lock = threading.Lock()
        self.info: SessionInfo | None = None
        # How many times a session was started in this process (tests assert it is 1).
        self.starts = 0
        self._atexit = False

    @property
    def active(self) -> bool:
        return self._root is not None

    @property
    def connect(self) -> bool:
        return self._settings is not None and self._settings.connect

    def root(self, settings: SparkSettings, log_dir: Path | None = None) -> Any:
        """The shared session, started with `settings` if there is none yet.

        Raises:
            ToolError: kind "config_error" when the process already runs another master,
                kind "spark_error" when the session cannot start (no Java, bad master,
                server unreachable).
        """
        with self._lock:
            if self._root is not None and not self._alive():
                self._discard()
            if self._root is not None:
                assert self._settings is not None
                if settings.master != self._settings.master:
                    raise ToolError(
                        f"this process already runs its Spark session on "
                        f"{shown_master(self._settings.master)!r} (from {self._settings.source});"
                        f" a step asks for {shown_master(settings.master)!r} (from"
                        f" {settings.source}). One process holds "
                        "one session: run playbooks for another master in another process",
                        kind="config_error",
                    )
                return self._root
            self._root = self._start(settings, log_dir)
            self._settings = settings
            self.starts += 1
            if not self._atexit:
                atexit.register(self.stop)
                self._atexit = True
            return self._root

    def _alive(self) -> bool:
        if self._settings is not None and self._settings.connect:
            return True  # a lost server surfaces as an error on the next call
        from pyspark import SparkContext

        return SparkContext._active_spark_context is not None

    def _discard(self) -> None:
        self._root = None
        self._settings = None
        self.info = None

    def _start(self, settings: SparkSettings, log_dir: Path | None) -> Any:
        t0 = time.monotonic()
        try:
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise ToolError(
                f"spark steps need pyspark: install flowtide with the spark extra "
                f"(pip install 'flowtide[spark]'): {exc}",
                kind="config_error",
            ) from None
        _quiet_python_loggers()
        log_file: Path | None = None
        try:
            if settings.connect:
                session = SparkSession.builder.remote(settings.master).getOrCreate()
            else:
                if log_dir is not None:
                    log_dir.mkdir(parents=True, exist_ok=True)
                    log_file = log_dir / f"spark-{os.getpid()}.log"
                session = self._start_classic(settings, log_file)
        except ToolError:
            raise
        except Exception as exc:  # py4j, grpc, Java missing: all mean "no session"
            detail = f"{type(exc).__name__}: {str(exc)[:2000]}"
            if log_file is not None and log_file.is_file():
                tail = log_file.read_text(errors="replace").strip().splitlines()[-15:]
                detail += f"\n{log_file} ends with:\n" + "\n".join(tail)
            raise ToolError(
                f"cannot start a Spark session on {settings.master!r} (from {settings.source}): "
                f"{detail}",
                kind="spark_error",
                retryable=settings.connect,
            ) from None
        self.info = self._describe(session, settings, t0, log_file)
        return session

    def _start_classic(self, settings: SparkSettings, log_file: Path | None) -> Any:
        """Launch the driver JVM with its stdout/stderr in `log_file`: Spark's log and the
        JVM's own warnings would otherwise land on the terminal, under the progress
        display. Python calls the JVM through py4j as usual."""
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway
        from pyspark.sql import SparkSession

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if _loopback_master(settings.master):
            # Otherwise Spark resolves the host name and may pick a public interface.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        conf = SparkConf(loadDefaults=False)
        conf.setMaster(settings.master).setAppName(settings.app_name)
        for key, value in self._classic_conf(settings).items():
            conf.set(key, value)
        popen: dict[str, Any] = {}
        log = open(log_file, "ab") if log_file is not None else None  # noqa: SIM115
        try:
            if log is not None:
                popen = {"stdout": log, "stderr": log}
            gateway = launch_gateway(conf, popen_kwargs=popen)  # type: ignore[no-untyped-call]
        finally:
            if log is not None:
                log.close()  # the JVM has its own copy of the descriptor
        SparkContext(conf=conf, gateway=gateway)
        return SparkSession.builder.getOrCreate()

    @staticmethod
    def _classic_conf(settings: SparkSettings) -> dict[str, str]:
        conf: dict[str, str] = {
            # flowtide draws its own progress; Spark's console bar would garble it.
            "spark.ui.showConsoleProgress": "false",
        }
        if _loopback_master(settings.master):
            # Embedded and loopback clusters: never bind or advertise a public address.
            conf["spark.driver.host"] = "127.0.0.1"
            conf["spark.driver.bindAddress"] = "127.0.0.1"
        if settings.jars:
            conf["spark.jars"] = ",".join(settings.jars)
        if not settings.local:
            # Executors run python (UDFs, DataFrames from local data) with this interpreter.
            conf["spark.pyspark.python"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
        conf.update(dict(settings.conf))
        return conf

    @staticmethod
    def _describe(
        session: Any, settings: SparkSettings, t0: float, log_file: Path | None
    ) -> SessionInfo:
        app_id: str | None = None
        ui_url: str | None = None
        try:
            if settings.connect:
                app_id = session.conf.get("spark.app.id", None)
            else:
                sc = session.sparkContext
                app_id = sc.applicationId
                ui_url = sc.uiWebUrl
        except Exception:  # informational only
            pass
        return SessionInfo(
            master=settings.master,
            mode="connect" if settings.connect else "classic",
            app_id=app_id,
            version=str(session.version),
            started=time.time(),
            start_seconds=round(time.monotonic() - t0, 3),
            ui_url=ui_url,
            log_file=str(log_file) if log_file else None,
        )

    @contextmanager
    def step_session(
        self,
        settings: SparkSettings,
        *,
        step_conf: Mapping[str, Any] | None = None,
        log_dir: Path | None = None,
    ) -> Iterator[tuple[Any, list[str]]]:
        """A child session for one step run: its own temp views and SQL conf.

        Yields (session, warnings). Session-wide conf that differs from what the shared
        session was started with is applied to the child when Spark allows it at runtime,
        else reported in `warnings`; the step's own `conf:` must be runtime SQL conf.

        Raises:
            ToolError: as `root`, and kind "config_error" for a step `conf:` key Spark
                refuses to set at runtime.
        """
        root = self.root(settings, log_dir)
        child = root.newSession()
        key = id(child)
        if settings.connect:
            with self._children_lock:
                self._children[key] = child
        warnings: list[str] = []
        try:
            assert self._settings is not None
            started_with = dict(self._settings.conf)
            for k, v in settings.conf:
                if started_with.get(k) == v:
                    continue
                try:
                    child.conf.set(k, v)
                except Exception as exc:  # static conf: only a new process can change it
                    warnings.append(
                        f"executor.spark.conf {k}={v} ignored: the shared session was started "
                        f"without it and Spark cannot change it at runtime "
                        f"({type(exc).__name__})"
                    )
            for k, v in (step_conf or {}).items():
                try:
                    child.conf.set(str(k), _as_conf_value(v))
                except Exception as exc:
                    raise ToolError(
                        f"spark conf {k!r} cannot be set for one step (only runtime SQL conf "
                        f"such as spark.sql.shuffle.partitions can; put session-wide settings "
                        f"in executor.spark.conf): {str(exc).splitlines()[0][:300]}",
                        kind="config_error",
                    ) from None
            yield child, warnings
        finally:
            if settings.connect:
                # A Connect child that is never stopped hangs interpreter exit (the gRPC
                # channel close waits on it); classic children must NOT be stopped, as that
                # would stop the shared SparkContext.
                with self._children_lock:
                    self._children.pop(key, None)
                try:
                    child.stop()
                except Exception:
                    pass

    def stop(self) -> None:
        """Stop every child and the shared session (at exit; safe to call twice)."""
        with self._children_lock:
            children, self._children = list(self._children.values()), {}
        for child in children:
            try:
                child.stop()
            except Exception:
                pass
        with self._lock:
            root, self._root = self._root, None
            self._settings = None
        if root is not None:
            try:
                root.stop()
            except Exception:
                pass


sessions = SessionHolder()
"""The process-wide holder every spark step goes through."""
