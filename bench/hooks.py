"""Webhook accept latency (issue 30: p99 <= 50 ms at 200 deliveries/s) and what one
process sustains, on `flowtide ui` over a fresh local store, on loopback.

    .venv/bin/python bench/hooks.py [--rate 200] [--seconds 10] [--burst-seconds 5]

1. A fresh home under /tmp: a one-step `noop` playbook in the catalog, a hook on it
   (`flowtide hook add`, a rate high enough not to refuse), `flowtide ui` serving it.
2. Open loop: --rate signed deliveries a second for --seconds, each sent at its planned
   instant (whatever the answers before it), each with its own delivery id, so every one
   starts a run. Latency is from the planned instant to the answer (a server that falls
   behind shows it, rather than the sender waiting for it: no coordinated omission).
3. Closed loop: --concurrency senders as fast as answers come for --burst-seconds: the
   deliveries a second one process accepts (and starts runs for).

The runs the deliveries start execute in the same process (embedded), as they would on
`flowtide ui`/`flowtide scheduler`; their work shares the two cores with the sender.
The machine's load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from flowtide.triggers.hooks import sign  # noqa: E402

GOAL_P99_MS = 50.0
SECRET = b"bench-hook-secret-0123456789abcdef"

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: hook_bench, path: bench/hook}
workload: {body: null}
workflow:
  - step: start
    tool: {kind: noop}
"""


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTIDE_")}
    env["FLOWTIDE_HOME"] = str(home)
    env["FLOWTIDE_NO_PROGRESS"] = "1"
    return env


def _flowtide(home: Path, *args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise SystemExit(f"flowtide {' '.join(args)}: {proc.stderr}")


def _start_ui(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    log = home / "ui.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowtide.cli", "ui", "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(home),
        )
    deadline = time.monotonic() + 60
    while True:
        found = re.search(r"open (http://\S+)/ui#token=", log.read_text())
        if found:
            return proc, found[1]
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"flowtide ui did not start:\n{log.read_text()}")
        time.sleep(0.1)


def _headers(body: bytes, delivery: str) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "X-Flowtide-Signature": sign(SECRET, body),
        "X-Flowtide-Delivery": delivery,
    }


async def _open_loop(base: str, rate: float, seconds: float) -> tuple[list[float], dict[int, int]]:
    latencies: list[float] = []
    codes: dict[int, int] = {}
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:

        async def one(k: int, planned: float) -> None:
            body = b'{"k": %d, "bench": "open"}' % k
            r = await client.post("/api/hooks/bench", content=body, headers=_headers(body, f"o{k}"))
            latencies.append(time.perf_counter() - planned)
            codes[r.status_code] = codes.get(r.status_code, 0) + 1

        start = time.perf_counter() + 0.2
        tasks = []
        total = int(rate * seconds)
        for k in range(total):
            planned = start + k / rate
            delay = planned - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(k, planned)))
        await asyncio.gather(*tasks)
    return latencies, codes


async def _closed_loop(
    base: str, concurrency: int, seconds: float
) -> tuple[int, float, dict[int, int]]:
    codes: dict[int, int] = {}
    done = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        end = time.perf_counter() + seconds

        async def sender(s: int) -> None:
            nonlocal done
            k = 0
            while time.perf_counter() < end:
                body = b'{"s": %d, "k": %d, "bench": "closed"}' % (s, k)
                r = await client.post(
                    "/api/hooks/bench", content=body, headers=_headers(body, f"c{s}-{k}")
                )
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code == 202:
                    done += 1
                k += 1

        began = time.perf_counter()
        await asyncio.gather(*(sender(s) for s in range(concurrency)))
        took = time.perf_counter() - began
    return done, took, codes


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _settle(base: str, token: str, timeout: float = 120) -> float:
    """Seconds until no run started by the deliveries is still running."""
    began = time.monotonic()
    with httpx.Client(
        base_url=base, headers={"authorization": f"Bearer {token}"}, timeout=60
    ) as api:
        while True:
            r = api.get("/api/executions", params={"limit": 1, "status": "running"})
            running = r.json().get("items", []) if r.status_code == 200 else []
            if not running or time.monotonic() - began > timeout:
                waited = time.monotonic() - began
                latest = api.get("/api/executions", params={"limit": 500}).json()["items"]
                ended: dict[str, int] = {}
                for item in latest:
                    ended[item["status"]] = ended.get(item["status"], 0) + 1
                print(f"  the latest {len(latest)} runs: {dict(sorted(ended.items()))}")
                return waited
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--burst-seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="flowtide-hooks-bench-"))
    (home / "hook.yaml").write_text(PLAYBOOK)
    secret = home / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    _flowtide(home, "catalog", "register", str(home / "hook.yaml"))
    _flowtide(
        home,
        "hook",
        "add",
        "bench",
        "bench/hook",
        "--secret-file",
        str(secret),
        "--rate",
        "100000/s",
    )
    proc, base = _start_ui(home)
    token = re.search(r"#token=(\S+)", (home / "ui.out").read_text())[1]  # type: ignore[index]
    try:
        # Warm: the first delivery reads the hook, its secret and the playbook.
        body = b"{}"
        httpx.post(
            f"{base}/api/hooks/bench", content=body, headers=_headers(body, "warm"), timeout=60
        )
        load = os.getloadavg()[0]
        latencies, codes = asyncio.run(_open_loop(base, args.rate, args.seconds))
        print(
            f"open loop: {len(latencies)} deliveries at {args.rate:g}/s for {args.seconds:g} s"
            f" (load average before: {load:.2f})"
        )
        print(f"  answers: {dict(sorted(codes.items()))}")
        p50, p90, p99 = (_pct(latencies, q) for q in (0.5, 0.9, 0.99))
        print(
            f"  accept latency ms: p50 {p50:.1f}  p90 {p90:.1f}  p99 {p99:.1f}"
            f"  max {max(latencies) * 1000:.1f}  mean {statistics.fmean(latencies) * 1000:.1f}"
        )
        print(f"  goal p99 <= {GOAL_P99_MS:g} ms: {'met' if p99 <= GOAL_P99_MS else 'not met'}")
        waited = _settle(base, token)
        print(f"  runs drained {waited:.1f} s after the last answer")
        done, took, codes = asyncio.run(_closed_loop(base, args.concurrency, args.burst_seconds))
        print(
            f"closed loop: {args.concurrency} senders for {took:.1f} s: {done} runs started,"
            f" {done / took:.0f} deliveries/s accepted; answers {dict(sorted(codes.items()))}"
        )
        waited = _settle(base, token)
        print(f"  runs drained {waited:.1f} s after the last answer")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
