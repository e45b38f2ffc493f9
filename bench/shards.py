"""Sharding: how evenly `shard_for` spreads executions (issue 17, benchmark part a).

    .venv/bin/python bench/shards.py [--ids 1000000] [--machines 8] [--bursts 1,40] [--json]

Ids are real snowflakes of `flowtide.ids.Snowflake`: --machines generators (one per
server process) on a simulated clock that advances one millisecond after each burst of
ids per generator, so the ids have what production ids have: the same millisecond on
every machine, sequences restarting at 0 each millisecond. Two loads by default: a quiet
system (1 id per millisecond per process: every sequence is 0) and a busy one (40). Each id is
placed with `shard_for(id, N)` for N = 2, 4, 16, and the load of a shard is the number of
ids it got. Reported: max/min shard load (goal <= 1.02) and, as the reason the seed
hashes, the same for the raw id modulo N, whose low bits (the sequence, then the machine
id) pile the ids onto a few shards.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flowtide.ids import Snowflake  # noqa: E402
from flowtide.sharding import shard_for  # noqa: E402

GOAL = 1.02


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--machines", type=int, default=8)
    parser.add_argument("--bursts", default="1,40", help="ids per millisecond per process")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

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
        if not args.json:
            print(
                f"{len(ids):,} snowflakes from {args.machines} generators, {burst} per"
                f" millisecond each (generated in {generated:.1f} s)"
            )
            print(f"{'N':>4}  {'shard_for max/min':>18}  {'id % N max/min':>15}  {'ns/id':>6}")
            for r in rows:
                modulo = r["modulo_max_over_min"]
                shown = "inf" if modulo == float("inf") else f"{modulo:.4f}"
                print(
                    f"{r['shards']:>4}  {r['hashed_max_over_min']:>18.4f}  {shown:>15}"
                    f"  {r['shard_for_ns_per_id']:>6}"
                    f"  goal <= {GOAL}: {'met' if r['met'] else 'NOT met'}"
                )
    if args.json:
        for result in results:
            for r in result["rows"]:
                if r["modulo_max_over_min"] == float("inf"):
                    r["modulo_max_over_min"] = None  # a shard got nothing
        print(json.dumps(results, indent=2))
    rows = [r for result in results for r in result["rows"]]
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
