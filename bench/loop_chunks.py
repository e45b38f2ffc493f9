"""The embedded loop with and without chunks of iterations (issue 34), interleaved.

    .venv/bin/python bench/loop_chunks.py [--iterations 10000] [--rounds 3]

Runs bench/loop.py's playbook (a start step, a parallel python loop of --iterations
`{"i": item, "sq": item * item}` iterations) in a `LocalRuntime` over a fresh SQLite
store, with `batching=False` (one command per iteration) and `batching=True` (chunks,
the default) one after the other, --rounds times, at max_in_flight 16 and 1. Prints the
median iterations/s and this process's CPU per iteration of each, and the load average.
Every run checks that the loop's stats count every iteration.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loop import (
    LOOP_STEP,  # noqa: E402
    playbook_text,  # noqa: E402
)


def one(n: int, max_in_flight: int, batching: bool) -> tuple[float, float]:
    """(iterations/s, ms of this process's CPU per iteration) of one run."""
    from flowtide.credentials import CredentialVault
    from flowtide.playbook.loader import load_playbook
    from flowtide.runtime.local import LocalRuntime
    from flowtide.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory(prefix="flowtide-bench-chunks-") as tmp:
        home = Path(tmp) / ".flowtide"
        home.mkdir()
        path = Path(tmp) / "bench_loop.yaml"
        path.write_text(playbook_text(n, max_in_flight), encoding="utf-8")
        store = SQLiteStore(home / "flowtide.db")

        async def main() -> tuple[float, float]:
            vault = CredentialVault(store, home)
            async with LocalRuntime(store, credentials=vault, batching=batching) as runtime:
                playbook = load_playbook(path)
                cpu0, t0 = time.process_time(), time.perf_counter()
                state = await runtime.wait(await runtime.start(playbook))
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                stats = state.steps[LOOP_STEP].result["stats"]
                if state.status != "completed" or stats["success"] != n:
                    raise SystemExit(f"run {state.status}: {stats}")
                return n / wall, cpu * 1000.0 / n

        try:
            return asyncio.run(main())
        finally:
            store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{args.iterations:,} iterations, {args.rounds} interleaved rounds; load {os.getloadavg()}"
    )
    for mif in (16, 1):
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for batching in (False, True):
                runs[batching].append(one(args.iterations, mif, batching))
        for batching, got in runs.items():
            label = "chunks" if batching else "one per command"
            its = statistics.median(r[0] for r in got)
            cpu = statistics.median(r[1] for r in got)
            print(
                f"max_in_flight {mif:2d}, {label:15s}: {its:7,.0f} it/s, {cpu:.3f} ms CPU per"
                f" iteration (runs: {', '.join(f'{r[0]:,.0f}' for r in got)})"
            )
    print(f"load at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
