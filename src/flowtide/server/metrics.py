"""The server's Prometheus metrics (`GET /metrics`).

Counters and the claim-latency histogram are updated by the coordinator once the
transaction that writes the events they count has committed. What lives in PostgreSQL
(executions by status, the outbox backlog) is read from it at scrape time by a collector
registered for that scrape only: no process keeps a copy that could go stale, and nothing
is summed across processes.

`flowtide server --workers N` runs N processes and a scrape reaches only one of them, so
the command points PROMETHEUS_MULTIPROC_DIR at a fresh directory before any of them
starts. prometheus-client then keeps each process's counters and histograms in files
there (the mode is chosen when prometheus_client is first imported, hence the variable
must be set before that), and the process that answers a scrape adds them all up. Process
metrics (memory, CPU, file descriptors) cannot be added up; in that mode they carry a
`pid` label, one series per live server process. Without the variable (an app created
in-process, or a plain single uvicorn process) the metrics are this process's own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from flowtide.errors import StoreError
from flowtide.store import pg

if TYPE_CHECKING:
    from flowtide.store.postgres import PostgresStore

__all__ = [
    "CLAIM_LATENCY",
    "COMMANDS_CLAIMED",
    "COMMANDS_COMPLETED",
    "COMMANDS_FAILED",
    "COMMANDS_ISSUED",
    "CONTENT_TYPE",
    "COMMANDS_REISSUED",
    "EXECUTIONS_REDRIVEN",
    "EXECUTIONS_STALLED",
    "MULTIPROC_ENV",
    "OPEN_REFRESH",
    "OpenExecutionsReader",
    "REPORTS_STALE",
    "exposition",
    "process_started",
    "process_stopped",
]

log = logging.getLogger("flowtide.server.metrics")

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
# Read once, as prometheus_client did when it was imported just above: the mode of the
# values and the way they are collected must agree.
_MULTIPROC_DIR: Final = os.environ.get(MULTIPROC_ENV) or None

#: Execution statuses always exported (0 when none), so alerts see a series.
_EXECUTION_STATUSES: Final = ("running", "completed", "failed", "cancelled")
#: From a local claim (about a millisecond) to a backlog of several seconds.
_CLAIM_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# registry=None: each scrape builds its own registry (see `exposition`).
COMMANDS_ISSUED: Final = Counter(
    "flowtide_commands_issued",
    "Commands issued to workers (re-issues after an expired lease included).",
    ["pool"],
    registry=None,
)
COMMANDS_CLAIMED: Final = Counter(
    "flowtide_commands_claimed", "Commands claimed by a worker.", ["pool"], registry=None
)
COMMANDS_COMPLETED: Final = Counter(
    "flowtide_commands_completed", "Commands reported completed.", ["pool"], registry=None
)
COMMANDS_FAILED: Final = Counter(
    "flowtide_commands_failed", "Commands reported failed.", ["pool"], registry=None
)
COMMANDS_REISSUED: Final = Counter(
    "flowtide_commands_reissued",
    "Commands issued again because their worker's lease expired.",
    ["pool"],
    registry=None,
)
REPORTS_STALE: Final = Counter(
    "flowtide_commands_stale",
    "Worker reports rejected because the worker no longer held the command.",
    ["pool"],
    registry=None,
)
CLAIM_LATENCY: Final = Histogram(
    "flowtide_command_claim_latency_seconds",
    "Time from a command's command.issued event to its successful claim.",
    ["pool"],
    buckets=_CLAIM_BUCKETS,
    registry=None,
)
FORWARDED: Final = Counter(
    "flowtide_forwarded_requests",
    "Requests this server sent on to the server of the shard that owns their execution"
    " (outcome: answered, or unavailable when no server of that shard answered).",
    ["shard", "outcome"],
    registry=None,
)
EXECUTIONS_REDRIVEN: Final = Counter(
    "flowtide_executions_redriven",
    "Running executions with nothing in flight for FLOWTIDE_STALLED_AFTER, stepped again.",
    registry=None,
)
EXECUTIONS_STALLED: Final = Counter(
    "flowtide_executions_stalled",
    "Executions failed as stalled: a re-drive left them with nothing in flight.",
    registry=None,
)
_LIVE: Final = (
    COMMANDS_ISSUED,
    COMMANDS_CLAIMED,
    COMMANDS_COMPLETED,
    COMMANDS_FAILED,
    COMMANDS_REISSUED,
    REPORTS_STALE,
    CLAIM_LATENCY,
    FORWARDED,
    EXECUTIONS_REDRIVEN,
    EXECUTIONS_STALLED,
)
_PLATFORM: Final = PlatformCollector(registry=None)

#: Seconds a read of the open executions serves scrapes (and `flowtide dev status`).
OPEN_REFRESH: Final = 3.0


class OpenExecutionsReader:
    """The oldest running execution of a shard and those idle past `stalled_after` (0:
    not counted), read from its database at most every `refresh` seconds whatever the
    number of scrapes; blocking (call it off the event loop)."""

    def __init__(
        self,
        store: PostgresStore,
        stalled_after: float,
        *,
        refresh: float = OPEN_REFRESH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.stalled_after = stalled_after
        self.refresh = refresh
        self.clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._last = pg.executions.OpenExecutions(None, 0)

    def read(self) -> pg.executions.OpenExecutions:
        with self._lock:
            now = self.clock()
            if self._read_at is None or now - self._read_at >= self.refresh:
                before = time.time() - self.stalled_after if self.stalled_after > 0 else None
                with self.store.transaction("metrics open executions") as conn:
                    self._last = pg.executions.open_executions(conn, before)
                self._read_at = now
            return self._last


def exposition(store: PostgresStore, open_executions: OpenExecutionsReader | None = None) -> bytes:
    """Every metric in the text format; blocking (it queries `store`, and reads the open
    executions through `open_executions`, one made here when None)."""
    registry = CollectorRegistry(auto_describe=False)
    if _MULTIPROC_DIR:
        MultiProcessCollector(registry, _MULTIPROC_DIR)  # type: ignore[no-untyped-call]
        registry.register(_ServerProcesses(Path(_MULTIPROC_DIR)))
    else:
        for metric in _LIVE:
            registry.register(metric)
        ProcessCollector(registry=registry)
    registry.register(_PLATFORM)
    registry.register(_DatabaseGauges(store, open_executions or OpenExecutionsReader(store, 0)))
    return generate_latest(registry)


def process_started() -> None:
    """Mark this process as a live server process (for its process metrics)."""
    if _MULTIPROC_DIR:
        _pid_file(Path(_MULTIPROC_DIR), os.getpid()).touch()


def process_stopped() -> None:
    """Stop reporting this process's process metrics; its counters still count."""
    if _MULTIPROC_DIR:
        _pid_file(Path(_MULTIPROC_DIR), os.getpid()).unlink(missing_ok=True)


def _pid_file(directory: Path, pid: int) -> Path:
    # Not *.db: MultiProcessCollector reads only those.
    return directory / f"server_{pid}.pid"


class _ServerProcesses(Collector):
    """process_* of every server process that marked itself live, labelled by pid."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for path in sorted(self.directory.glob("server_*.pid")):
            pid = path.stem.removeprefix("server_")
            # A process killed without a chance to unmark itself has no /proc entry:
            # the collector then yields nothing for it.
            for family in ProcessCollector(pid=partial(str, pid), registry=None).collect():
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    merged.add_sample(sample.name, {**sample.labels, "pid": pid}, sample.value)
        return list(families.values())


class _DatabaseGauges(Collector):
    """Gauges read from PostgreSQL at scrape time (a few index scans)."""

    def __init__(self, store: PostgresStore, open_executions: OpenExecutionsReader) -> None:
        self.store = store
        self.open_executions = open_executions

    def collect(self) -> Iterable[Metric]:
        from flowtide.server.outbox import OutboxStore

        try:
            with self.store.transaction("metrics executions") as conn:
                by_status = pg.executions.count_by_status(conn)
            outbox = OutboxStore(self.store).pending()
            found = self.open_executions.read()
        except StoreError as exc:
            # Counters are still worth a scrape; the database's own gauges go missing.
            log.warning("metrics: %s", exc)
            return []
        executions = GaugeMetricFamily(
            "flowtide_executions", "Executions by status.", labels=["status"]
        )
        counts = dict.fromkeys(_EXECUTION_STATUSES, 0) | by_status
        for status, count in sorted(counts.items()):
            executions.add_metric([status], count)
        pending = GaugeMetricFamily(
            "flowtide_outbox_pending",
            "Command notifications not yet published to NATS.",
            value=outbox["pending"],
        )
        age = GaugeMetricFamily(
            "flowtide_outbox_oldest_pending_age_seconds",
            "Age of the oldest unpublished command notification (0 when none).",
            value=outbox["oldest_age_seconds"],
        )
        oldest = GaugeMetricFamily(
            "flowtide_oldest_open_execution_age_seconds",
            "Age of the oldest execution still running on this server's shard (0 when none;"
            f" read at most every {OPEN_REFRESH:g} s).",
            value=max(0.0, round(time.time() - found.oldest_created, 3))
            if found.oldest_created is not None
            else 0.0,
        )
        idle = GaugeMetricFamily(
            "flowtide_executions_idle_past_stalled_after",
            "Running executions of this shard unchanged for FLOWTIDE_STALLED_AFTER with no"
            " command in flight: the stall watch re-drives or fails them at its next scan.",
            value=found.idle,
        )
        return [executions, pending, age, oldest, idle]
