"""What a KV client sees while a JetStream cluster elects a bucket's new leader.

    .venv/bin/python bench/nats_election.py [--trials 10] [--freeze 12] [--timeout 5] [--json]

A real cluster of three nats-servers on loopback (tests/kv/natsserver.NatsCluster) and an
R3 bucket; one writer puts a key in a loop, as the server records loop iterations: each
put through `flowtide.loopstate.retrying` (repeated while KVUnavailableError), the
handle's request timeout --timeout s (5: the server's). Per trial, the node leading the bucket is
struck while the writer runs, then brought back and the cluster waited for:

    kill     kill -9 of the leader (restarted after the measurement)
    freeze   SIGSTOP of the leader for --freeze s, then SIGCONT

Measured per trial: the window (the longest time between two successful puts around
the strike, which is how long a writer waits), the KVUnavailableError the retries met,
and whether any put failed past the retries (it must not). Printed per kind: p50 and max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kv"))

from natsserver import NatsCluster  # noqa: E402

from flowtide.kv import KVUnavailableError  # noqa: E402
from flowtide.kv.base import BucketConfig  # noqa: E402
from flowtide.kv.nats import open_nats  # noqa: E402
from flowtide.loopstate import retrying  # noqa: E402


async def leader_of(kv: Any, bucket: str) -> str:
    reply = await kv._conn.api(f"$JS.API.STREAM.INFO.KV_{bucket}", None, timeout=5)
    return str(reply["cluster"]["leader"])


async def trial(
    cluster: NatsCluster, kind: str, number: int, freeze: float, timeout: float
) -> dict[str, Any]:
    bucket = f"election_{kind}_{number}"
    kv = await open_nats(cluster.url, BucketConfig(bucket=bucket, replicas=3), timeout=timeout)
    unavailable = 0
    failed = 0
    stamps: list[float] = []
    stop = asyncio.Event()

    async def write() -> None:
        nonlocal unavailable, failed
        n = 0
        while not stop.is_set():
            n += 1

            async def put(n: int = n) -> int:
                nonlocal unavailable
                try:
                    return await kv.put("k", str(n).encode())
                except KVUnavailableError:
                    unavailable += 1
                    raise

            try:
                await retrying(put)
                stamps.append(time.monotonic())
            except Exception:  # noqa: BLE001 - counted: must not happen
                failed += 1
            await asyncio.sleep(0.005)

    try:
        leader = await leader_of(kv, bucket)
        index = next(i for i, n in enumerate(cluster.nodes) if n.root.name == leader)
        writer = asyncio.create_task(write())
        await asyncio.sleep(1.0)
        struck = time.monotonic()
        if kind == "kill":
            cluster.kill(index)
            await asyncio.sleep(15)
        else:
            cluster.pause(index)
            await asyncio.sleep(freeze)
            cluster.resume(index)
            await asyncio.sleep(5)
        stop.set()
        await writer
        around = [t for t in stamps if t >= struck - 1.0]
        gaps = [b - a for a, b in zip(around, around[1:], strict=False)]
        window = max(gaps) if gaps else float("inf")
        new_leader = await leader_of(kv, bucket)
    finally:
        await kv.close()
    if kind == "kill":
        cluster.restart(index)
    await asyncio.sleep(3)  # the node catches up
    return {
        "kind": kind,
        "trial": number,
        "leader": leader,
        "new_leader": new_leader,
        "window": round(window, 2),
        "unavailable": unavailable,
        "failed": failed,
        "puts": len(stamps),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--freeze", type=float, default=12.0)
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="the handle's request timeout (the server's: 5)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = sys.stderr if args.json else sys.stdout
    print(
        f"KV leader elections: {args.trials} trials each, load {os.getloadavg()[0]:.2f},"
        f" {os.cpu_count()} CPUs",
        file=out,
    )
    results: list[dict[str, Any]] = []
    with NatsCluster.start(Path(tempfile.mkdtemp(prefix="flowtide-election-")), 3) as cluster:
        for kind in ("kill", "freeze"):
            for n in range(1, args.trials + 1):
                r = asyncio.run(trial(cluster, kind, n, args.freeze, args.timeout))
                results.append(r)
                print(
                    f"  {kind} {n}: {r['leader']} -> {r['new_leader']}, window {r['window']} s,"
                    f" {r['unavailable']} unavailable, {r['failed']} failed",
                    file=out,
                    flush=True,
                )
    summary = {}
    for kind in ("kill", "freeze"):
        rows = [r for r in results if r["kind"] == kind]
        windows = [r["window"] for r in rows]
        summary[kind] = {
            "trials": len(rows),
            "window_p50": round(statistics.median(windows), 2),
            "window_max": round(max(windows), 2),
            "unavailable_p50": statistics.median(r["unavailable"] for r in rows),
            "failed": sum(r["failed"] for r in rows),
        }
        s = summary[kind]
        print(
            f"{kind:<7} window p50 {s['window_p50']} s, max {s['window_max']} s;"
            f" unavailable p50 {s['unavailable_p50']}; failed {s['failed']}",
            file=out,
        )
    if args.json:
        print(json.dumps({"summary": summary, "trials": results}, indent=2))
    return 0 if all(s["failed"] == 0 for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
