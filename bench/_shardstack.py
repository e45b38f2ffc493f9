"""Helpers of bench/shards.py parts (b) and (c): a dev stack of N shards whose processes
are grouped (per shard: its server, its PostgreSQL; shared: the cluster database, NATS,
the workers), pinned to CPUs, and measured from /proc.

Everything here reads Linux's /proc directly:

- a process group is a set of root pids and all their descendants (PostgreSQL's
  postmaster and its backends; a worker and its python children), found from the ppid
  field of /proc/PID/stat at the moment of each sample;
- CPU seconds of a group are utime + stime + cutime + cstime of every live process of
  the tree (cutime/cstime hold the reaped children, which are no longer in the tree, so
  nothing counts twice);
- pinning sets the affinity of every task (thread) of every process of the group, since
  sched_setaffinity(pid) only moves the thread whose id is pid; what a pinned process
  starts later (a backend forked by the postmaster, a thread of the server) inherits it;
- per-CPU busy time comes from /proc/stat (so what other programs did shows too).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TICK = float(os.sysconf("SC_CLK_TCK"))

Log = Callable[[str], None]


# -- /proc -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    ppid: int
    #: utime + stime + cutime + cstime, in clock ticks.
    ticks: int
    #: utime + stime alone.
    own: int
    comm: str


def scan() -> dict[int, Proc]:
    """Every process now: its parent, CPU ticks (reaped children included) and name."""
    out: dict[int, Proc] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        head, tail = text.rsplit(")", 1)
        f = tail.split()
        # After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
        own = int(f[11]) + int(f[12])
        ticks = own + int(f[13]) + int(f[14])
        out[int(entry.name)] = Proc(int(f[1]), ticks, own, head.split("(", 1)[1])
    return out


def tree(roots: Iterable[int], procs: dict[int, Proc] | None = None) -> list[int]:
    """The roots that are alive and all their descendants."""
    procs = scan() if procs is None else procs
    children: dict[int, list[int]] = {}
    for pid, proc in procs.items():
        children.setdefault(proc.ppid, []).append(pid)
    out: list[int] = []
    todo = [r for r in roots if r in procs]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cpu_seconds(pids: Iterable[int], procs: dict[int, Proc]) -> float:
    """CPU seconds of these processes (their reaped children included: a reaped child is
    no longer in a tree, so nothing counts twice)."""
    return sum(procs[p].ticks for p in pids if p in procs) / TICK


def cpu_busy() -> dict[str, float]:
    """Busy seconds of each CPU ("cpu0", "cpu1", ...) and of all ("all"), from /proc/stat
    (everything but idle and iowait)."""
    out: dict[str, float] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if not line.startswith("cpu"):
            continue
        name, *values = line.split()
        v = [int(x) for x in values[:8]]  # user nice system idle iowait irq softirq steal
        out["all" if name == "cpu" else name] = (sum(v) - v[3] - v[4]) / TICK
    return out


def tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def pin(pids: Iterable[int], cpus: set[int]) -> int:
    """Set the affinity of every thread of these processes; the number of threads set."""
    done = 0
    for pid in pids:
        for tid in tasks(pid):
            try:
                os.sched_setaffinity(tid, cpus)
                done += 1
            except ProcessLookupError:
                continue  # gone meanwhile
    return done


def misplaced(pids: Iterable[int], cpus: set[int]) -> list[str]:
    """Threads of these processes whose affinity is not `cpus` ("pid/tid: {...}")."""
    out = []
    for pid in pids:
        for tid in tasks(pid):
            try:
                got = os.sched_getaffinity(tid)
            except ProcessLookupError:
                continue
            if got != cpus:
                out.append(f"{pid}/{tid}: {sorted(got)}")
    return out


# -- a stack and its groups ------------------------------------------------------------------


@dataclass
class Group:
    """Processes of the stack that count together: `roots` and their descendants."""

    name: str
    roots: list[int]
    cpus: set[int]
    #: Per shard (server, PostgreSQL) or shared by all shards.
    shard: int | None = None
    note: str = ""


@dataclass
class ShardStack:
    """A `flowtide.dev.stack.DevStack` of `shards` shards in `home`, its processes in
    groups, each group pinned to its CPUs (`pinned`: shard i's server and PostgreSQL on
    `pinned[i]`; with one shard, the cluster database is in shard 0's PostgreSQL and is
    pinned with it, as the dev stack lays one shard out), the rest on `shared`."""

    home: Path
    shards: int
    workers: int
    concurrency: int
    pinned: list[int]
    shared: set[int]
    log: Log
    stack: Any = None
    clients: list[httpx.Client] = field(default_factory=list)

    def up(self, timeout: float = 180.0) -> float:
        from flowtide.dev.postgres import free_port
        from flowtide.dev.stack import DevStack

        t0 = time.perf_counter()
        self.home.mkdir(parents=True, exist_ok=True)
        # As root, PostgreSQL runs as another account, which must traverse this directory.
        self.home.chmod(0o755)
        self.stack = DevStack(self.home)
        self.stack.up(
            shards=self.shards,
            workers=self.workers,
            concurrency=self.concurrency,
            server_port=free_port(),
            nats_port=free_port(),
            pg_port=free_port(),
            workdir=self.home,
            progress=lambda line: self.log(f"    {line}"),
            timeout=timeout,
        )
        # One keep-alive client per server, as the stack's admin (token, client certificate).
        self.clients = []
        for server in self.stack.servers():
            client = self.stack.admin_client(timeout=60.0)
            client.base_url = httpx.URL(server.url)
            self.clients.append(client)
        return time.perf_counter() - t0

    def down(self) -> None:
        for c in self.clients:
            c.close()
        self.clients = []
        if self.stack is not None:
            self.stack.down(purge=True)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.stack.servers()]

    def groups(self) -> list[Group]:
        pids = self.stack.config.pids
        out: list[Group] = []
        for server in self.stack.servers():
            cpu = self.pinned[server.shard]
            out.append(
                Group(f"shard {server.shard} server", [pids[server.name]], {cpu}, server.shard)
            )
        for part in self.stack.pg_parts():
            pid = part.pg.pid()
            roots = [pid] if pid else []
            if part.shard is None:
                out.append(
                    Group(
                        "cluster db postgres",
                        roots,
                        set(self.shared),
                        None,
                        "the cluster database's own PostgreSQL server",
                    )
                )
            else:
                note = "also holds the cluster database" if self.shards == 1 else ""
                out.append(
                    Group(
                        f"shard {part.shard} postgres",
                        roots,
                        {self.pinned[part.shard]},
                        part.shard,
                        note,
                    )
                )
        out.append(Group("nats", [pids["nats"]], set(self.shared)))
        workers = [pid for name, pid in pids.items() if name.startswith("worker-")]
        out.append(Group("workers", workers, set(self.shared), None, "python children included"))
        return out

    def pin(self) -> dict[str, int]:
        """Pin every group's processes (and threads) now; threads set per group."""
        procs = scan()
        return {g.name: pin(tree(g.roots, procs), g.cpus) for g in self.groups()}

    def check_pinning(self) -> list[str]:
        """What is not where it should be (new processes inherit; this says if not)."""
        procs = scan()
        problems = []
        for g in self.groups():
            bad = misplaced(tree(g.roots, procs), g.cpus)
            if bad:
                problems.append(f"{g.name}: {len(bad)} threads elsewhere ({', '.join(bad[:3])})")
        return problems

    def all_pids(self, procs: dict[int, Proc]) -> list[int]:
        return tree([r for g in self.groups() for r in g.roots], procs)

    def cpu(self, procs: dict[int, Proc]) -> dict[str, float]:
        """Cumulative CPU seconds of each group."""
        return {g.name: cpu_seconds(tree(g.roots, procs), procs) for g in self.groups()}

    def forwarded(self) -> dict[str, float]:
        """flowtide_forwarded_requests_total of each server, summed over shard and outcome."""
        out: dict[str, float] = {}
        for shard, client in enumerate(self.clients):
            total = 0.0
            try:
                text = client.get("/metrics").text
            except httpx.HTTPError:
                continue
            for line in text.splitlines():
                if line.startswith("flowtide_forwarded_requests_total"):
                    total += float(line.rsplit(" ", 1)[1])
            out[f"server {shard}"] = total
        return out


def sample(stacks: list[ShardStack]) -> dict[str, Any]:
    """One reading: each stack's groups' CPU seconds, this process's, every other
    process's (by name), the CPUs' busy time, the time."""
    procs = scan()
    own = os.times()
    ours = {os.getpid()}
    for s in stacks:
        ours.update(s.all_pids(procs))
    # Their own time only: an orphan reaped by init would put its whole life into init's
    # children's time at once.
    others: dict[str, float] = {}
    for pid, proc in procs.items():
        if pid not in ours:
            others[f"{pid} {proc.comm}"] = proc.own / TICK
    return {
        "t": time.monotonic(),
        "stacks": [s.cpu(procs) for s in stacks],
        "client": own.user + own.system,
        "others": others,
        "cpus": cpu_busy(),
    }


def delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What happened between two samples; `others`: CPU seconds of the other programs
    that ran throughout, by name, the busiest first (their own time: what their children
    did and programs that ended meanwhile are missing; /proc/stat's total has them)."""
    others: dict[str, float] = {}
    for key, v in b["others"].items():
        if key in a["others"] and v > a["others"][key]:
            name = key.split(" ", 1)[1]
            others[name] = others.get(name, 0.0) + v - a["others"][key]
    return {
        "wall": b["t"] - a["t"],
        "stacks": [
            {k: max(0.0, y[k] - x.get(k, 0.0)) for k in y}
            for x, y in zip(a["stacks"], b["stacks"], strict=True)
        ],
        "client": b["client"] - a["client"],
        "others": dict(sorted(others.items(), key=lambda kv: -kv[1])),
        "cpus": {k: b["cpus"][k] - a["cpus"][k] for k in b["cpus"]},
    }
