"""Spark loops: a loop's items as Spark tasks (`mode: spark`) against the same loop as
one command per item (`mode: parallel`), embedded, in one invocation.

    .venv/bin/python bench/spark_loop.py [--items 1000000] [--small 100000]
                                         [--parallel 100000] [--rounds 1] [--json]
                                         [--prefect [--prefect-budget 300]]
    .venv/bin/python bench/spark_loop.py --http [--http-items 100000] [--rate 500]
                                         [--http-port 0]

Each variant is `flowtide run` of a generated playbook in its own process (its own home,
its own Spark session): a spark step writes `SELECT id AS x FROM range(N)` as parquet,
then the measured loop runs `result = {'sq': x * x}` with `input: {x: "{{ iter.x }}"}`
for every row, then a last step checks the count. What is timed is the loop step alone
(its call's duration for `mode: spark`, its step.enter to step.exit for `mode:
parallel`), so JVM start-up and the data generation are left out of the rates; the wall
time of the whole process is printed beside them.

Figures: items/s of each variant, spark(big)/parallel (goal >= 10), spark items/s at
`--items` (goal >= 50,000 on a 2-core machine), time(big)/time(small) (goal <= 11), and
the peak RSS of the flowtide process (goal <= 1 GiB; Spark's JVM and python workers are
its children and are not counted in it: sampled from /proc every 0.2 s). Rounds run the variants interleaved; medians.

`--prefect` (off by default: it installs Prefect from PyPI once and its ladder takes
minutes) also runs bench/prefect_map.py: Prefect 3 `task.map` of the same work at the
largest size of a ladder that it completes within `--prefect-budget` seconds (300), and
prints its items/s and spark(big)/prefect beside the others.
`--http` (alone): a `mode: spark` loop of `--http-items` `http` GETs with `spec.rate`
against a stub server on loopback (`http.server`, threaded, keep-alive, in its own
process so its CPU is read apart), which notes when each request arrives. Figures: the
achieved rate (requests over the span from the first arrival to the last; and over the
middle 90 % of the requests), its deviation from `--rate` (goal: within 5 %), the
busiest second, and the stub's CPU (it must not be what limits the rate).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: bench_spark_loop, path: bench/spark_loop}}
workload: {{n: 0}}
executor:
  spark:
    master: local[*]
    conf: {{spark.sql.shuffle.partitions: 4}}
workflow:
  - step: gen
    tool:
      kind: spark
      sql: SELECT id AS x FROM range(0, :n)
      params: {{n: "{{{{ workload.n }}}}"}}
    next: [work]
  - step: work
    loop: {{in: {collection}, iterator: x, spec: {{mode: {mode}{extra}}}}}
    tool:
      kind: python
      input: {{x: "{{{{ iter.x }}}}"}}
      code: "result = {{'sq': x * x}}"
    next: [check]
  - step: check
    tool:
      kind: python
      input: {{stats: "{{{{ work.stats }}}}"}}
      code: "result = stats"
"""


def _playbook(mode: str) -> str:
    if mode == "spark":
        return PLAYBOOK.format(collection='"{{ gen }}"', mode="spark", extra=", results_max: 0")
    # A parallel loop iterates a list: the items made by a python step (no Spark).
    text = PLAYBOOK.format(collection='"{{ items }}"', mode="parallel", extra=", max_in_flight: 16")
    start = text.index("  - step: gen")
    end = text.index("  - step: work")
    items = (
        "  - step: items\n"
        '    tool: {kind: python, input: {n: "{{ workload.n }}"}, code: "result = list(range(n))"}\n'
        "    next: [work]\n"
    )
    return text[:start] + items + text[end:]


def _run(mode: str, n: int, root: Path) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"{mode}-{n}-", dir=root))
    book = folder / "pb.yaml"
    book.write_text(_playbook(mode))
    env = dict(os.environ, FLOWTIDE_HOME=str(folder / "home"), FLOWTIDE_NO_PROGRESS="1")
    t0 = time.perf_counter()
    out_file = folder / "stdout.json"
    with out_file.open("w") as out, (folder / "stderr.txt").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowtide.cli", "run", str(book), "--set", f"n={n}", "--json"],
            stdout=out,
            stderr=err,
            env=env,
        )
        # The flowtide process's own peak (VmHWM never goes down: its last reading is the
        # peak); Spark's JVM and python workers are its children, read apart.
        peak_kb = 0
        while proc.poll() is None:
            peak_kb = max(peak_kb, _hwm_kb(proc.pid))
            time.sleep(0.2)
    stdout = out_file.read_text()
    wall = time.perf_counter() - t0
    doc = json.loads(stdout)
    if doc["status"] != "completed":
        raise SystemExit(f"{mode} {n}: {doc['error']}")
    stats = doc["result"]
    assert stats == {"total": n, "success": n, "failed": 0}, stats
    events = json.loads(
        subprocess.run(
            [sys.executable, "-m", "flowtide.cli", "events", doc["execution_id"], "--json"],
            capture_output=True, text=True, env=env, check=True,
        ).stdout
    )  # fmt: skip
    work = [e for e in events if e.get("step") == "work"]
    if mode == "spark":
        call = next(e for e in work if e["type"] == "call.done")
        seconds = call["payload"]["duration_ms"] / 1000
    else:
        times = [e["time"] for e in work if e["type"] in ("step.enter", "step.exit")]
        seconds = max(times) - min(times)
    return {
        "mode": mode,
        "items": n,
        "loop_seconds": round(seconds, 3),
        "items_per_s": round(n / seconds),
        "wall_seconds": round(wall, 2),
        "peak_rss_mib": round(peak_kb / 1024),
        "events": len(events),
    }


def _prefect(budget: float, spark_rate: float) -> dict[str, Any]:
    """bench/prefect_map.py's ladder (its own venv; progress on stderr) and the ratio."""
    script = Path(__file__).resolve().parent / "prefect_map.py"
    done = subprocess.run(
        [sys.executable, str(script), "--json", "--budget", str(budget)],
        stdout=subprocess.PIPE, text=True, check=False,
    )  # fmt: skip
    if not done.stdout.strip():
        raise SystemExit(f"bench/prefect_map.py exited {done.returncode} with no figures")
    pf: dict[str, Any] = json.loads(done.stdout)
    rate = pf["items_per_s"]
    pf["spark_over_prefect"] = round(spark_rate / rate, 1) if rate else None
    return pf


HTTP_PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: bench_spark_loop_http, path: bench/spark_loop_http}
workload: {n: 0, rate: 1, url: ""}
executor:
  spark:
    master: local[*]
workflow:
  - step: work
    loop:
      in: "{{ range(workload.n) | list }}"
      iterator: n
      spec: {mode: spark, rate: "{{ workload.rate }}", max_in_flight: 8, results_max: 0}
    tool: {kind: http, url: "{{ workload.url }}/n/{{ iter.n }}"}
    next: [check]
  - step: check
    tool: {kind: python, input: {stats: "{{ work.stats }}"}, code: "result = stats"}
"""

#: The stub: answers every GET at once and notes its arrival (monotonic clock);
#: GET /_arrivals returns them. Run as `python -c STUB PORT`; prints its port.
STUB = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
arrivals, lock = [], threading.Lock()
class Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        if self.path == "/_arrivals":
            with lock:
                body = json.dumps(arrivals).encode()
        else:
            at = time.monotonic()
            with lock:
                arrivals.append(at)
            body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Stub)
print(server.server_port, flush=True)
server.serve_forever()
"""


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_http(n: int, rate: float, port: int, root: Path) -> dict[str, Any]:
    """The `--http` variant: one `flowtide run` of a rate-limited spark loop of GETs."""
    import urllib.request

    folder = Path(tempfile.mkdtemp(prefix=f"http-{n}-", dir=root))
    book = folder / "pb.yaml"
    book.write_text(HTTP_PLAYBOOK)
    stub = subprocess.Popen(
        [sys.executable, "-c", STUB, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert stub.stdout is not None
        url = f"http://127.0.0.1:{int(stub.stdout.readline())}"
        env = dict(os.environ, FLOWTIDE_HOME=str(folder / "home"), FLOWTIDE_NO_PROGRESS="1")
        cpu0, t0 = _cpu_seconds(stub.pid), time.perf_counter()
        sets = [f"n={n}", f"rate={rate:g}", f"url={url}"]
        proc = subprocess.run(
            [sys.executable, "-m", "flowtide.cli", "run", str(book), "--json"]
            + [x for kv in sets for x in ("--set", kv)],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        stub_cpu = _cpu_seconds(stub.pid) - cpu0
        with urllib.request.urlopen(f"{url}/_arrivals") as answer:
            arrivals = sorted(json.loads(answer.read()))
    finally:
        stub.terminate()
        stub.wait()
    doc = json.loads(proc.stdout)
    if doc["status"] != "completed":
        raise SystemExit(f"http {n}: {doc['error']}\n{proc.stderr[-2000:]}")
    assert doc["result"] == {"total": n, "success": n, "failed": 0}, doc["result"]
    assert len(arrivals) == n, len(arrivals)
    span = arrivals[-1] - arrivals[0]
    cut = n // 20
    middle = arrivals[cut : n - cut]
    achieved = (n - 1) / span
    busiest, k = 0, 0
    for j, t in enumerate(arrivals):
        while arrivals[k] <= t - 1.0:
            k += 1
        busiest = max(busiest, j - k + 1)
    return {
        "items": n,
        "rate": rate,
        "span_seconds": round(span, 2),
        "achieved_per_s": round(achieved, 1),
        "deviation_pct": round((achieved / rate - 1) * 100, 2),
        "middle_per_s": round((len(middle) - 1) / (middle[-1] - middle[0]), 1),
        "busiest_second": busiest,
        "stub_cpu_pct_of_a_core": round(stub_cpu / span * 100, 1),
        "wall_seconds": round(wall, 1),
        "load": [round(x, 2) for x in os.getloadavg()],
        "cores": os.cpu_count(),
    }


def _print_http(out: dict[str, Any]) -> None:
    print(
        f"http  {out['items']:,} items at rate {out['rate']:g}/s: achieved {out['achieved_per_s']:,}/s"
        f" over {out['span_seconds']} s ({out['deviation_pct']:+.2f} %), middle 90 %"
        f" {out['middle_per_s']:,}/s, busiest second {out['busiest_second']:,}"
    )
    print(
        f"stub CPU {out['stub_cpu_pct_of_a_core']} % of a core; wall {out['wall_seconds']} s;"
        f" load {' '.join(map(str, out['load']))} on {out['cores']} cores"
    )
    met = abs(out["deviation_pct"]) <= 5
    print(f"{'met    ' if met else 'NOT met'}  rate within 5 %: {out['deviation_pct']:+.2f} %")


def _hwm_kb(pid: int) -> int:
    """VmHWM (peak resident set) of process `pid` in KiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--parallel", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--prefect", action="store_true", help="also Prefect 3 task.map (slow)")
    ap.add_argument("--prefect-budget", type=float, default=300.0)
    ap.add_argument("--http", action="store_true", help="the rate-limited http variant alone")
    ap.add_argument("--http-items", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=500.0, help="--http: items/s of the job")
    ap.add_argument("--http-port", type=int, default=0, help="--http: the stub's port")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="flowtide-bench-spark-loop-"))
    if args.http:
        http = _run_http(args.http_items, args.rate, args.http_port, root)
        print(json.dumps(http, indent=2)) if args.json else _print_http(http)
        return
    samples: dict[str, list[dict[str, Any]]] = {"big": [], "small": [], "parallel": []}
    for _ in range(args.rounds):
        samples["parallel"].append(_run("parallel", args.parallel, root))
        samples["small"].append(_run("spark", args.small, root))
        samples["big"].append(_run("spark", args.items, root))
    med = {k: statistics.median(s["loop_seconds"] for s in v) for k, v in samples.items()}
    rate = {
        "big": args.items / med["big"],
        "small": args.small / med["small"],
        "parallel": args.parallel / med["parallel"],
    }
    load = os.getloadavg()
    out = {
        "load": [round(x, 2) for x in load],
        "cores": os.cpu_count(),
        "samples": samples,
        "spark_items_per_s": round(rate["big"]),
        "parallel_items_per_s": round(rate["parallel"]),
        "spark_over_parallel": round(rate["big"] / rate["parallel"], 1),
        "time_big_over_small": round(med["big"] / med["small"], 2),
        "peak_rss_mib": max(s["peak_rss_mib"] for v in samples.values() for s in v),
    }
    if args.prefect:
        out["prefect"] = _prefect(args.prefect_budget, rate["big"])
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name, v in samples.items():
        for s in v:
            print(
                f"{name:9} {s['mode']:9} {s['items']:>9,} items  loop {s['loop_seconds']:8.2f} s"
                f"  {s['items_per_s']:>8,}/s  wall {s['wall_seconds']:7.1f} s  events {s['events']}"
            )
    print(f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    goals = [
        ("spark items/s at --items >= 50,000", rate["big"] >= 50_000, f"{rate['big']:,.0f}"),
        (
            "spark / parallel >= 10",
            rate["big"] / rate["parallel"] >= 10,
            f"{out['spark_over_parallel']}x",
        ),
        (
            "time(big)/time(small) <= 11",
            med["big"] / med["small"] <= 11 * args.items / args.small / 10,
            f"{out['time_big_over_small']}",
        ),
        (
            "peak RSS of flowtide <= 1 GiB",
            out["peak_rss_mib"] <= 1024,
            f"{out['peak_rss_mib']} MiB",
        ),
    ]
    for text, met, figure in goals:
        print(f"{'met    ' if met else 'NOT met'}  {text}: {figure}")
    if "prefect" in out:
        pf = out["prefect"]
        print(
            f"prefect   task.map  {pf['n']:>9,} items  map  {pf['seconds'] or 0:8.2f} s"
            f"  {pf['items_per_s']:>8,}/s  (Prefect {pf['prefect']}, largest size done within"
            f" {pf['budget_s']:.0f} s; peak RSS {pf['peak_rss_mb']} MiB)"
            f"  spark/prefect {pf['spark_over_prefect']}x"
        )


if __name__ == "__main__":
    main()
