"""The fault matrix: what each fault of the distributed stack costs a running execution.

    .venv/bin/python bench/faults.py [--trials 20] [--faults kill-worker,kill-nats]
        [--shards 1] [--seed 1] [--json] [--quick]

A dev stack (`flowtide.dev.stack.DevStack`: PostgreSQL, nats-server, `flowtide server`,
--workers `flowtide worker`s, loopback only, TLS on) in a fresh temp home, free ports, a
command lease of --lease seconds; one stack for all the faults but `shard-pg-stop`, which
gets a stack of 2 shards of its own. Both are purged at the end.

Each trial runs one execution of a checkable workload: a start step, a parallel loop of
--k python iterations (each sleeps --pause s and returns its index; max_in_flight 16),
and a `total` step adding the loop's results up. Once a random number of iterations
(10-60 % of --k) have completed, the fault strikes (a trial whose loop had already
ended, the event stream being behind on a loaded machine, is run again, twice at most):

    kill-worker           kill -9 one worker (and its python steps), then start it again
    kill-server           kill -9 the flowtide server, then start it again
    kill-nats             kill -9 nats-server, then start it again (JetStream on disk)
    stop-nats             SIGSTOP nats-server for --nats-stop s (5), then SIGCONT
    pg-restart-fast       pg_ctl stop -m fast, then start (PostgreSQL restarted)
    pg-restart-immediate  pg_ctl stop -m immediate (a crash: WAL replay), then start
    shard-pg-stop         2 shards: the execution's shard's PostgreSQL stopped for
                          --shard-outage s (30), then started; meanwhile runs of a
                          10-iteration loop on the other shard, one after another,
                          each timed (`others`: they must all complete)
    stop-worker           SIGSTOP one worker for the lease + 3 s, then SIGCONT: its
                          commands are issued again elsewhere, its late reports refused
    duplicate-commands    every command published to NATS twice, the whole run (the
                          server restarted with FLOWTIDE_FAULT_DUPLICATE_COMMANDS=1)

and, on a stack of its own whose NATS is a cluster of three (bench/faults_nats.py):
kill-nats-leader, kill-nats-follower, stop-nats-leader, nats-rolling-restart.

Per trial: completed (the execution's status), exact (the loop's results are exactly
range(k), each once, and `total` says n = k and the right sum), duplicated (iterations
with more than one result in the loop's result or more than one `command.completed`
event), the time to recover (from the fault's end — the kill, or the end of the outage —
to the next completed iteration, or to the end of the run; events are polled every
0.1 s), the delay (the run's time, start to last event, less the median of 3 runs
without a fault on the same stack first), stuck (not finished --timeout s after the
fault; then cancelled), and to show the fault bit: the commands issued again and the
worker reports refused as stale meanwhile (the servers' /metrics), the commands the
victim worker held when struck, the stream's messages under duplicate-commands. Per
fault: those counted, and the time to recover and the delay, p50 and max.

Text goes to stdout, or to stderr with --json (one JSON document on stdout). The exit
status is 0 when every trial completed exactly, with no duplicate and none stuck; 1
otherwise; 2 when a stack could not be started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from faults_nats import CLUSTER_FAULTS
from faults_nats import choose as choose_node
from faults_nats import strike as strike_cluster

Log = Callable[[str], None]

FAULTS = (
    "kill-worker",
    "kill-server",
    "kill-nats",
    "stop-nats",
    "pg-restart-fast",
    "pg-restart-immediate",
    "shard-pg-stop",
    "stop-worker",
    "duplicate-commands",
    *CLUSTER_FAULTS,
)
#: The faults that need a stack of 2 shards.
SHARDED = {"shard-pg-stop"}
#: The faults that need NATS as a cluster of 3.
CLUSTERED = set(CLUSTER_FAULTS)
DUPLICATE_ENV = "FLOWTIDE_FAULT_DUPLICATE_COMMANDS"

#: What runs on the other shard while one is down (shard-pg-stop): ten python
#: iterations, so that reports and claims go through the workers as the fault's do.
OTHER_PLAYBOOK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: other_shard, path: bench/other_shard}
workflow:
  - step: work
    loop: {in: "{{ range(10) | list }}", iterator: item}
    tool: {kind: python, input: {i: "{{ item }}"}, code: "result = {'i': i}"}
"""

PLAYBOOK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: fault_matrix, path: bench/fault_matrix}}
workload: {{count: {k}, pause: {pause}}}
workflow:
  - step: start
    tool: {{kind: python, code: "result = {{'go': True}}"}}
    next: [{{step: work}}]
  - step: work
    loop:
      in: "{{{{ range(count) | list }}}}"
      iterator: item
      spec: {{mode: parallel, max_in_flight: 16}}
    tool:
      kind: python
      input: {{index: "{{{{ item }}}}", pause: "{{{{ pause }}}}"}}
      code: |
        import time
        time.sleep(pause)
        result = {{"index": index}}
    next: [{{step: total}}]
  - step: total
    tool:
      kind: python
      input: {{rows: "{{{{ work.results }}}}"}}
      code: "result = {{'n': len(rows), 'sum': sum(r['index'] for r in rows)}}"
"""


@dataclass
class Trial:
    fault: str
    trial: int
    execution_id: str = ""
    status: str = ""
    completed: bool = False
    exact: bool = False
    duplicated: int = 0
    #: Seconds from the fault's end to the next completed iteration (or the run's end).
    recover: float | None = None
    stuck: bool = False
    #: Seconds from the execution's start to its last event, and that less the same
    #: run's without a fault (what the fault cost it).
    run: float = 0.0
    delay: float | None = None
    #: Iterations completed when the fault struck, and for a worker's fault the commands
    #: that worker held then.
    struck_at: int | None = None
    held: int | None = None
    #: The loop had finished before the fault struck (a loaded machine's run outpaced
    #: the event stream): not a mid-run fault, so the trial is run again (twice at most).
    late: bool = False
    #: shard-pg-stop: the seconds of each run started on another shard during the outage
    #: (-1: it did not complete).
    others: list[float] = field(default_factory=list)
    seconds: float = 0.0
    #: Commands issued (`command.issued` events) and messages the command stream took
    #: meanwhile. Under duplicate-commands, each published command is there twice, so the
    #: count is even (checked: the fault was on); a command claimed in the reply to a
    #: report (flowtide.server.steps) is never published, so it is not 2 x issued.
    issued: int = 0
    published: int | None = None
    #: Commands issued again (a lease ran out) and worker reports refused as stale
    #: meanwhile, from the servers' /metrics (at least: a killed server's count restarts).
    reissued: int = 0
    stale: int = 0
    detail: str = ""

    @property
    def ok(self) -> bool:
        doubled = self.fault != "duplicate-commands" or (
            self.published is not None and self.published > 0 and self.published % 2 == 0
        )
        # A shard's outage stops its own runs only: the other shard's all complete.
        others = all(t >= 0 for t in self.others)
        return (
            self.completed
            and self.exact
            and not self.duplicated
            and not self.stuck
            and doubled
            and others
        )


# -- watching an execution ----------------------------------------------------------------


class Watch:
    """Follows an execution's events on its own thread (`GET .../events/stream`, in
    commit order, reconnecting after the last event seen when a server goes away): when
    each iteration completed. Paging the log by event id while it is written would miss
    events committed after newer ids (a worker's report) and, polled from two threads,
    count a page twice."""

    def __init__(self, clients: list[httpx.Client], eid: str) -> None:
        self.clients = clients
        self.eid = eid
        self.completions: dict[int, int] = {}
        self.times: list[float] = []
        self.events: list[dict[str, Any]] = []
        #: When the last new event was seen (the run's end, once it ended).
        self.last = time.monotonic()
        self._lock = threading.Lock()
        self._after: str | None = None
        self._ended = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._turn = 0

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.times)

    def _take(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            self.events.append(event)
            self._after = event["event_id"]
            self.last = now
            index = (event.get("payload") or {}).get("loop_index")
            if event.get("type") == "command.completed" and index is not None:
                self.completions[index] = self.completions.get(index, 0) + 1
                self.times.append(now)

    def _follow(self, client: httpx.Client) -> None:
        params = {"after": self._after} if self._after else {}
        timeout = httpx.Timeout(5.0, read=30.0)
        url = f"/api/executions/{self.eid}/events/stream"
        with client.stream("GET", url, params=params, timeout=timeout) as response:
            response.raise_for_status()
            kind, data = None, []
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    if kind == "end":
                        self._ended = True
                        return
                    self._take(json.loads("\n".join(data)))
                    kind, data = None, []

    def _run(self) -> None:
        while not self._stop.is_set() and not self._ended:
            client = self.clients[self._turn % len(self.clients)]
            try:
                self._follow(client)
            except (httpx.HTTPError, ValueError):
                self._turn += 1  # a server went away: another (or it, restarted) goes on
                self._stop.wait(0.2)

    def poll(self) -> bool:
        """Once the run ended: read its whole log (complete now) and count from it."""
        client = self.clients[self._turn % len(self.clients)]
        events: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 10_000}
        try:
            while True:
                response = client.get(f"/api/executions/{self.eid}/events", params=params)
                response.raise_for_status()
                page = response.json()
                events.extend(page)
                if len(page) < params["limit"]:
                    break
                params["after"] = page[-1]["event_id"]
        except (httpx.HTTPError, ValueError):
            return False
        completions: dict[int, int] = {}
        for event in events:
            index = (event.get("payload") or {}).get("loop_index")
            if event.get("type") == "command.completed" and index is not None:
                completions[index] = completions.get(index, 0) + 1
        with self._lock:
            self.events, self.completions = events, completions
        return True

    def held_by(self, worker_id: str) -> int:
        """Commands `worker_id` claimed and has not finished, as far as seen (a chunk of
        iterations is finished once each of them reported)."""
        with self._lock:
            events = list(self.events)
        size: dict[Any, int] = {}
        holder: dict[Any, str] = {}
        done: dict[Any, int] = {}
        for event in events:
            cid, kind = event.get("command_id"), event.get("type")
            if kind == "command.issued":
                size[cid] = int((event.get("payload") or {}).get("loop_count") or 1)
                done[cid] = 0  # issued again: what it has left
            elif kind == "command.claimed":
                holder[cid] = event.get("worker_id") or ""
            elif kind in ("command.completed", "command.failed"):
                done[cid] = done.get(cid, 0) + 1
        return sum(
            1
            for cid, who in holder.items()
            if who == worker_id and done.get(cid, 0) < size.get(cid, 1)
        )

    def wait_count(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count >= n:
                return True
            time.sleep(0.02)
        return False


def _ports(count: int) -> list[int]:
    """`count` free ports on 127.0.0.1, each with the next few free too (a sharded stack
    takes the ports after its first), below the kernel's ephemeral range: a part stopped
    for 30 s must find its port free again, and an outgoing connection may take a port of
    that range meanwhile (it happened)."""
    from flowtide.dev.processes import port_free

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    out: list[int] = []
    while len(out) < count:
        base = rng.randrange(10000, max(10001, low - 8))
        block = range(base, base + 4)
        if all(port_free(p) for p in block) and all(abs(base - o) >= 4 for o in out):
            out.append(base)
    return out


class DrillError(RuntimeError):
    """The drill itself could not go on (not a fault's finding)."""


# -- the stacks ---------------------------------------------------------------------------


class Drill:
    """One dev stack and the faults it can suffer."""

    def __init__(
        self, args: argparse.Namespace, shards: int, log: Log, nats_cluster: int = 1
    ) -> None:
        from flowtide.dev.stack import DevStack

        self.args = args
        self.shards = shards
        self.nats_cluster = nats_cluster
        self.log = log
        self.home = Path(tempfile.mkdtemp(prefix=f"flowtide-faults-{shards}-"))
        # As root, PostgreSQL runs as another account, which must traverse this directory.
        self.home.chmod(0o755)
        self.stack = DevStack(self.home)
        self.clients: list[httpx.Client] = []
        #: The run's seconds without a fault (the median of a few).
        self.baseline: float | None = None

    def up(self) -> float:
        t0 = time.monotonic()
        first = self.stack.config.pids == {} and not self.stack.has_data()
        ports: dict[str, Any] = {}
        if first:
            ports = dict(zip(("server_port", "nats_port", "pg_port"), _ports(3), strict=True))
        self.stack.up(
            shards=self.shards if first else None,
            nats_cluster=self.nats_cluster if first else None,
            workers=self.args.workers,
            concurrency=self.args.concurrency,
            lease=self.args.lease,
            workdir=self.home,
            timeout=90,
            **ports,
        )
        if not self.clients:
            for server in self.stack.servers():
                client = self.stack.admin_client(timeout=30.0)
                client.base_url = httpx.URL(server.url)
                self.clients.append(client)
        return time.monotonic() - t0

    def down(self) -> None:
        for client in self.clients:
            client.close()
        self.clients = []
        with contextlib.suppress(Exception):
            self.stack.down(purge=True)
            shutil.rmtree(self.home, ignore_errors=True)

    def restart_servers(self) -> None:
        """Stop the servers and start them again (with this process's environment now)."""
        for server in self.stack.servers():
            self.stack.procs.stop(server.name, force_after=8.0)
        self.up()

    def published(self) -> int:
        """Messages the command stream took so far (its last sequence number)."""
        import asyncio
        from dataclasses import replace

        from flowtide.dev.nats import SERVER_USER
        from flowtide.natsauth import connect_nats
        from flowtide.wire import COMMAND_STREAM

        auth = self.stack.nats_users()[SERVER_USER].auth()
        if self.stack.config.tls:
            auth = replace(auth, ca=str(self.stack.ca.ca))

        async def main() -> int:
            nc = await connect_nats(self.stack.nats_url, auth, name="fault-drill", wait=False)
            try:
                info = await nc.jetstream().stream_info(COMMAND_STREAM)
                return int(info.state.last_seq)
            finally:
                await nc.close()

        return asyncio.run(main())

    def counters(self) -> dict[str, float]:
        """The servers' reissued and stale command counters, summed."""
        out = {"reissued": 0.0, "stale": 0.0}
        for client in self.clients:
            try:
                text = client.get("/metrics", timeout=5).text
            except httpx.HTTPError:
                continue
            for line in text.splitlines():
                for key in out:
                    if line.startswith(f"flowtide_commands_{key}_total"):
                        out[key] += float(line.rsplit(" ", 1)[1])
        return out

    def execute(self, playbook: str) -> str:
        deadline = time.monotonic() + 60
        while True:
            client = self.clients[0]
            try:
                response = client.post("/api/execute", json={"playbook": playbook})
                response.raise_for_status()
                return str(response.json()["execution_id"])
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def other_shard_runs(self, shard: int, until: float) -> list[float]:
        """Runs of OTHER_PLAYBOOK on `shard`, one after another until `until` (one at
        least): each one's seconds from its start to its end, or -1 when it did not
        complete within 60 s. While another shard is down these should take what they
        take without a fault (they once took 10 s each: the down shard's reports held
        the servers' threads and the workers' one request)."""
        took: list[float] = []
        while not took or time.monotonic() < until:
            began = time.monotonic()
            eid = None
            for client in self.clients:
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    response = client.post(
                        "/api/execute", json={"playbook": OTHER_PLAYBOOK, "shard": shard}
                    )
                    if response.status_code == 201:
                        eid = str(response.json()["execution_id"])
                        break
            doc = None
            while eid is not None and time.monotonic() - began < 60:
                doc = self.status(eid)
                if doc is not None and doc.get("status") != "running":
                    break
                time.sleep(0.05)
            done = doc is not None and doc.get("status") == "completed"
            took.append(round(time.monotonic() - began, 2) if done else -1.0)

        return took

    def status(self, eid: str) -> dict[str, Any] | None:
        for client in self.clients:
            try:
                response = client.get(f"/api/executions/{eid}", timeout=5)
                if response.status_code == 200:
                    return dict(response.json())
            except httpx.HTTPError:
                continue
        return None

    def cancel(self, eid: str) -> None:
        for client in self.clients:
            with contextlib.suppress(httpx.HTTPError):
                response = client.post(
                    f"/api/executions/{eid}/cancel", json={"reason": "fault drill: stuck"}
                )
                if response.status_code < 300:
                    return

    # -- the faults ----------------------------------------------------------------------

    def strike(
        self,
        fault: str,
        eid: str,
        rng: random.Random,
        out: Trial,
        watch: Watch,
        node: tuple[str, str] = ("", ""),
    ) -> float:
        """Inflict `fault` and undo it; the monotonic time it ended. `node`: the NATS
        node a cluster's fault strikes (bench/faults_nats.py `choose`)."""
        stack = self.stack
        if fault in CLUSTERED:
            return strike_cluster(self, fault, node, out)
        if fault in ("kill-worker", "stop-worker"):
            name = f"worker-{rng.randrange(self.args.workers)}"
            out.held = watch.held_by(f"dev-{name}")
            if fault == "kill-worker":
                stack.signal(name, signal.SIGKILL)
                end = time.monotonic()
                self.up()
                return end
            stack.signal(name, signal.SIGSTOP)
            try:
                time.sleep(self.args.lease + 3)
            finally:
                stack.signal(name, signal.SIGCONT)
            return time.monotonic()
        if fault in ("kill-server", "kill-nats"):
            name = "nats" if fault == "kill-nats" else stack.servers()[0].name
            stack.signal(name, signal.SIGKILL)
            end = time.monotonic()
            self.up()
            return end
        if fault == "stop-nats":
            stack.signal("nats", signal.SIGSTOP)
            try:
                time.sleep(self.args.nats_stop)
            finally:
                stack.signal("nats", signal.SIGCONT)
            return time.monotonic()
        if fault in ("pg-restart-fast", "pg-restart-immediate"):
            end = time.monotonic()
            stack.stop_postgres("postgres", mode=fault.rsplit("-", 1)[1])
            self.up()
            return end
        if fault == "shard-pg-stop":
            from flowtide.sharding import shard_for

            shard = shard_for(int(eid), self.shards)
            stack.stop_postgres(f"postgres-{shard}", mode="fast")
            until = time.monotonic() + self.args.shard_outage
            out.others = self.other_shard_runs((shard + 1) % self.shards, until)
            time.sleep(max(0.0, until - time.monotonic()))
            self.up()
            return time.monotonic()
        raise ValueError(f"unknown fault {fault!r}")

    def trial(self, fault: str, number: int, rng: random.Random) -> Trial:
        args = self.args
        out = Trial(fault, number)
        t0 = time.monotonic()
        doubled = fault == "duplicate-commands"
        first_seq = self.published() if doubled else 0
        node = choose_node(self, fault, rng) if fault in CLUSTERED else ("", "")
        before = self.counters()
        out.execution_id = eid = self.execute(PLAYBOOK.format(k=args.k, pause=args.pause))
        watch = Watch(self.clients, eid).start()
        try:
            end = t0
            if fault not in ("duplicate-commands", "none"):
                target = rng.randint(max(1, args.k // 10), max(1, args.k * 6 // 10))
                if not watch.wait_count(target, args.timeout):
                    out.detail = f"{watch.count} of {target} iterations before the fault"
                out.struck_at = watch.count
                out.late = watch.count >= args.k
                end = self.strike(fault, eid, rng, out, watch, node)
            doc = None
            deadline = end + args.timeout
            while time.monotonic() < deadline:
                doc = self.status(eid)
                if doc is not None and doc.get("status") != "running":
                    break
                time.sleep(0.2)
            finished = time.monotonic()
            watch.stop()
            watch.poll()
            if doc is None or doc.get("status") == "running":
                out.stuck = True
                out.status = doc.get("status", "?") if doc else "unanswered"
                self.cancel(eid)
            else:
                out.status = str(doc["status"])
                out.completed = out.status == "completed"
            later = [t for t in watch.times if t >= end]
            out.run = round(watch.last - t0, 2)
            if self.baseline is not None:
                out.delay = round(out.run - self.baseline, 2)
            if fault not in ("duplicate-commands", "none"):
                out.recover = round((later[0] if later else finished) - end, 3)
            after = self.counters()
            out.reissued, out.stale = (
                int(after[k] - before[k] if after[k] >= before[k] else after[k])
                for k in ("reissued", "stale")
            )
            out.issued = sum(e.get("type") == "command.issued" for e in watch.events)
            if doubled:
                out.published = self.published() - first_seq
                if out.published <= 0 or out.published % 2:
                    out.detail += f"the stream took {out.published} messages: not doubled"
            self._check(out, doc, watch)
        finally:
            watch.stop()
        out.seconds = round(time.monotonic() - t0, 2)
        return out

    def _check(self, out: Trial, doc: dict[str, Any] | None, watch: Watch) -> None:
        k = self.args.k
        twice = {i for i, n in watch.completions.items() if n > 1}
        if not out.completed or doc is None:
            out.duplicated = len(twice)
            if doc is not None and not out.detail:
                out.detail = json.dumps(doc.get("error"))[:300]
            return
        steps = doc.get("steps", {})
        results = steps.get("work", {}).get("result", {}).get("results", [])
        indexes = [r.get("index") if isinstance(r, dict) else r for r in results]
        seen: dict[Any, int] = {}
        for i in indexes:
            seen[i] = seen.get(i, 0) + 1
        twice |= {i for i, n in seen.items() if n > 1}
        out.duplicated = len(twice)
        total = steps.get("total", {}).get("result", {})
        expected_total = {"n": k, "sum": k * (k - 1) // 2}
        out.exact = sorted(indexes) == list(range(k)) and total == expected_total
        if not out.exact:
            missing = sorted(set(range(k)) - set(seen))
            out.detail = (
                f"{len(indexes)} results, missing {missing[:10]}, twice {sorted(twice)[:10]},"
                f" total {total}"
            )


# -- the run ------------------------------------------------------------------------------


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def summarize(trials: list[Trial]) -> dict[str, Any]:
    recover = [t.recover for t in trials if t.recover is not None]
    delay = [t.delay for t in trials if t.delay is not None]
    others = [x for t in trials for x in t.others]
    return {
        "trials": len(trials),
        "ok": sum(t.ok for t in trials),
        "completed": sum(t.completed for t in trials),
        "exact": sum(t.exact for t in trials),
        "duplicated": sum(t.duplicated for t in trials),
        "stuck": sum(t.stuck for t in trials),
        "recover_p50": _p50(recover),
        "recover_max": round(max(recover), 2) if recover else None,
        "delay_p50": _p50(delay),
        "delay_max": round(max(delay), 2) if delay else None,
        "reissued": sum(t.reissued for t in trials),
        "stale": sum(t.stale for t in trials),
        "trial_p50": _p50([t.seconds for t in trials]),
        # shard-pg-stop: the other shard's runs during the outages (-1: not completed).
        "others_p50": _p50(others) if others else None,
        "others_max": max(others) if others else None,
    }


def table(report: dict[str, Any]) -> str:
    head = (
        f"{'fault':<22} {'trials':>6} {'completed':>9} {'exact':>5} {'dup':>4} {'stuck':>5}"
        f" {'recover p50':>11} {'max':>6} {'delay p50':>9} {'max':>6} {'reissued':>8}"
        f" {'stale':>5} {'trial p50':>9}"
    )
    lines = [head, "-" * len(head)]

    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for fault, entry in report["faults"].items():
        s = entry["summary"]
        lines.append(
            f"{fault:<22} {s['trials']:>6} {s['completed']:>9} {s['exact']:>5}"
            f" {s['duplicated']:>4} {s['stuck']:>5} {sec(s['recover_p50']):>11}"
            f" {sec(s['recover_max']):>6} {sec(s['delay_p50']):>9} {sec(s['delay_max']):>6}"
            f" {s.get('reissued', '-'):>8} {s.get('stale', '-'):>5} {sec(s['trial_p50']):>9}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, faults: list[str], log: Log) -> dict[str, Any]:
    from flowtide.dev.stack import DevStackError

    rng = random.Random(args.seed)
    report: dict[str, Any] = {"faults": {}}
    groups = [
        (args.shards, 1, [f for f in faults if f not in SHARDED | CLUSTERED]),
        (max(2, args.shards), 1, [f for f in faults if f in SHARDED]),
        (args.shards, 3, [f for f in faults if f in CLUSTERED]),
    ]
    for shards, nats_nodes, todo in groups:
        if not todo:
            continue
        drill = Drill(args, shards, log, nats_cluster=nats_nodes)
        try:
            took = drill.up()
            log(
                f"stack of {shards} shard(s), {nats_nodes} nats-server(s) up in {took:.1f} s"
                f" ({drill.home})"
            )
            runs = []
            for n in range(1, 4):
                t = drill.trial("none", n, rng)
                if not t.ok:
                    raise DrillError(f"a run without a fault failed: {t}")
                runs.append(t.run)
            drill.baseline = statistics.median(runs)
            log(f"  without a fault: {', '.join(f'{r:.2f}' for r in runs)} s")
            for fault in todo:
                trials: list[Trial] = []
                if fault == "duplicate-commands":
                    os.environ[DUPLICATE_ENV] = "1"
                    drill.restart_servers()
                try:
                    for n in range(1, args.trials + 1):
                        for attempt in range(3):
                            try:
                                t = drill.trial(fault, n, rng)
                            except DevStackError as exc:
                                # The drill could not restore the stack: a failed trial.
                                t = Trial(fault, n, stuck=True, detail=f"drill: {exc}"[:500])
                                drill.up()
                            if not t.late or attempt == 2:
                                break
                            log(f"  {fault} {n}: the loop ended before the fault, again")
                        trials.append(t)
                        recover = "-" if t.recover is None else f"{t.recover:.2f} s"
                        delay = "-" if t.delay is None else f"{t.delay:+.2f} s"
                        log(
                            f"  {fault} {n}/{args.trials}: {t.status or '?'}"
                            f"{' exact' if t.exact else ' NOT EXACT'}, {t.duplicated} dup,"
                            f" recover {recover}, delay {delay}, reissued {t.reissued},"
                            f" stale {t.stale}, struck at {t.struck_at}, held {t.held},"
                            f" {t.seconds:.1f} s"
                            + (" STUCK" if t.stuck else "")
                            + (f" ({t.detail})" if t.detail else "")
                        )
                        if fault == "duplicate-commands":
                            log(f"    {t.published} messages for {t.issued} commands")
                        if t.others:
                            done = sorted(x for x in t.others if x >= 0)
                            missed = len(t.others) - len(done)
                            log(
                                f"    the other shard's runs meanwhile: {len(t.others)},"
                                f" p50 {_p50(done)} s, max {max(done, default=None)} s"
                                + (f", {missed} NOT COMPLETED" if missed else "")
                            )
                        if t.stuck:
                            drill.up()  # whatever the fault left down
                finally:
                    if fault == "duplicate-commands":
                        os.environ.pop(DUPLICATE_ENV, None)
                        drill.restart_servers()
                report["faults"][fault] = {
                    "shards": shards,
                    "nats_nodes": nats_nodes,
                    "summary": summarize(trials),
                    "trials": [asdict(t) for t in trials],
                }
        finally:
            drill.down()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trials", type=int, default=20, help="trials per fault (default 20)")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated (default: all)")
    parser.add_argument(
        "--shards", type=int, default=1, help="shards of the stack (default 1; 2 for shard-pg-stop)"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--k", type=int, default=120, help="loop iterations (default 120)")
    parser.add_argument("--pause", type=float, default=0.25, help="seconds per iteration")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=8, help="commands per worker")
    parser.add_argument("--lease", type=float, default=5.0, help="command lease, s (default 5)")
    parser.add_argument("--timeout", type=float, default=120.0, help="stuck after, s")
    parser.add_argument("--nats-stop", type=float, default=5.0, help="SIGSTOP of nats, s")
    parser.add_argument("--shard-outage", type=float, default=30.0, help="shard PostgreSQL down, s")
    parser.add_argument(
        "--nats-cluster-stop",
        type=float,
        default=12.0,
        help="SIGSTOP of a cluster's stream leader, s (default 12: past its election timeout)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI sizes: --k 40 --pause 0.3 --shard-outage 5 --nats-stop 3 --timeout 90",
    )
    args = parser.parse_args()
    if args.quick:
        args.k, args.pause, args.shard_outage, args.nats_stop = 40, 0.3, 5.0, 3.0
        args.timeout = 90.0
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; the faults: {', '.join(FAULTS)}")
    out = sys.stderr if args.json else sys.stdout

    def log(line: str) -> None:
        print(line, file=out, flush=True)

    log(
        f"fault matrix: {len(faults)} fault(s) x {args.trials} trial(s), k={args.k},"
        f" pause={args.pause} s, lease={args.lease} s, seed={args.seed},"
        f" load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs"
    )
    from flowtide.dev.stack import DevStackError

    t0 = time.monotonic()
    try:
        report = run(args, faults, log)
    except (DevStackError, DrillError) as exc:
        log(f"error: {exc}")
        return 2
    report["config"] = {
        k: getattr(args, k)
        for k in (
            "trials",
            "k",
            "pause",
            "workers",
            "concurrency",
            "lease",
            "timeout",
            "nats_stop",
            "shard_outage",
            "nats_cluster_stop",
            "seed",
            "shards",
        )
    }
    report["machine"] = {
        "cpus": os.cpu_count(),
        "load": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    report["seconds"] = round(time.monotonic() - t0, 1)
    trials = [t for entry in report["faults"].values() for t in entry["trials"]]
    report["ok"] = all(Trial(**t).ok for t in trials)
    log("")
    log(table(report))
    log(f"\n{report['seconds']:.0f} s; {'all exact' if report['ok'] else 'FAILURES'}")
    if args.json:
        print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
