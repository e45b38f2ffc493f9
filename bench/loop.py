"""Parallel-loop throughput: flowtide embedded (in-process and CLI) against Prefect 3.

    .venv/bin/python bench/loop.py [--n N] [--max-in-flight 16] [--repeat R]
                                   [--skip-prefect] [--skip-cli] [--json]
    .venv/bin/python bench/loop.py --scaling [--scaling-n 10000 100000]
    .venv/bin/python bench/loop.py --profile [--profile-n 10000] [--profile-out DIR]
    .venv/bin/python bench/loop.py --isolation [--n 4000] [--repeat 5]
    .venv/bin/python bench/loop.py --traces [--n 4000] [--repeat 5] [--base-src DIR]

The work is the same on both sides: N tiny iterations, `{"i": item, "sq": item * item}`.

flowtide: a generated playbook (start -> parallel loop of N with max_in_flight -> end)
run through `LocalRuntime` + `SQLiteStore` in a temp dir, exactly as `flowtide run` wires
them, and also through the CLI itself (`flowtide run FILE --json`) to include start-up.
"loop" figures span the loop.started and loop.done events of the event log; "run" spans
`runtime.start()` to the terminal state; the CLI figure is the subprocess's wall time.

Prefect: `@flow` calling `@task.map` over N items with the default task runner, in a
throwaway venv (bench/.venv-prefect, created on first use with pip, outside the project's
dependencies), PREFECT_HOME in a temp dir, the ephemeral local API, telemetry off. The
first flow call in a fresh process (includes the ephemeral server start and database
migration) and warm calls in the same process are reported separately, each split into
time before the flow body, the map section and time after it. Prefect's server records
task runs from events after the fact, so a warm call also waits for the previous call's
backlog (seen with `py-spy dump` in server/services/task_run_recorder.py). Prefect waits
up to `--prefect-startup-timeout` seconds (120; Prefect's default is 20) for its ephemeral
server, which a busy machine needs; when the Prefect process fails, its whole stderr is
printed and kept in the report (`compare.prefect.stderr` with --json).

Every measurement runs in its own subprocess so peak RSS (ru_maxrss) does not mix.
`--scaling` and `--profile` are separate modes; without either, the comparison runs.

`--isolation` (flowtide only) runs the same loop with the python steps in-process
(FLOWTIDE_PYTHON_ISOLATION=thread) and in child processes (=process), interleaved (thread,
process, thread, process, ...), and prints both medians and their ratio. The child pool is
started before the run (max_in_flight + 1 children, timed apart as "prestart"), so the
loop figure is the steady-state cost of isolation, not the one-off process starts.

`--traces` (flowtide only) runs the same loop with traces off (no OTLP endpoint: the
default) and on (FLOWTIDE_OTEL_ENDPOINT at a loopback sink that accepts every export),
interleaved, and prints both medians, their ratio and whether the run without an
endpoint imported anything of OpenTelemetry (it must not: off costs nothing). With
`--base-src DIR` (e.g. `git archive COMMIT src | tar -x -C DIR`, then DIR/src), a third
interleaved mode runs the code before traces existed, to compare "off" with it. Each
mode's median CPU seconds are printed too: on a loaded machine they vary less than
throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
PREFECT_VENV = Path(os.environ.get("FLOWTIDE_BENCH_PREFECT_VENV", BENCH_DIR / ".venv-prefect"))
PREFECT_SPEC = "prefect>=3,<4"
# Prefect 3.8.8 (the newest 3.x pip resolves here) declares fastapi>=0.139,<1, but its
# ephemeral server passes Body(min_items=...), which fastapi 0.155.0 removed: the first
# flow run dies in prefect/server/api/concurrency_limits_v2.py with "Body() got an
# unexpected keyword argument 'min_items'". Pin fastapi below that in the throwaway venv.
PREFECT_CONSTRAINTS = ("fastapi<0.155",)
# How long the Prefect client waits for its ephemeral API server (a uvicorn subprocess it
# starts on the first flow call, which also migrates a fresh SQLite database) to answer.
# Prefect's setting `server.ephemeral.startup_timeout_seconds`, environment variable
# PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS (ServerEphemeralSettings in
# prefect/settings/models/server/ephemeral.py; an int, default 20 s). On a busy 2-core
# machine the start took 24-29 s and the comparison failed at the default.
PREFECT_STARTUP_TIMEOUT_S = 120
LOOP_STEP = "square"

GOAL_LOOP_IT_S = 2000.0
GOAL_RATIO = 20.0
GOAL_SCALING_SLACK = 1.2  # t(100k)/t(10k) <= 12: at most 20% worse than linear
GOAL_RSS_MB = 400.0


# -- the workload -----------------------------------------------------------------------


def playbook_text(n: int, max_in_flight: int) -> str:
    """The benchmark playbook for `n` iterations.

    The collection key is `numbers`, not `items`: `{{ start.items }}` resolves to the
    dict method in Jinja, not to the key.
    """
    return textwrap.dedent(
        f"""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata:
          name: bench_loop
          path: bench/loop
        workload:
          n: {n}
        workflow:
          - step: start
            tool:
              kind: python
              input: {{n: "{{{{ workload.n }}}}"}}
              code: |
                result = {{"numbers": list(range(n))}}
            next: [{LOOP_STEP}]
          - step: {LOOP_STEP}
            loop:
              in: "{{{{ start.numbers }}}}"
              iterator: item
              spec: {{mode: parallel, max_in_flight: {max_in_flight}}}
            tool:
              kind: python
              input: {{item: "{{{{ iter.item }}}}"}}
              code: |
                result = {{"i": item, "sq": item * item}}
            next: [end]
          - step: end
            tool:
              kind: python
              input: {{stats: "{{{{ {LOOP_STEP}.stats }}}}"}}
              code: |
                result = {{"stats": stats}}
        """
    )


def expected_results(n: int) -> list[dict[str, int]]:
    return [{"i": i, "sq": i * i} for i in range(n)]


def check_doc(steps: dict[str, Any], final: Any, n: int) -> None:
    """Raise unless the loop produced exactly n results in index order."""
    loop_result = steps[LOOP_STEP]
    results = loop_result["results"]
    if len(results) != n:
        raise AssertionError(f"loop produced {len(results)} results, expected {n}")
    if results != expected_results(n):
        bad = next(
            i for i, (a, b) in enumerate(zip(results, expected_results(n), strict=True)) if a != b
        )
        raise AssertionError(
            f"loop result {bad} is {results[bad]!r}, expected {expected_results(n)[bad]!r}"
        )
    stats = loop_result["stats"]
    if stats != {"total": n, "success": n, "failed": 0}:
        raise AssertionError(f"loop stats {stats!r}")
    if final != {"stats": stats}:
        raise AssertionError(f"end step result {final!r}")


def loop_span(db: Path, execution_id: int) -> dict[str, Any]:
    """Loop timing and event counts read straight from the SQLite event log."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        times = dict(
            conn.execute(
                "SELECT type, time FROM event WHERE execution_id = ? AND step = ? "
                "AND type IN ('loop.started', 'loop.done')",
                (execution_id, LOOP_STEP),
            ).fetchall()
        )
        items = conn.execute(
            "SELECT COUNT(*) FROM event WHERE execution_id = ? AND type = 'loop.item'",
            (execution_id,),
        ).fetchone()[0]
        total, first, last = conn.execute(
            "SELECT COUNT(*), MIN(time), MAX(time) FROM event WHERE execution_id = ?",
            (execution_id,),
        ).fetchone()
    finally:
        conn.close()
    return {
        "loop_s": times["loop.done"] - times["loop.started"],
        "loop_item_events": items,
        "events": total,
        "first_event_time": first,
        "last_event_time": last,
        "db_bytes": sum(p.stat().st_size for p in db.parent.glob(db.name + "*")),
    }


def maxrss_mb(usage: resource.struct_rusage | None = None) -> float:
    usage = usage or resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_maxrss / 1024  # Linux: kilobytes


# -- child: flowtide in-process -----------------------------------------------------------


def child_embedded(
    n: int, max_in_flight: int, profile: bool = False, isolation: str | None = None
) -> dict[str, Any]:
    """Run the playbook in this process; return figures (and profiles when asked)."""
    if isolation is not None:
        os.environ["FLOWTIDE_PYTHON_ISOLATION"] = isolation
    t_import = time.perf_counter()
    import asyncio

    from flowtide.credentials import CredentialVault
    from flowtide.documents.execution import intact as execution_document
    from flowtide.playbook.loader import load_playbook
    from flowtide.runtime.local import LocalRuntime
    from flowtide.store.sqlite import SQLiteStore

    import_s = time.perf_counter() - t_import
    prestart_s = 0.0
    if isolation == "process":
        from flowtide.tools.registry import get_tool

        t_pre = time.perf_counter()
        get_tool("python").pool().prestart(max_in_flight + 1)
        prestart_s = time.perf_counter() - t_pre

    profiles: list[Any] = []
    if profile:
        profiles = _install_worker_profiler(LocalRuntime)

    with tempfile.TemporaryDirectory(prefix="flowtide-bench-loop-") as tmp:
        home = Path(tmp) / ".flowtide"
        home.mkdir()
        pb_file = Path(tmp) / "bench_loop.yaml"
        pb_file.write_text(playbook_text(n, max_in_flight), encoding="utf-8")
        db = home / "flowtide.db"
        store = SQLiteStore(db)
        timings: dict[str, float] = {}

        async def main() -> dict[str, Any]:
            async with LocalRuntime(store, credentials=CredentialVault(store, home)) as runtime:
                playbook = load_playbook(pb_file)
                timings["rss_before_mb"] = maxrss_mb()
                t0 = time.perf_counter()
                eid = await runtime.start(playbook)
                state = await runtime.wait(eid)
                timings["run_s"] = time.perf_counter() - t0
                timings["execution_id"] = eid
                return execution_document(state)

        engine_prof = None
        if profile:
            import cProfile

            engine_prof = cProfile.Profile()
            engine_prof.enable()
        try:
            doc = asyncio.run(main())
        finally:
            if engine_prof is not None:
                engine_prof.disable()
            store.close()
        peak = maxrss_mb()
        if doc["status"] != "completed":
            raise AssertionError(f"run {doc['status']}: {doc['error']}")
        check_doc({k: v["result"] for k, v in doc["steps"].items()}, doc["result"], n)
        span = loop_span(db, int(timings["execution_id"]))
        if span["loop_item_events"] != n:
            raise AssertionError(
                f"{span['loop_item_events']} loop.item events stored, expected {n}"
            )
    out: dict[str, Any] = {
        "n": n,
        "max_in_flight": max_in_flight,
        "import_s": import_s,
        "prestart_s": prestart_s,
        "run_s": timings["run_s"],
        "rss_before_run_mb": timings["rss_before_mb"],
        "peak_rss_mb": peak,
        "otel_imported": any(m.startswith("opentelemetry") for m in sys.modules),
        **span,
    }
    if profile:
        out["_profiles"] = (engine_prof, profiles)
    return out


def _install_worker_profiler(runtime_cls: Any) -> list[Any]:
    """Profile worker threads too: cProfile only sees the thread that enabled it."""
    import cProfile

    profiles: list[Any] = []
    local = threading.local()
    lock = threading.Lock()
    original = runtime_cls._work

    def _work(self: Any, *args: Any, **kwargs: Any) -> Any:
        prof = getattr(local, "prof", None)
        if prof is None:
            prof = local.prof = cProfile.Profile()
            with lock:
                profiles.append(prof)
        prof.enable()
        try:
            return original(self, *args, **kwargs)
        finally:
            prof.disable()

    runtime_cls._work = _work
    return profiles


# -- parent side ---------------------------------------------------------------------------


def run_measured(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
) -> tuple[int, str, str, float, resource.struct_rusage]:
    """Run `cmd`; return (exit code, stdout, stderr, wall seconds, that child's rusage).

    wait4 gives the rusage of this one child, where RUSAGE_CHILDREN would be the maximum
    over every child reaped so far.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        # A blocking wait4 (no polling loop in this process competing for the 2 cores);
        # a timer kills the child on timeout.
        killer = threading.Timer(timeout, proc.kill) if timeout is not None else None
        if killer is not None:
            killer.start()
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        finally:
            if killer is not None:
                killer.cancel()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (
            proc.returncode,
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
            wall,
            usage,
        )


def measure_embedded(
    n: int, max_in_flight: int, isolation: str | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "embedded",
        "--n",
        str(n),
        "--max-in-flight",
        str(max_in_flight),
        *(["--child-isolation", isolation] if isolation else []),
    ]
    code, out, err, wall, usage = run_measured(cmd, env=env)
    if code != 0:
        raise RuntimeError(f"embedded child failed ({code}):\n{err[-4000:]}")
    figures = json.loads(out.strip().splitlines()[-1])
    figures["process_wall_s"] = wall
    figures["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    figures["peak_rss_mb"] = maxrss_mb(usage)
    figures["loop_it_s"] = n / figures["loop_s"]
    figures["run_it_s"] = n / figures["run_s"]
    return figures


def flowtide_command() -> list[str]:
    script = Path(sys.executable).parent / "flowtide"
    return [str(script)] if script.exists() else [sys.executable, "-m", "flowtide.cli"]


def measure_cli(n: int, max_in_flight: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flowtide-bench-cli-") as tmp:
        pb_file = Path(tmp) / "bench_loop.yaml"
        pb_file.write_text(playbook_text(n, max_in_flight), encoding="utf-8")
        home = Path(tmp) / ".flowtide"
        env = {k: v for k, v in os.environ.items() if k not in ("FLOWTIDE_HOME", "FLOWTIDE_DB")}
        env.update(FLOWTIDE_HOME=str(home), FLOWTIDE_NO_PROGRESS="1")
        cmd = [*flowtide_command(), "run", str(pb_file), "--json"]
        launched = time.time()
        code, out, err, wall, usage = run_measured(cmd, env=env, cwd=Path(tmp))
        rss = maxrss_mb(usage)
        if code != 0:
            raise RuntimeError(f"`flowtide run` exited {code}:\n{err[-4000:]}\n{out[-2000:]}")
        doc = json.loads(out)
        if doc["status"] != "completed":
            raise AssertionError(f"CLI run {doc['status']}: {doc['error']}")
        check_doc({k: v["result"] for k, v in doc["steps"].items()}, doc["result"], n)
        span = loop_span(home / "flowtide.db", int(doc["execution_id"]))
    return {
        "n": n,
        "wall_s": wall,
        "wall_it_s": n / wall,
        "peak_rss_mb": rss,
        "loop_it_s": n / span["loop_s"],
        **span,
        # process start to the first event (imports, store, parse) and last event to exit
        # (report, JSON output, teardown)
        "startup_s": span["first_event_time"] - launched,
        "after_last_event_s": launched + wall - span["last_event_time"],
        "command": " ".join(cmd[:1] + ["run", "FILE", "--json"]),
    }


# -- Prefect ---------------------------------------------------------------------------------

PREFECT_SCRIPT = """
import json, resource, sys, time

t0 = time.perf_counter()
from prefect import flow, task
import prefect
import_s = time.perf_counter() - t0


@task
def square(item):
    return {"i": item, "sq": item * item}


n, out_path, max_workers, calls = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
runner = {}
if max_workers != "default":
    from prefect.task_runners import ThreadPoolTaskRunner

    runner = {"task_runner": ThreadPoolTaskRunner(max_workers=int(max_workers))}


@flow(name="bench-loop", **runner)
def loop_flow(n):
    entered = time.perf_counter()
    items = list(range(n))
    t = time.perf_counter()
    results = square.map(items).result()
    mapped = time.perf_counter()
    return results, entered, mapped - t, mapped


expected = [{"i": i, "sq": i * i} for i in range(n)]
runs = []
for label in ["first"] + [f"warm{i}" for i in range(1, calls)]:
    t = time.perf_counter()
    results, entered, map_s, mapped = loop_flow(n)
    returned = time.perf_counter()
    if results != expected:
        raise SystemExit(f"{label} run: {len(results)} results, not the expected {n} in order")
    # before: flow run creation (on the first call also the ephemeral server start; on
    # later calls it waits on the server still recording the previous run's task runs);
    # after: from the last task result to the flow call returning (finishing the run).
    runs.append({"run": label, "flow_s": returned - t, "map_s": map_s,
                 "before_body_s": entered - t, "after_body_s": returned - mapped})
with open(out_path, "w") as f:
    json.dump({"prefect_version": prefect.__version__, "import_s": import_s, "runs": runs,
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, f)
"""


def prefect_python() -> Path:
    return PREFECT_VENV / "bin" / "python"


def ensure_prefect(log: Any) -> str:
    """Create the throwaway venv with Prefect if it is missing. Returns the version."""
    py = prefect_python()
    # The server module is what the ephemeral API imports: probing it catches a venv
    # whose dependencies drifted (see PREFECT_CONSTRAINTS), not just a missing install.
    probe = [str(py), "-c", "import prefect, prefect.server.api.server; print(prefect.__version__)"]
    if py.exists():
        done = subprocess.run(probe, capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.strip()
    log(
        f"installing '{PREFECT_SPEC}' {' '.join(PREFECT_CONSTRAINTS)} into {PREFECT_VENV} (once; not timed)"
    )
    if not py.exists():
        subprocess.run(["python3", "-m", "venv", str(PREFECT_VENV)], check=True)
    pip = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            PREFECT_SPEC,
            *PREFECT_CONSTRAINTS,
        ],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        raise RuntimeError(f"pip install '{PREFECT_SPEC}' failed:\n{pip.stderr[-4000:]}")
    done = subprocess.run(probe, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"prefect installed but its server does not import:\n{done.stderr[-4000:]}"
        )
    return done.stdout.strip()


def prefect_env(home: Path, startup_timeout: int = PREFECT_STARTUP_TIMEOUT_S) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PREFECT_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ALLOW_EPHEMERAL_MODE="true",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="false",
        DO_NOT_TRACK="1",
        # INFO would print two lines per task run: console output is not the work measured.
        PREFECT_LOGGING_LEVEL="WARNING",
        # See PREFECT_STARTUP_TIMEOUT_S. Only the first flow call waits for it, and that
        # wait is reported apart ("first"), so a longer limit changes no figure.
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=str(startup_timeout),
    )
    return env


class PrefectFailed(RuntimeError):
    """The Prefect process failed: its exit code, wall time and whole output."""

    def __init__(self, code: int, wall: float, stdout: str, stderr: str) -> None:
        super().__init__(
            f"prefect run exited {code} after {wall:.1f}s (its stderr, {len(stderr):,} "
            f"characters, is in the report); last lines:\n{stderr[-2000:]}"
        )
        self.code, self.wall, self.stdout, self.stderr = code, wall, stdout, stderr


def measure_prefect(
    n: int,
    log: Any,
    timeout: float,
    max_workers: int | None = None,
    calls: int = 3,
    startup_timeout: int = PREFECT_STARTUP_TIMEOUT_S,
) -> dict[str, Any]:
    version = ensure_prefect(log)
    with tempfile.TemporaryDirectory(prefix="flowtide-bench-prefect-") as tmp:
        script = Path(tmp) / "prefect_loop.py"
        script.write_text(PREFECT_SCRIPT, encoding="utf-8")
        out_path = Path(tmp) / "out.json"
        home = Path(tmp) / "prefect-home"
        code, out, err, wall, usage = run_measured(
            [
                str(prefect_python()),
                str(script),
                str(n),
                str(out_path),
                str(max_workers or "default"),
                str(calls),
            ],
            env=prefect_env(home, startup_timeout),
            cwd=Path(tmp),
            timeout=timeout,
        )
        rss = maxrss_mb(usage)
        if code != 0 or not out_path.exists():
            raise PrefectFailed(code, wall, out, err)
        data = json.loads(out_path.read_text())
    runs = [r | {"flow_it_s": n / r["flow_s"], "map_it_s": n / r["map_s"]} for r in data["runs"]]
    warm_runs = runs[1:] or runs
    keys = ("flow_s", "map_s", "before_body_s", "after_body_s")
    warm = {k: statistics.median(r[k] for r in warm_runs) for k in keys}
    warm.update(
        run=f"warm (median of {len(warm_runs)})",
        flow_it_s=n / warm["flow_s"],
        map_it_s=n / warm["map_s"],
    )
    return {
        "n": n,
        "version": version,
        "max_workers": max_workers or "default (unbounded)",
        "calls": len(runs),
        "process_wall_s": wall,
        "process_it_s": n * len(runs) / wall,
        "import_s": data["import_s"],
        "peak_rss_mb": rss,
        "runs": runs,
        "first": runs[0],
        "warm": warm,
        "startup_timeout_s": startup_timeout,
    }


# -- reporting ----------------------------------------------------------------------------


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def compare(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    n, mif = args.n, args.max_in_flight
    repeat = args.repeat or 3
    report: dict[str, Any] = {
        "n": n,
        "max_in_flight": mif,
        "repeat": repeat,
        "cpus": os.cpu_count(),
    }

    emb = [measure_embedded(n, mif) for _ in range(repeat)]
    report["embedded"] = {
        "runs": emb,
        "loop_it_s": _median(emb, "loop_it_s"),
        "run_it_s": _median(emb, "run_it_s"),
        "peak_rss_mb": _median(emb, "peak_rss_mb"),
    }
    log(f"flowtide embedded, N={n}, max_in_flight={mif}, {repeat} processes (median):")
    log(
        f"  loop step  {report['embedded']['loop_it_s']:10,.0f} it/s   "
        f"(each: {', '.join(format(r['loop_it_s'], ',.0f') for r in emb)})"
    )
    log(
        f"  whole run  {report['embedded']['run_it_s']:10,.0f} it/s   "
        f"(start() -> terminal, {_median(emb, 'run_s'):.3f}s)"
    )
    log(
        f"  peak RSS   {report['embedded']['peak_rss_mb']:10.1f} MB    "
        f"({_median(emb, 'rss_before_run_mb'):.1f} MB before the run; {emb[0]['events']:,} events, "
        f"{emb[0]['db_bytes'] / 1e6:.1f} MB SQLite)"
    )
    log(
        f"  process    {_median(emb, 'process_wall_s'):10.3f} s wall, {_median(emb, 'process_cpu_s'):.3f} s CPU "
        f"(imports {_median(emb, 'import_s'):.3f} s)"
    )

    if not args.skip_cli:
        cli = [measure_cli(n, mif) for _ in range(repeat)]
        report["cli"] = {
            "runs": cli,
            "wall_s": _median(cli, "wall_s"),
            "wall_it_s": _median(cli, "wall_it_s"),
            "startup_s": _median(cli, "startup_s"),
            "after_last_event_s": _median(cli, "after_last_event_s"),
            "loop_it_s": _median(cli, "loop_it_s"),
            "peak_rss_mb": _median(cli, "peak_rss_mb"),
            "command": cli[0]["command"],
        }
        log(f"flowtide CLI `{cli[0]['command']}`, N={n} (median of {repeat}):")
        log(
            f"  end to end {report['cli']['wall_it_s']:10,.0f} it/s   ({report['cli']['wall_s']:.3f}s: "
            f"{report['cli']['startup_s']:.3f}s process start to first event, "
            f"{report['cli']['after_last_event_s']:.3f}s last event to exit)"
        )
        log(f"  loop step  {report['cli']['loop_it_s']:10,.0f} it/s")
        log(f"  peak RSS   {report['cli']['peak_rss_mb']:10.1f} MB")

    if args.skip_prefect:
        log("Prefect: skipped (--skip-prefect)")
    else:
        try:
            pf = measure_prefect(
                n,
                log,
                args.prefect_timeout,
                args.prefect_max_workers,
                args.prefect_calls,
                args.prefect_startup_timeout,
            )
        except PrefectFailed as exc:
            # Prefect's whole stderr: the reason is often far from its last lines (a
            # start-up timeout comes after pages of the ephemeral server's log).
            report["prefect"] = {
                "error": f"prefect run exited {exc.code} after {exc.wall:.1f}s",
                "exit_code": exc.code,
                "wall_s": exc.wall,
                "stderr": exc.stderr,
                "stdout": exc.stdout,
            }
            log(f"Prefect: could not run: prefect run exited {exc.code} after {exc.wall:.1f}s")
            log("Prefect's stderr:")
            log(textwrap.indent(exc.stderr.rstrip() or "(empty)", "  | "))
        except Exception as exc:  # noqa: BLE001 - report why, keep the flowtide figures
            report["prefect"] = {"error": f"{type(exc).__name__}: {exc}"}
            log(f"Prefect: could not run: {type(exc).__name__}: {exc}")
        else:
            report["prefect"] = pf
            log(
                f"Prefect {pf['version']} (@task.map, ThreadPoolTaskRunner max_workers={pf['max_workers']}, "
                f"ephemeral API), N={n}:"
            )
            for r in [*pf["runs"], pf["warm"]]:
                log(
                    f"  {r['run']:>20s}: flow {r['flow_it_s']:6,.0f} it/s ({r['flow_s']:.2f}s = "
                    f"{r['before_body_s']:.2f}s before the flow body + {r['map_s']:.2f}s map section "
                    f"({r['map_it_s']:,.0f} it/s) + {r['after_body_s']:.2f}s after it)"
                )
            log(
                f"  {'process':>20s}: {pf['process_it_s']:6,.0f} it/s ({pf['process_wall_s']:.2f}s for "
                f"{pf['calls']} x {n} iterations, incl. import {pf['import_s']:.2f}s and the ephemeral server start)"
            )
            log(
                f"  {'peak RSS':>20s}: {pf['peak_rss_mb']:.1f} MB (client process; the ephemeral server is a child)"
            )
            e = report["embedded"]
            ratios = {
                "loop_vs_warm_map": e["loop_it_s"] / pf["warm"]["map_it_s"],
                "run_vs_warm_flow": e["run_it_s"] / pf["warm"]["flow_it_s"],
                "run_vs_first_flow": e["run_it_s"] / pf["first"]["flow_it_s"],
            }
            if "cli" in report:
                ratios["cli_vs_prefect_process"] = report["cli"]["wall_it_s"] / pf["process_it_s"]
            report["ratios"] = ratios
            log("ratio flowtide / Prefect:")
            log(f"  loop step vs warm map section   {ratios['loop_vs_warm_map']:8.1f}x")
            log(f"  whole run vs warm flow call     {ratios['run_vs_warm_flow']:8.1f}x")
            log(f"  whole run vs first flow call    {ratios['run_vs_first_flow']:8.1f}x")
            if "cli_vs_prefect_process" in ratios:
                log(
                    f"  CLI process vs Prefect process  {ratios['cli_vs_prefect_process']:8.1f}x "
                    "(iterations per second of process wall time, start-up included)"
                )

    goals = {
        f"loop >= {GOAL_LOOP_IT_S:.0f} it/s": report["embedded"]["loop_it_s"] >= GOAL_LOOP_IT_S
    }
    if "ratios" in report:
        goals[f"ratio >= {GOAL_RATIO:.0f}x (loop vs warm map)"] = (
            report["ratios"]["loop_vs_warm_map"] >= GOAL_RATIO
        )
        goals[f"ratio >= {GOAL_RATIO:.0f}x (run vs warm flow)"] = (
            report["ratios"]["run_vs_warm_flow"] >= GOAL_RATIO
        )
    report["goals"] = goals
    log("goals: " + "; ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in goals.items()))
    return report


def scaling(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    repeat = args.repeat or 1
    sizes = args.scaling_n
    rows: dict[int, dict[str, Any]] = {}
    for n in sizes:
        runs = [measure_embedded(n, args.max_in_flight) for _ in range(repeat)]
        rows[n] = {
            "runs": runs,
            "loop_s": _median(runs, "loop_s"),
            "run_s": _median(runs, "run_s"),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "events": runs[0]["events"],
            "db_bytes": runs[0]["db_bytes"],
        }
        r = rows[n]
        log(
            f"N={n:>7,}: loop {r['loop_s']:7.2f}s ({n / r['loop_s']:6,.0f} it/s)  run {r['run_s']:7.2f}s "
            f"({n / r['run_s']:6,.0f} it/s)  CPU {_median(runs, 'process_cpu_s'):6.1f}s  peak RSS {r['peak_rss_mb']:6.1f} MB  "
            f"{r['events']:,} events, SQLite {r['db_bytes'] / 1e6:.0f} MB"
        )
    report: dict[str, Any] = {
        "max_in_flight": args.max_in_flight,
        "repeat": repeat,
        "sizes": {str(k): v for k, v in rows.items()},
    }
    if len(sizes) >= 2:
        small, big = sizes[0], sizes[-1]
        ratio_loop = rows[big]["loop_s"] / rows[small]["loop_s"]
        ratio_run = rows[big]["run_s"] / rows[small]["run_s"]
        report.update(
            small=small,
            big=big,
            time_ratio_loop=ratio_loop,
            time_ratio_run=ratio_run,
            big_peak_rss_mb=rows[big]["peak_rss_mb"],
        )
        ideal = big / small
        goal = GOAL_SCALING_SLACK * ideal
        report["goal_time_ratio"] = goal
        log(
            f"t({big:,})/t({small:,}): loop {ratio_loop:.2f}, run {ratio_run:.2f} (linear = {ideal:g}; "
            f"goal <= {goal:g}: {'met' if ratio_run <= goal else 'NOT met'})"
        )
        log(
            f"peak RSS at N={big:,}: {rows[big]['peak_rss_mb']:.1f} MB (goal <= {GOAL_RSS_MB:.0f}: "
            f"{'met' if rows[big]['peak_rss_mb'] <= GOAL_RSS_MB else 'NOT met'})"
        )
    return report


GOAL_ISOLATION_RATIO = 0.8  # process isolation keeps at least 80% of in-process throughput


def isolation(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    n, mif = args.n, args.max_in_flight
    repeat = args.repeat or 5
    runs: dict[str, list[dict[str, Any]]] = {"thread": [], "process": []}
    for i in range(repeat):
        for mode in ("thread", "process"):
            r = measure_embedded(n, mif, isolation=mode)
            runs[mode].append(r)
            log(
                f"  {i + 1}/{repeat} {mode:>7}: loop {r['loop_it_s']:6,.0f} it/s, run"
                f" {r['run_it_s']:6,.0f} it/s, prestart {r['prestart_s']:.2f}s,"
                f" CPU {r['process_cpu_s']:.2f}s (load {_load()})"
            )
    report: dict[str, Any] = {"n": n, "max_in_flight": mif, "repeat": repeat}
    for mode, rows in runs.items():
        report[mode] = {
            "runs": rows,
            "loop_it_s": _median(rows, "loop_it_s"),
            "run_it_s": _median(rows, "run_it_s"),
            "prestart_s": _median(rows, "prestart_s"),
        }
    ratio = report["process"]["loop_it_s"] / report["thread"]["loop_it_s"]
    report["ratio_loop"] = ratio
    report["goal_met"] = ratio >= GOAL_ISOLATION_RATIO
    log(f"python steps, N={n:,}, max_in_flight={mif}, medians of {repeat} interleaved runs:")
    for mode, label in (("thread", "in-process"), ("process", "child processes")):
        r = report[mode]
        log(
            f"  {label:>16}: loop {r['loop_it_s']:6,.0f} it/s, whole run {r['run_it_s']:6,.0f}"
            f" it/s"
            + (f" (+ {r['prestart_s']:.2f}s to start the children)" if mode == "process" else "")
        )
    log(
        f"  process / in-process: {ratio:.2f} (goal >= {GOAL_ISOLATION_RATIO}:"
        f" {'met' if report['goal_met'] else 'NOT met'})"
    )
    return report


def _sink() -> tuple[str, Any]:
    """An OTLP/HTTP endpoint on loopback that accepts (and drops) every export."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def traces(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    n, mif = args.n, args.max_in_flight
    repeat = args.repeat or 5
    url, server = _sink()
    base = {k: v for k, v in os.environ.items() if "OTEL" not in k}
    envs = {"off": base, "on": {**base, "FLOWTIDE_OTEL_ENDPOINT": url}}
    if args.base_src:
        envs["before"] = {**base, "PYTHONPATH": str(Path(args.base_src).resolve())}
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in envs}
    try:
        for i in range(repeat):
            for mode in envs:
                r = measure_embedded(n, mif, env=envs[mode])
                runs[mode].append(r)
                log(
                    f"  {i + 1}/{repeat} traces {mode:>6}: loop {r['loop_it_s']:6,.0f} it/s,"
                    f" run {r['run_it_s']:6,.0f} it/s, CPU {r['process_cpu_s']:.2f}s"
                    f" (load {_load()})"
                )
    finally:
        server.shutdown()
    report: dict[str, Any] = {"n": n, "max_in_flight": mif, "repeat": repeat}
    for mode, rows in runs.items():
        report[mode] = {
            "runs": rows,
            "loop_it_s": _median(rows, "loop_it_s"),
            "run_it_s": _median(rows, "run_it_s"),
            "process_cpu_s": _median(rows, "process_cpu_s"),
            "otel_imported": any(r.get("otel_imported", False) for r in rows),
        }
    report["ratio_run"] = report["on"]["run_it_s"] / report["off"]["run_it_s"]
    log(f"traces, N={n:,}, max_in_flight={mif}, medians of {repeat} interleaved runs:")
    for mode in envs:
        r = report[mode]
        log(
            f"  {mode:>6}: loop {r['loop_it_s']:6,.0f} it/s, whole run {r['run_it_s']:6,.0f} it/s,"
            f" CPU {r['process_cpu_s']:.2f}s,"
            f" OpenTelemetry imported: {'yes' if r['otel_imported'] else 'no'}"
        )
    log(f"  on / off (whole run): {report['ratio_run']:.2f}")
    if "before" in report:
        report["ratio_off_before"] = report["off"]["run_it_s"] / report["before"]["run_it_s"]
        log(f"  off / before traces (whole run): {report['ratio_off_before']:.2f}")
    return report


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/src/", "/lib/python3."):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." else tail
    return path


def _top(stats: Any, key: str, limit: int, n: int) -> list[dict[str, Any]]:
    rows = []
    for (file, line, func), (_cc, calls, tt, ct, _callers) in stats.stats.items():
        rows.append(
            {
                "function": f"{_short(file)}:{line}({func})" if line else func,
                "calls": calls,
                "tottime": tt,
                "cumtime": ct,
                "us_per_iteration": (tt if key == "tottime" else ct) / n * 1e6,
            }
        )
    rows.sort(key=lambda r: r[key], reverse=True)
    return rows[:limit]


def profile(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    import pstats

    n = args.profile_n
    figures = child_embedded(n, args.max_in_flight, profile=True)
    engine_prof, worker_profs = figures.pop("_profiles")
    log(
        f"cProfile, N={n:,}, max_in_flight={args.max_in_flight}: loop {figures['loop_s']:.2f}s, "
        f"run {figures['run_s']:.2f}s under the profiler ({len(worker_profs)} worker threads profiled)"
    )
    report: dict[str, Any] = {"n": n, "figures": figures}
    groups = {
        "engine thread (asyncio loop: apply, decide, store, dispatch)": pstats.Stats(engine_prof)
    }
    if worker_profs:
        groups["worker threads (StepRunner.run + posting events)"] = pstats.Stats(*worker_profs)
    for title, stats in groups.items():
        report[title] = {}
        for key in ("cumtime", "tottime"):
            top = _top(stats, key, args.profile_top, n)
            report[title][key] = top
            log(f"\n{title}, top {len(top)} by {key} (µs per iteration = {key} / N):")
            log(f"  {'calls':>9} {'tottime':>8} {'cumtime':>8} {'µs/it':>7}  function")
            for r in top:
                log(
                    f"  {r['calls']:9,} {r['tottime']:8.3f} {r['cumtime']:8.3f} {r['us_per_iteration']:7.1f}  "
                    f"{r['function']}"
                )
    if args.profile_out:
        out = Path(args.profile_out)
        out.mkdir(parents=True, exist_ok=True)
        engine_prof.dump_stats(out / "engine.prof")
        if worker_profs:
            pstats.Stats(*worker_profs).dump_stats(out / "workers.prof")
        log(f"\nraw profiles: {out}/engine.prof, {out}/workers.prof (open with `python -m pstats`)")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument("--n", type=int, default=1000, help="loop iterations (default 1000)")
    parser.add_argument("--max-in-flight", type=int, default=16)
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="processes per flowtide measurement, median reported (default 3; 1 for --scaling)",
    )
    parser.add_argument("--skip-prefect", action="store_true")
    parser.add_argument(
        "--skip-cli", action="store_true", help="do not time `flowtide run` end to end"
    )
    parser.add_argument("--prefect-timeout", type=float, default=1800.0)
    parser.add_argument(
        "--prefect-startup-timeout",
        type=int,
        default=PREFECT_STARTUP_TIMEOUT_S,
        help="seconds Prefect waits for its ephemeral API server to start"
        f" (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS; default {PREFECT_STARTUP_TIMEOUT_S},"
        " Prefect's own is 20)",
    )
    parser.add_argument(
        "--prefect-calls",
        type=int,
        default=3,
        help="flow calls in the Prefect process: the first, then warm ones (default 3)",
    )
    parser.add_argument(
        "--prefect-max-workers",
        type=int,
        default=None,
        help="ThreadPoolTaskRunner(max_workers=K) instead of Prefect's default (unbounded)",
    )
    parser.add_argument(
        "--scaling", action="store_true", help="flowtide only: N=10,000 and 100,000"
    )
    parser.add_argument("--scaling-n", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument(
        "--profile", action="store_true", help="cProfile a flowtide run (engine + workers)"
    )
    parser.add_argument("--profile-n", type=int, default=10_000)
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--profile-out", help="also write engine.prof and workers.prof here")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document instead of text"
    )
    parser.add_argument(
        "--isolation",
        action="store_true",
        help="flowtide only: python steps in-process vs in child processes, interleaved",
    )
    parser.add_argument(
        "--traces",
        action="store_true",
        help="flowtide only: traces off (no endpoint) vs on (a loopback sink), interleaved",
    )
    parser.add_argument(
        "--base-src", help="with --traces: also run the flowtide package under this folder"
    )
    parser.add_argument("--child", choices=["embedded"], help=argparse.SUPPRESS)
    parser.add_argument("--child-isolation", choices=["thread", "process"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child == "embedded":
        figures = child_embedded(args.n, args.max_in_flight, isolation=args.child_isolation)
        print(json.dumps(figures))
        return

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
    }
    log(
        f"python {report['python']}, {report['cpus']} CPUs, load average {_load()} (other work on the "
        "machine shows up as noise: compare medians)"
    )
    if args.scaling:
        report["scaling"] = scaling(args, log)
    if args.isolation:
        report["isolation"] = isolation(args, log)
    if args.traces:
        report["traces"] = traces(args, log)
    if args.profile:
        report["profile"] = profile(args, log)
    if not args.scaling and not args.profile and not args.isolation and not args.traces:
        report["compare"] = compare(args, log)
    report["loadavg_after"] = os.getloadavg()
    log(f"load average after: {_load()}")
    if args.json:
        print(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
