"""Scheduler lag: from a slot's time to its execution being created (issue 30; goal p99
<= 1 s; Airflow's scheduler loop is seconds, Temporal's schedules fire within ~1 s).

    .venv/bin/python bench/triggers.py [--minute 1000] [--second 20] [--stack]
    .venv/bin/python bench/hooks.py    (webhook accept latency: its own script)

Embedded (default): `flowtide scheduler`'s loop in this process over a fresh SQLite
store, with --minute schedules firing every minute (cron `* * * * *`, all at the same
instant) and --second schedules firing every second, through one minute boundary (about
70 s of real time). Each run is a one-step noop playbook. The lag of a run is its
execution row's `created` minus its slot; p50, p99 and max are printed per kind.

--stack: the same on `flowtide dev up`'s distributed stack (a server firing its shard's
schedules, workers running the runs), read back from its database.

The machine's load is printed with the figures (a shared machine is noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: tick, path: bench/tick}
workflow:
  - step: start
    tool: {kind: noop}
"""
GOAL_P99 = 1.0


def _slot(key: str) -> float:
    return datetime.datetime.fromisoformat(key.replace("Z", "+00:00")).timestamp()


def _quantiles(values: list[float]) -> str:
    if not values:
        return "no runs"
    values = sorted(values)
    p = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return (
        f"n={len(values)} p50={statistics.median(values) * 1000:.0f} ms"
        f" p99={p(0.99) * 1000:.0f} ms max={values[-1] * 1000:.0f} ms"
    )


def _define(store: Any, minute: int, second: int) -> None:
    from flowtide.ids import default_generator
    from flowtide.triggers.schedules import define_schedule, schedule_from_fields

    ids = default_generator()
    store.register_playbook("bench/tick", PLAYBOOK, source_file=None, created=time.time())
    now = time.time()
    for i in range(minute):
        spec = schedule_from_fields(
            f"m{i:04}", {"playbook": "bench/tick", "cron": "* * * * *", "overlap": "allow"}
        )
        define_schedule(store, spec, new_id=ids.next_id, now=now, local=True)
    for i in range(second):
        spec = schedule_from_fields(
            f"s{i:02}", {"playbook": "bench/tick", "every": "1s", "overlap": "allow"}
        )
        define_schedule(store, spec, new_id=ids.next_id, now=now, local=True)


def _lags(rows: list[Any]) -> tuple[list[float], list[float]]:
    minute, second = [], []
    for row in rows:
        trigger = row.trigger
        if not trigger or trigger["kind"] != "schedule":
            continue
        lag = row.created - _slot(trigger["slot"])
        (minute if trigger["name"].startswith("m") else second).append(lag)
    return minute, second


async def _embedded(home: Path, minute: int, second: int) -> tuple[list[float], list[float]]:
    from flowtide.runlock import run_locks_for
    from flowtide.store.sqlite import SQLiteStore
    from flowtide.triggers.scheduler import Scheduler
    from flowtide.ui.fold import FoldCache
    from flowtide.ui.reads import LocalReads
    from flowtide.web.schedules import ReadsFirer

    store = SQLiteStore(home / "flowtide.db")
    _define(store, minute, second)
    # Through the next minute boundary, and 5 s more for the runs to be created.
    boundary = (time.time() // 60 + 1) * 60
    if boundary - time.time() < 5:
        boundary += 60
    until = boundary + 5
    print(
        f"firing until {datetime.datetime.fromtimestamp(until):%H:%M:%S} "
        f"({until - time.time():.0f} s)",
        flush=True,
    )
    reads = LocalReads(store, FoldCache(store), home, run_locks_for(store, home))
    async with reads.open():
        scheduler = Scheduler(ReadsFirer(reads))
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(until - time.time())
        scheduler.stop()
        await task
    rows = store.list_executions(limit=100_000, created_since=boundary - 60)
    store.close()
    return _lags(rows)


def _stack(home: Path, minute: int, second: int) -> tuple[list[float], list[float]]:
    """The same on `flowtide dev up`'s stack: schedules added over the API, the server's
    scheduler firing them, the runs read back through the list (paged)."""
    from flowtide.dev.postgres import free_port
    from flowtide.dev.stack import DevStack

    stack = DevStack(home)
    stack.up(
        workers=2,
        concurrency=16,
        progress=lambda line: print(f"  {line}", flush=True),
        timeout=180.0,
        server_port=free_port(),
        nats_port=free_port(),
        pg_port=free_port(),
    )
    try:
        api = stack.admin_client(timeout=60.0)
        api.post("/api/catalog/register", json={"content": PLAYBOOK}).raise_for_status()
        kinds = [(f"m{i:04}", {"cron": "* * * * *"}) for i in range(minute)]
        kinds += [(f"s{i:02}", {"every": "1s"}) for i in range(second)]
        for name, when in kinds:
            body = {"name": name, "playbook": "bench/tick", "overlap": "allow", **when}
            api.post("/api/schedules", json=body).raise_for_status()
        boundary = (time.time() // 60 + 1) * 60
        if boundary - time.time() < 8:
            boundary += 60
        until = boundary + 5
        print(
            f"firing until {datetime.datetime.fromtimestamp(until):%H:%M:%S} "
            f"({until - time.time():.0f} s)",
            flush=True,
        )
        seen: dict[tuple[str, str], float] = {}
        watch = threading.Thread(target=_watch, args=(stack.db_url, boundary - 60, until, seen))
        watch.start()
        time.sleep(until - time.time())
        watch.join()
        for name, _ in kinds:
            api.post(f"/api/schedules/{name}/pause").raise_for_status()
        minute_lags: list[float] = []
        second_lags: list[float] = []
        before: str | None = None
        while True:
            params: dict[str, Any] = {"trigger": "schedule", "limit": 1000, "since": boundary - 60}
            if before:
                params["before"] = before
            page = api.get("/api/executions", params=params).json()
            for item in page["items"]:
                lag = item["created"] - _slot(item["trigger"]["slot"])
                (minute_lags if item["trigger"]["name"].startswith("m") else second_lags).append(
                    lag
                )
            before = page["next_before"]
            if not before:
                break
        _claimed(stack.db_url, boundary - 60)
        print(f"dev stack, created stamp, every minute: {_quantiles(minute_lags)}")
        print(f"dev stack, created stamp, every second: {_quantiles(second_lags)}")
        visible = {k: t - _slot(k[1]) for k, t in seen.items()}
        # The figures below (and the goal): when the run is committed, seen by a reader.
        return (
            [v for k, v in visible.items() if k[0].startswith("m")],
            [v for k, v in visible.items() if k[0].startswith("s")],
        )
    finally:
        stack.down(purge=True)


def _watch(dsn: str, since: float, until: float, seen: dict[tuple[str, str], float]) -> None:
    """Poll the database every 10 ms until `until`: when each scheduled run's row is
    first visible to a reader, i.e. committed (its `created` is stamped before)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.time() < until:
            # A row is stamped `created` before its commit, by less than a few seconds:
            # the last 10 s of rows hold every one not yet seen.
            rows = conn.execute(
                "SELECT trigger_name, trigger_key FROM execution"
                " WHERE trigger_kind = 'schedule' AND created >= %s",
                (max(since, time.time() - 10),),
            ).fetchall()
            now = time.time()
            for name, key in rows:
                seen.setdefault((name, key), now)
            time.sleep(0.01)


def _claimed(dsn: str, since: float) -> None:
    """A run's `created` is stamped before its transaction commits: print also when a
    worker first claimed a command of each run (after the commit and the publish: an
    upper bound of when the run became visible)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT x.trigger_name, x.trigger_key, min(e.time) FROM execution x"
            " JOIN event e ON e.execution_id = x.execution_id AND e.type = 'command.claimed'"
            " WHERE x.trigger_kind = 'schedule' AND x.created >= %s GROUP BY 1, 2",
            (since,),
        ).fetchall()
    minute = [t - _slot(key) for name, key, t in rows if name.startswith("m")]
    second = [t - _slot(key) for name, key, t in rows if not name.startswith("m")]
    print(f"dev stack, first command claimed, every minute: {_quantiles(minute)}")
    print(f"dev stack, first command claimed, every second: {_quantiles(second)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minute", type=int, default=1000)
    parser.add_argument("--second", type=int, default=20)
    parser.add_argument("--stack", action="store_true", help="on `flowtide dev up`'s stack")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f} (cpus {os.cpu_count()})")
    where = "dev stack" if args.stack else "embedded"
    with tempfile.TemporaryDirectory(prefix="flowtide-bench-triggers-") as tmp:
        if args.stack:
            Path(tmp).chmod(0o755)  # PostgreSQL runs as its own user: it must reach the folder
            minute, second = _stack(Path(tmp), args.minute, args.second)
        else:
            minute, second = asyncio.run(_embedded(Path(tmp), args.minute, args.second))
    print(f"load after:  {os.getloadavg()[0]:.2f}")
    print(f"{where}, {args.minute} schedules every minute: {_quantiles(minute)}")
    print(f"{where}, {args.second} schedules every second: {_quantiles(second)}")
    lags = sorted(minute + second)
    p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else float("inf")
    worst = lags[-1] if lags else float("inf")
    print(
        f"goal p99 <= {GOAL_P99:.1f} s: {'met' if p99 <= GOAL_P99 else 'not met'} "
        f"(p99 {p99 * 1000:.0f} ms, max {worst * 1000:.0f} ms)"
    )


if __name__ == "__main__":
    main()
