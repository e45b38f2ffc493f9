"""How fast the web UI opens an execution with a big loop (issue 19: a 100,000-iteration
loop's page in under 2 s), on `flowtide ui` over the local store.

    .venv/bin/python bench/ui.py [--iterations 100000] [--runs 5]

1. `flowtide run` makes one execution of bench/loop.py's playbook (a parallel python loop
   of --iterations) in a fresh home under /tmp.
2. `flowtide ui` serves that home; the API's documents are timed: the summary the
   execution page reads (from the summary `flowtide run` kept as the run ended; and,
   as the baseline, with that summary deleted: the first request folds the whole log),
   the first page of events, the list.
3. Debian's Chromium (Playwright) opens the execution's page: the time from navigation to
   the page showing the run completed with its loop's count (`progress-bar` data-total),
   for a fresh `flowtide ui` with the kept summary and without it (alternating), and
   again (warm), --runs each.

The goal is printed with met / not met. Medians of --runs; the machine's load is printed
with the figures (a shared machine is noisy).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(ROOT / "tests"))

from loop import playbook_text  # noqa: E402

GOAL_PAGE_S = 2.0


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTIDE_")}
    env["FLOWTIDE_HOME"] = str(home)
    env["FLOWTIDE_NO_PROGRESS"] = "1"
    return env


def _flowtide(*args: str) -> list[str]:
    return [sys.executable, "-m", "flowtide.cli", *args]


class Ui:
    """A `flowtide ui` process over `home`."""

    def __init__(self, home: Path) -> None:
        self.log = home / "ui.out"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                _flowtide("ui", "--port", "0"),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_env(home),
            )
        deadline = time.monotonic() + 60
        while True:
            found = re.search(r"open (http://\S+/ui)#token=(\S+)", self.log.read_text())
            if found:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"flowtide ui did not start:\n{self.log.read_text()}")
            time.sleep(0.1)
        self.url, self.token = found[1], found[2]
        self.base = self.url.removesuffix("/ui")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _timed(call: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = call()
    return time.perf_counter() - t0, value


def _api_figures(ui: Ui, eid: str, runs: int) -> dict[str, Any]:
    import httpx

    headers = {"authorization": f"Bearer {ui.token}"}
    with httpx.Client(base_url=ui.base, headers=headers, timeout=300) as api:
        path = f"/api/executions/{eid}/summary"
        cold, r = _timed(lambda: api.get(path))
        r.raise_for_status()
        size = len(r.content)
        warm = [_timed(lambda: api.get(path))[0] for _ in range(runs)]
        events = [
            _timed(lambda: api.get(f"/api/executions/{eid}/events", params={"limit": 500}))[0]
            for _ in range(runs)
        ]
        listing = [_timed(lambda: api.get("/api/executions"))[0] for _ in range(runs)]
    return {
        "summary_cold_s": cold,
        "summary_warm_s": statistics.median(warm),
        "summary_bytes": size,
        "events_page_s": statistics.median(events),
        "list_s": statistics.median(listing),
    }


def _page_open(browser: Any, ui: Ui, eid: str, total: int) -> float:
    """Seconds from navigation to the page showing the run completed with its loop."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(120_000)
        # Signed in first (its own page load), so the timed load is the execution's.
        page.goto(f"{ui.url}#token={ui.token}")
        page.get_by_test_id("user-name").wait_for()
        t0 = time.perf_counter()
        page.goto(f"{ui.url}/executions/{eid}")
        page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for()
        page.locator(f'[data-testid="progress-bar"][data-total="{total}"]').wait_for()
        page.locator('[data-testid="graph-node"]').first.wait_for()
        return time.perf_counter() - t0
    finally:
        context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from browser import chromium

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="flowtide-bench-ui-") as tmp:
        home = Path(tmp) / "home"
        playbook = Path(tmp) / "loop.yaml"
        playbook.write_text(playbook_text(args.iterations, 16))
        t, run = _timed(
            lambda: subprocess.run(
                _flowtide("run", str(playbook), "--json"),
                capture_output=True,
                text=True,
                env=_env(home),
                timeout=3600,
            )
        )
        if run.returncode != 0:
            raise SystemExit(f"flowtide run failed:\n{run.stderr[-2000:]}")
        import json

        eid = str(json.loads(run.stdout)["execution_id"])
        print(f"{args.iterations:,}-iteration loop run embedded in {t:.1f} s (execution {eid})")
        db = home / "flowtide.db"
        kept = _kept_summary(db, eid)
        if kept is None:
            raise SystemExit("flowtide run kept no summary of the run")
        # Alternating: a fresh `flowtide ui` opening the page with the summary kept when
        # the run ended (what a user gets), and without it (the fold of the log: the
        # baseline, as before summaries were kept), --runs rounds each.
        pages: dict[str, list[float]] = {"kept": [], "fold": []}
        warm_pages: list[float] = []
        figures: dict[str, Any] = {}
        with chromium() as browser:
            for i in range(args.runs):
                for mode in ("kept", "fold"):
                    _set_kept_summary(db, eid, kept if mode == "kept" else None)
                    ui = Ui(home)
                    try:
                        if i == 0:
                            figures[mode] = _api_figures(ui, eid, args.runs)
                            ui.close()
                            ui = Ui(home)
                        pages[mode].append(_page_open(browser, ui, eid, args.iterations))
                        if mode == "kept":
                            warm_pages.append(_page_open(browser, ui, eid, args.iterations))
                    finally:
                        ui.close()
            _set_kept_summary(db, eid, kept)
        print("API (flowtide ui, local store):")
        for mode, label in (("kept", "kept summary"), ("fold", "none kept: the fold")):
            f = figures[mode]
            print(f"  summary, first request, {label:<20}{f['summary_cold_s']:8.3f} s")
        f = figures["kept"]
        print(
            f"  summary, later requests (median)       {f['summary_warm_s'] * 1000:8.1f} ms"
            f"  ({f['summary_bytes']:,} bytes)"
        )
        print(f"  500 events (median)                    {f['events_page_s'] * 1000:8.1f} ms")
        print(f"  executions list (median)               {f['list_s'] * 1000:8.1f} ms")
        cold = statistics.median(pages["kept"])
        fold = statistics.median(pages["fold"])
        warm = statistics.median(warm_pages)
        print(f"execution page in Chromium, navigation -> completed with its {args.iterations:,}:")
        print(f"  fresh flowtide ui, kept summary     median {cold:.2f} s  runs {pages['kept']}")
        print(f"  fresh flowtide ui, fold (baseline)  median {fold:.2f} s  runs {pages['fold']}")
        print(f"  again (warm)                        median {warm:.2f} s  runs {warm_pages}")
        met = "MET" if cold <= GOAL_PAGE_S else "NOT MET"
        print(f"  goal: page of a {args.iterations:,}-iteration loop <= {GOAL_PAGE_S} s: {met}")
        print(f"load average at the end: {os.getloadavg()}")


def _kept_summary(db: Path, eid: str) -> tuple[int, str] | None:
    import sqlite3

    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT format, doc FROM execution_summary WHERE execution_id = ?", (int(eid),)
        ).fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def _set_kept_summary(db: Path, eid: str, kept: tuple[int, str] | None) -> None:
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM execution_summary WHERE execution_id = ?", (int(eid),))
        if kept is not None:
            conn.execute(
                "INSERT INTO execution_summary (execution_id, format, doc) VALUES (?, ?, ?)",
                (int(eid), *kept),
            )


if __name__ == "__main__":
    main()
