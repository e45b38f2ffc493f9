"""Two revisions of flowtide side by side: the embedded loop and the distributed loop,
interleaved in one invocation, so that a refactoring's cost is measured against its
baseline on the same noisy machine.

    .venv/bin/python bench/revisions.py BEFORE [AFTER] [--loop-rounds 5] [--dist-rounds 2]

BEFORE and AFTER are git revisions (AFTER defaults to the working tree). Each is checked
out into a temporary worktree; both run with this virtualenv's packages and this
checkout's bench scripts (`bench/loop.py --child embedded`, `bench/distributed.py`),
only `PYTHONPATH` switches between their sources. Rounds alternate which goes first.
Medians and every run are printed, with the load average at each run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


@contextlib.contextmanager
def checkout(revision: str | None, into: Path) -> Iterator[Path]:
    """The source folder of `revision` (None: this working tree)."""
    if revision is None:
        yield REPO / "src"
        return
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(into), revision],
        check=True,
    )
    try:
        yield into / "src"
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(into)], check=False
        )


def run(src: Path, site: Path, argv: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{src}:{site}"}
    for attempt in (1, 2):
        proc = subprocess.run(
            [sys.executable, *argv], env=env, capture_output=True, text=True, cwd=site
        )
        if proc.returncode == 0:
            doc: dict[str, Any] = json.loads(proc.stdout)
            return doc
        print(f"  run failed (attempt {attempt}): {proc.stderr[-800:]}", file=sys.stderr)
    raise SystemExit(f"{argv[0]} failed twice with PYTHONPATH={src}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after", nargs="?", help="default: the working tree")
    parser.add_argument("--loop-rounds", type=int, default=5)
    parser.add_argument("--dist-rounds", type=int, default=2, help="0 to skip")
    parser.add_argument("--iterations", type=int, default=1000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="flowtide-revisions-") as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        # nats-py imported from two threads at once can fail half-initialised; both
        # revisions import it on the main thread first, so neither pays for that race.
        (site / "sitecustomize.py").write_text("import nats  # noqa: F401\n")
        with (
            checkout(args.before, Path(tmp) / "before") as before,
            checkout(args.after, Path(tmp) / "after") as after,
        ):
            trees = {"before": before, "after": after}
            loop: dict[str, list[float]] = {k: [] for k in trees}
            dist: dict[str, list[float]] = {k: [] for k in trees}
            claim: dict[str, list[float]] = {k: [] for k in trees}
            for i in range(args.loop_rounds):
                for name in trees if i % 2 == 0 else reversed(list(trees)):
                    doc = run(
                        trees[name],
                        site,
                        [
                            str(BENCH / "loop.py"),
                            "--child",
                            "embedded",
                            "--n",
                            str(args.iterations),
                        ],
                    )
                    loop[name].append(args.iterations / doc["loop_s"])
                    print(
                        f"{name:6} embedded {loop[name][-1]:7.0f} it/s  load {os.getloadavg()[0]:.1f}"
                    )
            for i in range(args.dist_rounds):
                for name in trees if i % 2 == 0 else reversed(list(trees)):
                    doc = run(
                        trees[name],
                        site,
                        [
                            str(BENCH / "distributed.py"),
                            *("--iterations", str(args.iterations), "--concurrency", "8"),
                            *("--max-in-flight", "16", "--repeat", "2", "--latency-runs", "60"),
                            "--json",
                        ],
                    )
                    runs = [r["it_s"] for r in doc["loops"][0]["runs"]]
                    dist[name] += runs
                    claim[name].append(doc["single"]["p50_ms"])
                    print(
                        f"{name:6} distributed {' '.join(f'{r:.0f}' for r in runs)} it/s,"
                        f" claim p50 {claim[name][-1]:.1f} ms  load {os.getloadavg()[0]:.1f}"
                    )
    print()
    for name in ("before", "after"):
        line = f"{name:6} embedded median {statistics.median(loop[name]):.0f} it/s"
        if dist[name]:
            line += (
                f"; distributed median {statistics.median(dist[name]):.0f} it/s,"
                f" claim p50 median {statistics.median(claim[name]):.1f} ms"
            )
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
