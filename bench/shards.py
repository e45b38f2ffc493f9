"""Sharding (issue 17): (a) how evenly `shard_for` spreads ids, (b) how throughput grows
from one shard to two, (c) what forwarding a request to another shard's server costs.

    .venv/bin/python bench/shards.py [--part a] [--ids 1000000] [--machines 8] [--bursts 1,40]
    .venv/bin/python bench/shards.py --part b,c [--rounds 4] [--executions 8]
        [--iterations 500] [--max-in-flight 64] [--workers 2] [--concurrency 128]
        [--requests 3000] [--quick] [--json]
    .venv/bin/python bench/shards.py --part all

--part a (the default), b, c, a comma list (b,c) or all.

(a) Id uniformity, no stack. Ids are real snowflakes of `flowtide.ids.Snowflake`:
--machines generators (one per server process) on a simulated clock that advances one
millisecond after each burst of ids per generator, so the ids have what production ids
have: the same millisecond on every machine, sequences restarting at 0 each millisecond.
Two loads by default: a quiet system (1 id per millisecond per process: every sequence is
0) and a busy one (40). Each id is placed with `shard_for(id, N)` for N = 2, 4, 16, and the
load of a shard is the number of ids it got. Reported: max/min shard load (goal <= 1.02)
and, as the reason the seed hashes, the same for the raw id modulo N, whose low bits (the
sequence, then the machine id) pile the ids onto a few shards.

(b) Scale-out on two cores. Two dev stacks (`flowtide.dev.stack.DevStack`, TLS on, in
fresh homes under /tmp, free ports, purged at the end) are up side by side: N=1 and N=2
shards. Placement, set with sched_setaffinity on every thread of every process (the
PostgreSQL postmaster and all its children, the flowtide server) and checked after each
run (what they start later inherits it):
  N=1: shard 0's server and its PostgreSQL on cpu0. With one shard the dev stack keeps
       the cluster database in that same PostgreSQL, so it is pinned with it.
  N=2: shard 0's server and PostgreSQL on cpu0, shard 1's on cpu1.
  Both: the workers (and their python children), nats-server, the N=2 cluster
       database's PostgreSQL and this client are not pinned (both cores): the machine has
       no third core to give them, and pinning them to one core would hand that core's
       shard their whole load. They are the shared part of a cluster, which on real
       hardware runs on machines of its own; here they take whatever the shards leave.
The workload of a run: --executions executions of bench/loop.py's playbook (start, a
parallel loop of --iterations trivial python iterations with --max-in-flight, end),
submitted round robin to the shards' servers (a server gives a new execution an id of
its own shard, so they split evenly; checked with `shard_for`), then waited for (status
polled on the owner every 0.1 s). Throughput is executions x iterations over the wall
time from just before the first submit to the last terminal update (server clock, same
machine). Every execution is checked: completed, exactly --iterations results in order.
After a warm-up run on each stack (not counted) the runs alternate, N=1 and N=2, the
order swapped every round (1 2, 2 1, 1 2, ...) so a drift of the machine's speed favours
neither; --rounds runs of each. Around each run: CPU seconds of every process group from
/proc (per shard: its server, its PostgreSQL; shared: cluster database, nats, workers;
this client; the stack that is idle meanwhile; the rest of the machine from /proc/stat),
each CPU's busy time, the forwarded requests (servers' /metrics) and the load average.
Reported: median it/s of each N, their ratio (goal >= 1.8), CPU per iteration and cores
per group, the ceiling these cores allow at that CPU per iteration (N=1: its shard's
core or both cores for the whole stack, whichever is less; N=2 likewise), and a
projection: the ratio if only the shards' own cores limited them (iterations per CPU
second of the busiest shard's server + PostgreSQL).

(c) Forwarding overhead, on the N=2 stack with (b)'s placement: one completed execution
per shard, then GET /api/executions/{id}/status --requests times sent to the owner's
server and --requests times to the other shard's server (which forwards it), both ids
both ways, interleaved request by request, on httpx keep-alive clients (one per server,
mutual TLS, the stack's admin token), after 50 warm-up requests per path. Reported:
p50/p90/p99/max of each, and the p50 and p99 differences.

Text goes to stdout, or to stderr with --json, which prints one JSON document on stdout:
for --part a alone part a's list (as before), otherwise an object with "machine" and a
key per part ("a", "b", "c"). Exit status: 0 when the benchmark ran (the goals of b and
c are reported, not enforced), 1 when part (a)'s goal was not met or a check failed, 2
when a dev stack could not start or this machine cannot run part (b)/(c) (Linux with 2
usable CPUs, PostgreSQL's initdb, nats-server). Defaults take 3.5 minutes for b,c on a
quiet 2-core machine (8 under a load average of 9); --quick is a smoke run (under a
minute). The workers run python steps as they do by default (child processes);
FLOWTIDE_PYTHON_ISOLATION=thread in this program's environment reaches them (the dev
stack passes its environment on) and makes them lighter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flowtide.ids import Snowflake  # noqa: E402
from flowtide.sharding import shard_for  # noqa: E402

GOAL = 1.02
GOAL_SCALE = 1.8
TERMINAL = ("completed", "failed", "cancelled")

Log = Callable[[str], None]


# -- part (a): id uniformity ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_795_600_000.0

    def __call__(self) -> float:
        return self.now


def generate(count: int, machines: int, burst: int) -> list[int]:
    clock = Clock()
    gens = [Snowflake(f"bench-{m}", clock=clock) for m in range(machines)]
    for m, gen in enumerate(gens):
        gen.lease(m * 97 % 1024, valid_for=1e9)  # distinct machine ids, as leased
    ids: list[int] = []
    while len(ids) < count:
        for gen in gens:
            ids.extend(gen.next_id() for _ in range(burst))
        clock.now += 0.001
    return ids[:count]


def spread(loads: Counter[int], n: int) -> float:
    values = [loads.get(i, 0) for i in range(n)]
    return max(values) / min(values) if min(values) else float("inf")


def run_a(args: argparse.Namespace, log: Log) -> tuple[list[dict[str, Any]], bool]:
    results = []
    for burst in (int(b) for b in args.bursts.split(",")):
        started = time.perf_counter()
        ids = generate(args.ids, args.machines, burst)
        generated = time.perf_counter() - started
        rows = []
        for n in (2, 4, 16):
            t0 = time.perf_counter()
            hashed = Counter(shard_for(i, n) for i in ids)
            seconds = time.perf_counter() - t0
            modulo = Counter(i % n for i in ids)
            rows.append(
                {
                    "shards": n,
                    "hashed_max_over_min": round(spread(hashed, n), 4),
                    "modulo_max_over_min": spread(modulo, n),
                    "shard_for_ns_per_id": round(seconds / len(ids) * 1e9),
                    "met": spread(hashed, n) <= GOAL,
                }
            )
        results.append({"ids": len(ids), "machines": args.machines, "burst": burst, "rows": rows})
        log(
            f"{len(ids):,} snowflakes from {args.machines} generators, {burst} per"
            f" millisecond each (generated in {generated:.1f} s)"
        )
        log(f"{'N':>4}  {'shard_for max/min':>18}  {'id % N max/min':>15}  {'ns/id':>6}")
        for r in rows:
            raw = r["modulo_max_over_min"]
            shown = "inf" if raw == float("inf") else f"{raw:.4f}"
            log(
                f"{r['shards']:>4}  {r['hashed_max_over_min']:>18.4f}  {shown:>15}"
                f"  {r['shard_for_ns_per_id']:>6}"
                f"  goal <= {GOAL}: {'met' if r['met'] else 'NOT met'}"
            )
    for result in results:
        for r in result["rows"]:
            if r["modulo_max_over_min"] == float("inf"):
                r["modulo_max_over_min"] = None  # a shard got nothing
    ok = all(r["met"] for result in results for r in result["rows"])
    return results, ok


# -- parts (b) and (c): the stacks ------------------------------------------------------------


class Unfit(Exception):
    """This machine cannot run parts (b)/(c); the message says why."""


def two_cpus() -> tuple[int, int]:
    """The two CPUs the shards are pinned to: the first two this process may use."""
    if not Path("/proc/stat").is_file() or not hasattr(os, "sched_setaffinity"):
        raise Unfit("parts b and c read /proc and pin processes: they run on Linux only")
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        raise Unfit(f"parts b and c need 2 CPUs; this process may use {usable} only")
    return usable[0], usable[1]


class Cluster:
    """The N=1 and N=2 stacks of parts (b) and (c), up side by side."""

    def __init__(self, args: argparse.Namespace, log: Log, counts: list[int]) -> None:
        from _shardstack import ShardStack

        self.log = log
        cpu0, cpu1 = two_cpus()
        self.cpus = (cpu0, cpu1)
        self.root = Path(tempfile.mkdtemp(prefix="flowtide-bench-shards-", dir="/tmp"))
        # As root, PostgreSQL runs as another account, which must traverse this directory.
        self.root.chmod(0o755)
        self.stacks: dict[int, ShardStack] = {}
        for n in counts:
            self.stacks[n] = ShardStack(
                home=self.root / f"n{n}",
                shards=n,
                workers=args.workers,
                concurrency=args.concurrency,
                pinned=[cpu0, cpu1][:n],
                shared={cpu0, cpu1},
                log=log,
            )

    def up(self) -> None:
        for n, stack in self.stacks.items():
            self.log(f"  N={n} stack: up")
            took = stack.up()
            threads = stack.pin()
            self.log(
                f"  N={n} stack: up in {took:.1f} s, servers {', '.join(stack.urls)}; threads"
                f" pinned: {', '.join(f'{k} {v}' for k, v in threads.items())}"
            )

    def down(self) -> None:
        from flowtide.dev.stack import DevStackError

        for n, stack in self.stacks.items():
            self.log(f"  N={n} stack: down (purge)")
            try:
                stack.down()
            except DevStackError as exc:
                self.log(f"  N={n} stack: down failed: {exc}")
        shutil.rmtree(self.root, ignore_errors=True)

    def placement(self) -> dict[str, dict[str, str]]:
        """Where each group of each stack runs, as words."""
        out = {}
        for n, stack in self.stacks.items():
            rows = {}
            for g in stack.groups():
                where = (
                    f"pinned to cpu{next(iter(g.cpus))}"
                    if len(g.cpus) == 1
                    else f"not pinned (cpu{', cpu'.join(str(c) for c in sorted(g.cpus))})"
                )
                rows[g.name] = where + (f" ({g.note})" if g.note else "")
            rows["client (this process)"] = "not pinned"
            out[f"N={n}"] = rows
        return out


# -- part (b) -------------------------------------------------------------------------------


def _status(client: Any, eid: str) -> dict[str, Any]:
    r = client.get(f"/api/executions/{eid}/status")
    r.raise_for_status()
    return dict(r.json())


def run_workload(
    cluster: Cluster, n: int, executions: int, iterations: int, mif: int
) -> dict[str, Any]:
    """One run on the N=n stack: submit, wait, measure; checks every execution."""
    from _shardstack import delta, sample
    from loop import playbook_text

    from distributed import check_loop_doc

    stack = cluster.stacks[n]
    others = [s for k, s in cluster.stacks.items() if k != n]
    everyone = [stack, *others]
    playbook = playbook_text(iterations, mif)
    load = os.getloadavg()
    fwd0 = stack.forwarded() if n > 1 else {}
    before = sample(everyone)
    submitted = time.time()
    runs: list[tuple[int, str]] = []
    for k in range(executions):
        shard = k % n
        r = stack.clients[shard].post("/api/execute", json={"playbook": playbook})
        r.raise_for_status()
        runs.append((shard, str(r.json()["execution_id"])))
    ends: list[float] = []
    deadline = time.monotonic() + 900.0
    for shard, eid in runs:
        while True:
            doc = _status(stack.clients[shard], eid)
            if doc["status"] in TERMINAL:
                ends.append(float(doc["updated"]))
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"N={n}: execution {eid} still {doc['status']} after 900 s")
            time.sleep(0.1)
    after = sample(everyone)
    fwd1 = stack.forwarded() if n > 1 else {}
    wall = max(ends) - submitted
    d = delta(before, after)
    for shard, eid in runs:
        if shard_for(int(eid), n) != shard:
            raise AssertionError(
                f"N={n}: execution {eid} started on shard {shard}'s server hashes to"
                f" shard {shard_for(int(eid), n)}"
            )
        doc = stack.clients[shard].get(f"/api/executions/{eid}").json()
        check_loop_doc(doc, iterations)
    problems = stack.check_pinning()
    if problems:
        stack.pin()
    total = executions * iterations
    groups = d["stacks"][0]
    ours = sum(sum(s.values()) for s in d["stacks"]) + d["client"]
    cpus = {k: v for k, v in d["cpus"].items() if k != "all"}
    return {
        "shards": n,
        "executions": executions,
        "iterations": total,
        "wall_s": wall,
        "it_s": total / wall,
        "loadavg": list(load),
        "sampled_s": d["wall"],
        "cpu_s": {
            **groups,
            "client": d["client"],
            "idle stack": sum(sum(s.values()) for s in d["stacks"][1:]),
            "rest of machine": max(0.0, d["cpus"]["all"] - ours),
        },
        "cpu_busy": {k: v / d["wall"] for k, v in cpus.items()},
        # The busiest other programs (CPU seconds by name; ones that ended are missing).
        "others": {k: round(v, 2) for k, v in list(d["others"].items())[:5]},
        "forwarded": {k: fwd1.get(k, 0.0) - v for k, v in fwd0.items()},
        "pinning_problems": problems,
    }


def _cores(run: dict[str, Any]) -> dict[str, float]:
    return {k: v / run["sampled_s"] for k, v in run["cpu_s"].items()}


def _shard_cpu(run: dict[str, Any], shard: int) -> float:
    return float(run["cpu_s"][f"shard {shard} server"] + run["cpu_s"][f"shard {shard} postgres"])


def run_b(args: argparse.Namespace, cluster: Cluster, log: Log) -> dict[str, Any]:
    E, I, mif = args.executions, args.iterations, args.max_in_flight  # noqa: E741,N806
    report: dict[str, Any] = {
        "settings": {
            "executions": E,
            "iterations_per_execution": I,
            "max_in_flight": mif,
            "workers": args.workers,
            "worker_concurrency": args.concurrency,
            "rounds": args.rounds,
        },
        "placement": cluster.placement(),
        "runs": {"1": [], "2": []},
    }
    log(
        f"part b: scale-out, {E} executions x {I:,} iterations (max_in_flight {mif}) per run,"
        f" {args.workers} workers x {args.concurrency}, {args.rounds} rounds"
    )
    for label, rows in report["placement"].items():
        log(f"  {label}:")
        for k, v in rows.items():
            log(f"    {k}: {v}")
    log("  warm-up (not counted):")
    for n in (1, 2):
        r = run_workload(cluster, n, 2 * n, min(I, 200), mif)
        log(f"    N={n}: {r['it_s']:,.0f} it/s")
    for rnd in range(args.rounds):
        for n in (1, 2) if rnd % 2 == 0 else (2, 1):
            r = run_workload(cluster, n, E, I, mif)
            report["runs"][str(n)].append(r)
            cores = _cores(r)
            shown = ", ".join(
                f"{k} {v:.2f}" for k, v in cores.items() if v >= 0.005 or k.startswith("shard")
            )
            fwd = (
                f"; forwarded {', '.join(f'{k} {v:,.0f}' for k, v in r['forwarded'].items())}"
                if r["forwarded"]
                else ""
            )
            log(
                f"  round {rnd + 1}/{args.rounds} N={n}: {r['it_s']:7,.0f} it/s"
                f" ({r['wall_s']:.1f} s), load {r['loadavg'][0]:.2f}; cpu busy "
                + ", ".join(f"{k} {v:.0%}" for k, v in r["cpu_busy"].items())
                + f"; cores: {shown}{fwd}"
            )
            busiest = ", ".join(
                f"{k} {v / r['sampled_s']:.2f}"
                for k, v in r["others"].items()
                if v / r["sampled_s"] >= 0.02
            )
            if busiest:
                log(f"    other programs meanwhile (cores): {busiest}")
            for p in r["pinning_problems"]:
                log(f"    WARNING: not where it was pinned: {p} (pinned again)")
    summarize_b(report, cluster, log)
    return report


def summarize_b(report: dict[str, Any], cluster: Cluster, log: Log) -> None:
    med: dict[str, dict[str, Any]] = {}
    for n, runs in report["runs"].items():
        its = [r["it_s"] for r in runs]
        keys = list(runs[0]["cpu_s"])
        med[n] = {
            "it_s": statistics.median(its),
            "it_s_all": its,
            "loadavg_1min": statistics.median(r["loadavg"][0] for r in runs),
            "cpu_ms_per_iteration": {
                k: statistics.median(r["cpu_s"][k] * 1000.0 / r["iterations"] for r in runs)
                for k in keys
            },
            "cores": {k: statistics.median(_cores(r)[k] for r in runs) for k in keys},
            "cpu_busy": {
                c: statistics.median(r["cpu_busy"][c] for r in runs) for c in runs[0]["cpu_busy"]
            },
            # Iterations per CPU second of the busiest shard's server + PostgreSQL: the
            # throughput if each shard's core did nothing else and nothing else limited.
            "shard_bound_it_s": statistics.median(
                r["iterations"] / max(_shard_cpu(r, i) for i in range(int(n))) for r in runs
            ),
        }
    ratio = med["2"]["it_s"] / med["1"]["it_s"]
    projected = med["2"]["shard_bound_it_s"] / med["1"]["shard_bound_it_s"]
    report["medians"] = med
    report["ratio"] = ratio
    report["projected_ratio_shards_only"] = projected
    report["goal"] = {"ratio_at_least": GOAL_SCALE, "met": ratio >= GOAL_SCALE}
    loads = [r["loadavg"][0] for runs in report["runs"].values() for r in runs]
    report["loadavg_1min_range"] = [min(loads), max(loads)]
    log("")
    log(f"== part b: scale-out, medians of {len(report['runs']['1'])} runs each ==")
    for n in ("1", "2"):
        m = med[n]
        log(
            f"  N={n}: {m['it_s']:7,.0f} it/s (runs: {', '.join(f'{x:,.0f}' for x in m['it_s_all'])}),"
            f" load {m['loadavg_1min']:.2f}; busy "
            + ", ".join(f"{c} {v:.0%}" for c, v in m["cpu_busy"].items())
        )
    log(
        f"  ratio N=2/N=1: {ratio:.2f}   goal >= {GOAL_SCALE}   {'MET' if ratio >= GOAL_SCALE else 'NOT MET'}"
        f"   (load average {min(loads):.2f}-{max(loads):.2f} over the runs)"
    )
    log("  CPU ms per iteration (median) and cores busy (median), by process group:")
    keys = list(med["2"]["cpu_ms_per_iteration"])
    keys += [k for k in med["1"]["cpu_ms_per_iteration"] if k not in keys]
    log(f"    {'group':24s} {'N=1 ms/it':>10s} {'cores':>6s}   {'N=2 ms/it':>10s} {'cores':>6s}")
    for k in keys:
        cells = []
        for n in ("1", "2"):
            ms = med[n]["cpu_ms_per_iteration"].get(k)
            cores = med[n]["cores"].get(k)
            cells.append(f"{ms:10.3f} {cores:6.2f}" if ms is not None else f"{'-':>10s} {'-':>6s}")
        log(f"    {k:24s} {cells[0]}   {cells[1]}")
    for n in ("1", "2"):
        per = med[n]["cpu_ms_per_iteration"]
        shard = sum(v for k, v in per.items() if k.startswith("shard"))
        shared = sum(
            v for k, v in per.items() if k in ("cluster db postgres", "nats", "workers", "client")
        )
        log(
            f"    N={n}: per shard (servers + their PostgreSQL) {shard:.3f} ms/it, shared"
            f" (cluster db, nats, workers, client) {shared:.3f} ms/it"
        )
    # What this machine allows at the CPU per iteration measured: N=1 is held by its one
    # core (server + PostgreSQL) or by both cores (everything of the stack), whichever is
    # less; N=2 likewise by its busiest shard's core or by both cores.
    ncpu = len(cluster.cpus)
    ceiling = {}
    for n in ("1", "2"):
        per = med[n]["cpu_ms_per_iteration"]
        total = sum(v for k, v in per.items() if k not in ("idle stack", "rest of machine"))
        shard = max(per[f"shard {i} server"] + per[f"shard {i} postgres"] for i in range(int(n)))
        ceiling[n] = min(1000.0 / shard, ncpu * 1000.0 / total)
        med[n]["ceiling_it_s"] = ceiling[n]
        med[n]["stack_cpu_ms_per_iteration"] = total
    report["ceiling_ratio_this_machine"] = ceiling["2"] / ceiling["1"]
    log(
        f"  ceiling on these {ncpu} cores at the CPU per iteration measured, nothing else"
        f" running: N=1 {ceiling['1']:,.0f} it/s (its shard's core: 1000 /"
        f" {1000.0 / ceiling['1']:.2f} ms), N=2 {ceiling['2']:,.0f} it/s ({ncpu} cores"
        f" for {med['2']['stack_cpu_ms_per_iteration']:.2f} ms of the whole stack per"
        f" iteration): ratio at most {report['ceiling_ratio_this_machine']:.2f}"
    )
    fwd = [sum(r["forwarded"].values()) / r["iterations"] for r in report["runs"]["2"]]
    report["forwarded_per_iteration_n2"] = statistics.median(fwd)
    log(
        f"  N=2: {statistics.median(fwd):.2f} requests forwarded between the servers per"
        " iteration (the workers' claims and reports for the shard their server is not)"
    )
    log(
        f"  projection, not measured: if each shard's core ran only its server and PostgreSQL"
        f" (shared parts elsewhere), {med['1']['shard_bound_it_s']:,.0f} -> "
        f"{med['2']['shard_bound_it_s']:,.0f} it/s, ratio {projected:.2f}"
    )
    problems = [p for runs in report["runs"].values() for r in runs for p in r["pinning_problems"]]
    report["pinning_held"] = not problems
    log(
        "  pinning, checked after every run: "
        + (
            "every thread of every pinned group was on its core"
            if not problems
            else f"{len(problems)} groups had threads elsewhere (listed above; pinned again)"
        )
    )


# -- part (c) -------------------------------------------------------------------------------


def run_c(args: argparse.Namespace, cluster: Cluster, log: Log) -> dict[str, Any]:
    from distributed import ONE_STEP, percentile

    stack = cluster.stacks[2]
    clients = stack.clients
    # One completed execution per shard: started on its server, so it is that shard's.
    owned: list[str] = []
    for shard, client in enumerate(clients):
        r = client.post("/api/execute", json={"playbook": ONE_STEP})
        r.raise_for_status()
        eid = str(r.json()["execution_id"])
        if shard_for(int(eid), 2) != shard:
            raise AssertionError(f"execution {eid} started on shard {shard}'s server is not its")
        deadline = time.monotonic() + 60.0
        while _status(client, eid)["status"] not in TERMINAL:
            if time.monotonic() > deadline:
                raise AssertionError(f"execution {eid} did not finish in 60 s")
            time.sleep(0.05)
        owned.append(eid)
    # (label, owner shard, server asked): both ids, both ways.
    paths = [
        ("direct", 0, 0),
        ("forwarded", 0, 1),
        ("direct", 1, 1),
        ("forwarded", 1, 0),
    ]
    per_path = max(1, args.requests // 2)
    log(
        f"part c: forwarding overhead on the N=2 stack, GET /api/executions/{{id}}/status,"
        f" {per_path * 2:,} requests to the owner's server and {per_path * 2:,} to the other"
        f" shard's (ids {owned[0]} on shard 0, {owned[1]} on shard 1), interleaved"
    )
    samples: dict[tuple[str, int, int], list[float]] = {p: [] for p in paths}

    def one(path: tuple[str, int, int]) -> float:
        _, owner, asked = path
        url = f"/api/executions/{owned[owner]}/status"
        t0 = time.perf_counter()
        r = clients[asked].get(url)
        dt = (time.perf_counter() - t0) * 1000.0
        if r.status_code != 200 or r.json().get("status") != "completed":
            raise AssertionError(f"GET {url} on server {asked}: {r.status_code} {r.text[:200]}")
        return dt

    for _ in range(50):
        for p in paths:
            one(p)
    load = os.getloadavg()
    t0 = time.monotonic()
    step = max(1, per_path // 5)
    for i in range(per_path):
        # Rotate the order so no path always follows the same one.
        for j in range(len(paths)):
            p = paths[(i + j) % len(paths)]
            samples[p].append(one(p))
        if (i + 1) % step == 0:
            log(f"  {(i + 1) * len(paths):,} of {per_path * len(paths):,} requests")
    seconds = time.monotonic() - t0

    def summary(values: list[float]) -> dict[str, float]:
        s = sorted(values)
        return {
            "count": len(s),
            "p50_ms": percentile(s, 50),
            "p90_ms": percentile(s, 90),
            "p99_ms": percentile(s, 99),
            "max_ms": s[-1],
            "mean_ms": statistics.fmean(s),
        }

    pooled = {
        kind: summary([v for p, vs in samples.items() if p[0] == kind for v in vs])
        for kind in ("direct", "forwarded")
    }
    by_path = {
        f"{kind} to shard {owner} (server {asked})": summary(vs)
        for (kind, owner, asked), vs in samples.items()
    }
    report = {
        "requests_per_kind": per_path * 2,
        "execution_ids": owned,
        "seconds": seconds,
        "loadavg_start": list(load),
        "loadavg_end": list(os.getloadavg()),
        "placement": cluster.placement()["N=2"],
        "direct": pooled["direct"],
        "forwarded": pooled["forwarded"],
        "by_path": by_path,
        "overhead_p50_ms": pooled["forwarded"]["p50_ms"] - pooled["direct"]["p50_ms"],
        "overhead_p99_ms": pooled["forwarded"]["p99_ms"] - pooled["direct"]["p99_ms"],
    }
    log("")
    log(f"== part c: status request latency, {seconds:.0f} s, load {load[0]:.2f} ==")
    log(f"    {'':40s} {'p50':>7s} {'p90':>7s} {'p99':>7s} {'max':>7s} ms")
    for label, s in [
        ("to the owner's server (direct)", pooled["direct"]),
        ("to the other shard's (forwarded)", pooled["forwarded"]),
        *by_path.items(),
    ]:
        log(
            f"    {label:40s} {s['p50_ms']:7.2f} {s['p90_ms']:7.2f} {s['p99_ms']:7.2f}"
            f" {s['max_ms']:7.1f}"
        )
    log(
        f"  forwarding adds {report['overhead_p50_ms']:.2f} ms at p50,"
        f" {report['overhead_p99_ms']:.2f} ms at p99"
    )
    return report


# -- main -----------------------------------------------------------------------------------


def _machine(log: Log) -> dict[str, Any]:
    from distributed import machine

    m = machine()
    log(
        f"machine: {m['cpus']} CPUs, Python {m['python']}, {m['postgres']}, {m['nats_server']},"
        f" load average {' '.join(f'{x:.2f}' for x in m['loadavg_start'])}; flowtide"
        f" {m['commit']}"
        + (
            f" + uncommitted changes in {m['src_uncommitted_files']} files under src/"
            if m["src_uncommitted_files"]
            else ""
        )
    )
    return m


def run_stacks(args: argparse.Namespace, parts: list[str], log: Log) -> dict[str, Any]:
    from flowtide.dev.postgres import find_pg_bin
    from flowtide.dev.stack import DevStackError

    two_cpus()  # fails early, before any stack, on a machine that cannot pin two cores
    if find_pg_bin() is None:
        raise DevStackError(
            "postgres: PostgreSQL's server programs (initdb, pg_ctl) are not installed: "
            "`apt-get install postgresql` (Debian/Ubuntu) or `bash scripts/ensure-postgres.sh`"
        )
    out: dict[str, Any] = {"machine": _machine(log)}
    isolation = os.environ.get("FLOWTIDE_PYTHON_ISOLATION") or "process (the workers' default)"
    out["workers_python_isolation"] = isolation
    log(f"workers' python steps: {isolation}")
    cluster = Cluster(args, log, [1, 2] if "b" in parts else [2])
    out["cpus_pinned_to"] = list(cluster.cpus)
    t0 = time.monotonic()
    try:
        log(f"dev stacks in {cluster.root} (cpu{cluster.cpus[0]}, cpu{cluster.cpus[1]}):")
        cluster.up()
        if "b" in parts:
            out["b"] = run_b(args, cluster, log)
        if "c" in parts:
            out["c"] = run_c(args, cluster, log)
    finally:
        cluster.down()
    out["seconds"] = time.monotonic() - t0
    out["loadavg_end"] = list(os.getloadavg())
    log(
        f"parts {','.join(p for p in parts if p != 'a')} took {out['seconds']:.0f} s; load average"
        f" at the end {' '.join(f'{x:.2f}' for x in out['loadavg_end'])}"
    )
    return out


def main() -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--part",
        default="a",
        help="a (default), b, c, a comma list such as b,c, or all",
    )
    a = parser.add_argument_group("part a")
    a.add_argument("--ids", type=int, default=1_000_000)
    a.add_argument("--machines", type=int, default=8)
    a.add_argument("--bursts", default="1,40", help="ids per millisecond per process")
    b = parser.add_argument_group("parts b and c")
    b.add_argument("--rounds", type=int, default=4, help="runs of each N in part b (default 4)")
    b.add_argument("--executions", type=int, default=8, help="loop executions per run (default 8)")
    b.add_argument(
        "--iterations", type=int, default=500, help="iterations per execution (default 500)"
    )
    b.add_argument(
        "--max-in-flight", type=int, default=64, help="the loop's max_in_flight (default 64)"
    )
    b.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    b.add_argument(
        "--concurrency", type=int, default=128, help="commands per worker at once (default 128)"
    )
    b.add_argument(
        "--requests",
        type=int,
        default=3000,
        help="part c: status requests to the owner and as many to the other shard (default 3000)",
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 round of 4 x 100 iterations, 200 requests each way",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    wanted = {p.strip() for p in args.part.lower().split(",") if p.strip()}
    if "all" in wanted:
        wanted = {"a", "b", "c"}
    if not wanted or wanted - {"a", "b", "c"}:
        parser.error(f"--part {args.part}: say a, b, c, a comma list of them, or all")
    parts = sorted(wanted)
    if args.quick:
        args.rounds, args.executions, args.iterations, args.requests = 1, 4, 100, 200
    for name in ("rounds", "executions", "iterations", "max_in_flight", "workers", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.requests < 2:
        parser.error("--requests must be >= 2")

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # A SIGTERM ends the run like ^C: the stacks' processes are stopped on the way out.
    signal.signal(signal.SIGTERM, interrupted)

    from flowtide.dev.stack import DevStackError

    out: dict[str, Any] = {}
    status = 0
    if "a" in parts:
        out["a"], ok = run_a(args, log)
        status = 0 if ok else 1
    if "b" in parts or "c" in parts:
        try:
            out.update(run_stacks(args, parts, log))
        except (DevStackError, Unfit) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except AssertionError as exc:
            print(f"CHECK FAILED: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(out[parts[0]] if parts == ["a"] else out, indent=2, default=str))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
