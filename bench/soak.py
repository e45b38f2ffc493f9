"""Soak: does memory stay flat over many executions on the distributed stack?

    .venv/bin/python bench/soak.py [--executions 200] [--every 25] [--warmup 50]
        [--items 10] [--workers 1] [--flat-mb 5] [--ports BASE] [--json]

One dev stack (`flowtide.dev.stack.DevStack`: PostgreSQL, nats-server, one `flowtide
server`, --workers `flowtide worker`s, on loopback, in a fresh temp home, purged at the
end) runs --executions executions one after the other through the API: a start step, a
parallel loop of --items python iterations and an end step (bench/loop.py's playbook).
Each must complete with its --items results. Every --every executions (and before the
first) the resident memory of the server process and of each worker process is read from
/proc/PID/status (VmRSS; a worker's python steps run in children that are not counted).

Verdict: after the first --warmup executions (imports, pools, caches filling), the growth
of each process's RSS per 100 executions, from a least-squares line over the samples
from the warm-up on (a slope, so one noisy sample weighs little); flat when each is under
--flat-mb MB per 100 executions.

Text goes to stdout, or to stderr with --json, which prints one JSON document on stdout.
Exit status: 0 when it ran (flat or not), 1 when an execution failed, 2 when the stack
could not be started.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loop import playbook_text as loop_playbook  # noqa: E402

from distributed import Bench, Log, check_loop_doc, machine  # noqa: E402


def rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` in KiB (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def slope_per_100(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (executions, MB) points, in MB per 100 executions."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return 100.0 * sxy / sxx


def verdict(
    samples: list[dict[str, Any]], warmup: int, flat_mb: float
) -> dict[str, dict[str, float | bool]]:
    """Per process: RSS growth per 100 executions after `warmup`, and whether flat."""
    out: dict[str, dict[str, float | bool]] = {}
    names = sorted({k for s in samples for k in s["rss_mb"]})
    for name in names:
        points = [
            (s["executions"], s["rss_mb"][name])
            for s in samples
            if s["executions"] >= warmup and s["rss_mb"].get(name) is not None
        ]
        growth = slope_per_100(points)
        total = points[-1][1] - points[0][1] if points else 0.0
        out[name] = {
            "growth_mb_per_100": round(growth, 2),
            "after_warmup_mb": round(total, 2),
            "flat": growth < flat_mb,
        }
    return out


def run(args: argparse.Namespace, log: Log) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": machine(), "settings": vars(args).copy()}
    playbook = loop_playbook(args.items, 16)
    home = Path(tempfile.mkdtemp(prefix="flowtide-soak-", dir="/tmp"))
    home.chmod(0o755)
    bench = Bench(home / ".flowtide", args.workers, log)
    try:
        log(f"dev stack in {home} ({args.workers} worker(s))")
        if args.ports:
            # Bench.up with the ports given rather than free ones.
            bench.stack.up(
                workers=args.workers,
                concurrency=8,
                progress=lambda line: log(f"  {line}"),
                timeout=120.0,
                server_port=args.ports,
                nats_port=args.ports + 1,
                pg_port=args.ports + 2,
            )
            bench.concurrency = 8
            bench.http = bench.stack.admin_client(timeout=60.0)
        else:
            bench.up(8)
        pids = {
            name: pid
            for name, pid in bench.stack.config.pids.items()
            if name == "server" or name.startswith("worker-")
        }
        samples: list[dict[str, Any]] = []

        def sample(done: int) -> None:
            rss = {name: rss_kib(pid) for name, pid in pids.items()}
            mb = {name: round(v / 1024, 1) if v is not None else None for name, v in rss.items()}
            samples.append({"executions": done, "time": time.time(), "rss_mb": mb})
            log(f"  {done:>5}  " + "  ".join(f"{n} {v} MB" for n, v in mb.items()))

        log(f"  {'runs':>5}  RSS")
        sample(0)
        t0 = time.perf_counter()
        for i in range(1, args.executions + 1):
            eid, _ = bench.execute(playbook)
            status = bench.wait(eid, poll=0.02)
            if status != "completed":
                raise AssertionError(f"execution {eid}: {status}")
            if i % args.every == 0 or i == args.executions:
                doc = bench.api.get(f"/api/executions/{eid}").json()
                check_loop_doc(doc, args.items)
                sample(i)
        wall = time.perf_counter() - t0
        report["samples"] = samples
        report["wall_seconds"] = round(wall, 1)
        report["executions_per_second"] = round(args.executions / wall, 2)
        report["verdict"] = verdict(samples, args.warmup, args.flat_mb)
        report["flat"] = all(v["flat"] for v in report["verdict"].values())
        report["machine"]["loadavg_end"] = os.getloadavg()
    finally:
        bench.down()
    return report


def summarize(report: dict[str, Any], args: argparse.Namespace, log: Log) -> None:
    log(
        f"\n{args.executions} executions ({args.items}-item loop, python steps) in"
        f" {report['wall_seconds']} s ({report['executions_per_second']}/s);"
        f" load average {report['machine']['loadavg_end'][0]:.2f} on"
        f" {report['machine']['cpus']} CPUs"
    )
    log(f"RSS growth after the first {args.warmup} (least squares, per 100 executions):")
    for name, v in report["verdict"].items():
        mark = "flat" if v["flat"] else "GROWING"
        log(
            f"  {name:<10} {v['growth_mb_per_100']:+.2f} MB/100"
            f"  ({v['after_warmup_mb']:+.1f} MB from run {args.warmup} to the end)  {mark}"
        )
    log(f"verdict: {'flat' if report['flat'] else 'NOT flat'} (flat: < {args.flat_mb} MB/100)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=200)
    parser.add_argument("--every", type=int, default=25, help="sample RSS every N executions")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--items", type=int, default=10, help="loop items per execution")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--flat-mb", type=float, default=5.0)
    parser.add_argument(
        "--ports",
        type=int,
        default=None,
        help="the server's port; NATS and PostgreSQL on the next two (default: free ones)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    from flowtide.dev.stack import DevStackError

    try:
        report = run(args, log)
    except DevStackError as exc:
        log(f"error: the stack did not start: {exc}")
        return 2
    except AssertionError as exc:
        log(f"error: {exc}")
        return 1
    summarize(report, args, log)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
