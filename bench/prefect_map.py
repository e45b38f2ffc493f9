"""Prefect 3 `task.map` over N items, the per-item work of bench/spark_loop.py.

    python3 bench/prefect_map.py [--sizes 1000,5000,10000,20000,...] [--budget 300]
                                 [--runner default|threads:N] [--json]
    python3 bench/prefect_map.py --setup        # only create the Prefect venv

A `@flow` maps a `@task` computing `{'sq': x * x}` over `range(n)` and gathers every
result (`.map(...).result()`), then checks that the sum of `sq` is exact. Timed
("seconds"): from the call to `.map` to all results gathered. Reported apart: the
process's import of prefect, the flow's start-up (flow call to its body: the ephemeral
API server's start and its database migration) and the time after the body (flow call
returning), and the process wall time.

Sizes form a ladder: each runs in a fresh process of its own, and the ladder stops at
the first size that fails or whose map does not finish within `--budget` seconds (300 by
default; the process is then killed). The largest size completed and its rate are the
result. A process also gets `--startup-timeout` seconds (180) to reach the map.

Prefect as a user gets it: `prefect>=3,<4` from PyPI in its own venv,
bench/.venv-prefect (shared with bench/loop.py; created on first use, outside flowtide's
dependencies, whose pydantic/fastapi pins may differ; this script does not import
flowtide), the ephemeral local API (a server subprocess on loopback that Prefect starts
itself: PREFECT_API_URL unset, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE=true), and the default
task runner: `ThreadPoolTaskRunner()`, whose pool is unbounded unless
PREFECT_TASKS_RUNNER_THREAD_POOL_MAX_WORKERS is set. `--runner threads:N` bounds it. Every PREFECT_* variable of the
caller is dropped; PREFECT_HOME is a temp dir (removed afterwards) and the process runs
in it, so no profile, database or `prefect.toml`/`pyproject.toml` of the user's is read
and nothing is left in ~. Telemetry off: PREFECT_SERVER_ANALYTICS_ENABLED=false,
DO_NOT_TRACK=1; the UI is off. PREFECT_LOGGING_LEVEL=WARNING: INFO prints two lines per
task run, and the console is not the work measured.

Peak RSS: the Prefect process's own (VmHWM) and the peak of the sum of VmRSS over it and
its children (the ephemeral server), sampled from /proc every 0.25 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
VENV = Path(os.environ.get("FLOWTIDE_BENCH_PREFECT_VENV", BENCH_DIR / ".venv-prefect"))
SPEC = "prefect>=3,<4"
# Prefect 3.8.8 allowed fastapi 0.155+, whose Body() no longer takes `min_items`, which
# its ephemeral server passes (see bench/RESULTS.md, "About Prefect"); bench/loop.py pins
# the same, so the two share one venv.
CONSTRAINTS = ("fastapi<0.155",)
SIZES = (1_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)
PROBE = "import prefect, prefect.server.api.server; print(prefect.__version__)"


# -- the Prefect side: runs inside the venv, one process per size ------------------------


def child(n: int, runner_spec: str, out_path: Path, started_path: Path) -> None:
    t0 = time.perf_counter()
    import prefect
    from prefect import flow, task
    from prefect.task_runners import ThreadPoolTaskRunner

    import_s = time.perf_counter() - t0
    kind, _, workers = runner_spec.partition(":")
    runner: Any
    if kind == "default":
        runner = ThreadPoolTaskRunner()
    elif kind == "threads":
        runner = ThreadPoolTaskRunner(max_workers=int(workers))
    else:
        raise SystemExit(f"--runner {runner_spec!r}: expected default or threads:N")

    def square_(x: int) -> dict[str, int]:
        return {"sq": x * x}

    def mapped_(n: int) -> dict[str, Any]:
        entered = time.perf_counter()
        started_path.write_text("")
        items = list(range(n))
        submit = time.perf_counter()
        results = square.map(items).result()
        gathered = time.perf_counter()
        total = sum(r["sq"] for r in results)
        return {"entered": entered, "seconds": gathered - submit, "gathered": gathered,
                "count": len(results), "sum": total}  # fmt: skip

    # Applied as calls, not decorators: prefect is not installed where mypy runs.
    square: Any = task(name="square")(square_)
    mapped: Any = flow(name="bench-prefect-map", task_runner=runner)(mapped_)

    called = time.perf_counter()
    body = mapped(n)
    returned = time.perf_counter()
    expected = (n - 1) * n * (2 * n - 1) // 6  # sum of x*x for x in range(n)
    doc = {
        "n": n,
        "seconds": body["seconds"],
        "ok": body["count"] == n and body["sum"] == expected,
        "count": body["count"],
        "import_s": import_s,
        "flow_startup_s": body["entered"] - called,
        "after_body_s": returned - body["gathered"],
        "flow_call_s": returned - called,
        "prefect": prefect.__version__,
        "python": platform.python_version(),
        "runner": f"{type(runner).__name__}(max_workers={_workers(runner)})",
    }
    out_path.write_text(json.dumps(doc))


def _workers(runner: Any) -> str:
    n = getattr(runner, "_max_workers", None)
    return "unbounded" if n is None or n >= sys.maxsize else str(n)


# -- the driver: any python ------------------------------------------------------------


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv(log: Any = print) -> str:
    """Create VENV with Prefect unless it already imports. Returns Prefect's version."""
    py = venv_python()
    if py.exists():
        done = _probe(py)
        if done.returncode == 0:
            return done.stdout.strip()
    where = VENV.relative_to(BENCH_DIR.parent) if VENV.is_relative_to(BENCH_DIR.parent) else VENV
    log(f"installing Prefect 3 into {where} (once): pip install '{SPEC}' {' '.join(CONSTRAINTS)}")
    if not py.exists():
        subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", str(VENV)], check=True)  # fmt: skip
    pip = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", SPEC, *CONSTRAINTS],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        raise SystemExit(f"pip install '{SPEC}' into {VENV} failed:\n{pip.stderr[-4000:]}")
    done = _probe(py)
    if done.returncode != 0:
        raise SystemExit(f"Prefect installed in {VENV} but does not import:\n{done.stderr[-4000:]}")
    log(f"Prefect {done.stdout.strip()} installed in {where}")
    return done.stdout.strip()


def _probe(py: Path) -> subprocess.CompletedProcess[str]:
    """Import Prefect and its server (what the ephemeral API needs) as the runs will."""
    with tempfile.TemporaryDirectory(prefix="flowtide-bench-prefect-probe-") as tmp:
        return subprocess.run(
            [str(py), "-c", PROBE], capture_output=True, text=True, cwd=tmp,
            env=prefect_env(Path(tmp) / "home"),
        )  # fmt: skip


def prefect_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PREFECT_") and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ALLOW_EPHEMERAL_MODE="true",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="false",
        DO_NOT_TRACK="1",
        PREFECT_LOGGING_LEVEL="WARNING",
        # The ephemeral server's start (and a fresh database's migration) takes longer
        # than Prefect's default 20 s on a busy 2-core machine; reported apart anyway.
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
    )
    return env


def _proc_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _tree(pid: int) -> list[int]:
    """pid and its descendants, from /proc/PID/task/*/children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for t in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in t.read_text().split())
            except (OSError, ValueError):
                pass
    return out


def run_size(n: int, runner: str, budget: float, startup_timeout: float) -> dict[str, Any]:
    """One size in a fresh process; kills its process group on a timeout."""
    tmp = Path(tempfile.mkdtemp(prefix=f"flowtide-bench-prefect-map-{n}-"))
    try:
        out_path, started_path = tmp / "out.json", tmp / "started"
        cmd = [str(venv_python()), str(Path(__file__).resolve()), "--child", str(n),
               "--runner", runner, "--out", str(out_path), "--started", str(started_path)]  # fmt: skip
        t0 = time.perf_counter()
        with (tmp / "stderr.txt").open("w") as err:
            proc = subprocess.Popen(
                cmd, cwd=tmp, env=prefect_env(tmp / "home"), stdout=err, stderr=err,
                start_new_session=True,
            )  # fmt: skip
            hwm_kb = tree_kb = 0
            map_t0: float | None = None
            timed_out = ""
            while proc.poll() is None:
                now = time.perf_counter()
                if map_t0 is None and started_path.exists():
                    map_t0 = now
                if map_t0 is None and now - t0 > startup_timeout:
                    timed_out = f"did not reach the map within {startup_timeout:.0f} s"
                elif map_t0 is not None and now - map_t0 > budget:
                    timed_out = f"map not done within the {budget:.0f} s budget"
                if timed_out:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                hwm_kb = max(hwm_kb, _proc_kb(proc.pid, "VmHWM"))
                tree_kb = max(tree_kb, sum(_proc_kb(p, "VmRSS") for p in _tree(proc.pid)))
                time.sleep(0.25)
        wall = time.perf_counter() - t0
        base = {"n": n, "wall_s": round(wall, 2), "peak_rss_mb": round(hwm_kb / 1024),
                "peak_tree_rss_mb": round(tree_kb / 1024)}  # fmt: skip
        if timed_out:
            return base | {"ok": False, "error": timed_out}
        if proc.returncode != 0 or not out_path.exists():
            tail = (tmp / "stderr.txt").read_text(errors="replace")[-3000:]
            return base | {"ok": False, "error": f"exited {proc.returncode}: {tail}"}
        doc: dict[str, Any] = json.loads(out_path.read_text())
        if doc["seconds"] > budget:  # finished between two polls, over the budget
            return base | doc | {"ok": False, "error": f"map took {doc['seconds']:.1f} s"}
        return base | doc | {"items_per_s": round(n / doc["seconds"])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ladder(
    sizes: list[int], runner: str, budget: float, startup_timeout: float, log: Any
) -> dict[str, Any]:
    version = ensure_venv(log)
    steps: list[dict[str, Any]] = []
    for n in sizes:
        log(f"prefect task.map n={n:,} ...")
        r = run_size(n, runner, budget, startup_timeout)
        steps.append(r)
        if not r["ok"]:
            log(f"  n={n:,} failed: {r.get('error', 'sum of sq not exact')[:2000]}")
            break
        log(
            f"  n={n:,}: map {r['seconds']:.2f} s = {r['items_per_s']:,} items/s;"
            f" flow start-up {r['flow_startup_s']:.1f} s, after {r['after_body_s']:.1f} s,"
            f" wall {r['wall_s']:.1f} s; peak RSS {r['peak_rss_mb']} MiB"
            f" (with the server {r['peak_tree_rss_mb']} MiB)"
        )
    done = [s for s in steps if s["ok"]]
    best = done[-1] if done else None
    return {
        "prefect": version,
        "runner": best["runner"] if best else runner,
        "budget_s": budget,
        "load": [round(x, 2) for x in os.getloadavg()],
        "cores": os.cpu_count(),
        "ladder": steps,
        "n": best["n"] if best else 0,
        "seconds": round(best["seconds"], 3) if best else None,
        "items_per_s": best["items_per_s"] if best else 0,
        "ok": best is not None,
        "peak_rss_mb": best["peak_rss_mb"] if best else None,
        "peak_tree_rss_mb": best["peak_tree_rss_mb"] if best else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--budget", type=float, default=300.0, help="seconds per size (map)")
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("--runner", default="default")
    ap.add_argument("--setup", action="store_true", help="only create the Prefect venv")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--started", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.runner, args.out, args.started)
        return
    if args.setup:
        print(f"Prefect {ensure_venv()} in {VENV}")
        return

    def log(msg: str) -> None:
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    out = ladder(sizes, args.runner, args.budget, args.startup_timeout, log)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    load = " ".join(str(x) for x in out["load"])
    if not out["ok"]:
        print(f"Prefect {out['prefect']}: no size completed; load {load} on {out['cores']} cores")
        sys.exit(1)
    print(
        f"Prefect {out['prefect']} ({out['runner']}): largest size done within"
        f" {args.budget:.0f} s: {out['n']:,} in {out['seconds']} s = {out['items_per_s']:,}"
        f" items/s; peak RSS {out['peak_rss_mb']} MiB (with the server"
        f" {out['peak_tree_rss_mb']} MiB); load {load} on {out['cores']} cores"
    )


if __name__ == "__main__":
    main()
