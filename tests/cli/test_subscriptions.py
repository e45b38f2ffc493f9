"""`flowtide subscription ...` and the listeners of `flowtide scheduler` on the local
store against a real nats-server (loopback): every JetStream message starts exactly one
run with its payload, also when the scheduler is killed (`kill -9`) mid-stream and
started again (the redelivered messages start nothing new); batches; a core subject; a
playbook that cannot start is refused with why, delivered again, then dropped."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import Flowtide, describe, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

from natsserver import NatsServer  # noqa: E402

pytestmark = pytest.mark.nats

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: sub, path: tests/sub}
workload: {n: none}
workflow:
  - step: start
    tool: {kind: noop}
"""

SUBSCRIPTION = """\
apiVersion: noetl.io/v2
kind: Subscription
metadata: {name: batched, description: ten at a time}
spec:
  playbook: tests/sub
  source: nats
  url: URL
  stream: BATCH
  batch: {size: 10, max_wait: 500ms}
  ack_wait: 2s
"""


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer.start(tmp_path_factory.mktemp("subs-nats"))
    try:
        yield server
    finally:
        server.stop()


async def _publish_js(url: str, stream: str, subject: str, bodies: list[Any]) -> None:
    import nats as nats_py

    nc = await nats_py.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[subject])
        for body in bodies:
            await js.publish(subject, json.dumps(body).encode())
    finally:
        await nc.close()


async def _publish_core(url: str, subject: str, messages: list[tuple[Any, dict[str, str]]]) -> None:
    import nats as nats_py

    nc = await nats_py.connect(url)
    try:
        for body, headers in messages:
            await nc.publish(subject, json.dumps(body).encode(), headers=headers)
        await nc.flush()
    finally:
        await nc.close()


async def _consumer(url: str, stream: str, durable: str) -> tuple[int, int]:
    """(messages not yet delivered, delivered and not acked) of a consumer."""
    import nats as nats_py

    nc = await nats_py.connect(url)
    try:
        info = await nc.jetstream().consumer_info(stream, durable)
        return int(info.num_pending or 0), int(info.num_ack_pending or 0)
    finally:
        await nc.close()


def _runs(ft: Flowtide, name: str) -> list[tuple[str, dict[str, Any]]]:
    """(trigger key, workload) of every run the subscription started."""
    db = sqlite3.connect(ft.home / "flowtide.db", timeout=30)
    try:
        rows = db.execute(
            "SELECT trigger_key, workload FROM execution"
            " WHERE trigger_kind = 'subscription' AND trigger_name = ?",
            (name,),
        ).fetchall()
    finally:
        db.close()
    return [(str(k), json.loads(w)) for k, w in rows]


def _register(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "sub.yaml"
    playbook.write_text(PLAYBOOK)
    ft.ok("catalog", "register", playbook)


def _scheduler(ft: Flowtide, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as sink:
        proc = ft.popen("scheduler", stdout=sink, stderr=subprocess.STDOUT)
    wait_until(lambda: "firing due slots" in log.read_text(), timeout=30, what="start", proc=proc)
    return proc


def test_every_message_starts_one_run_across_a_kill(
    ft: Flowtide, tmp_path: Path, nats: NatsServer
) -> None:
    total = 1000
    _register(ft, tmp_path)
    asyncio.run(_publish_js(nats.url, "EVENTS", "events.new", [{"n": i} for i in range(total)]))
    added = ft.json(
        "subscription", "add", "events", "tests/sub", "--url", nats.url,
        "--stream", "EVENTS", "--ack-wait", "2s", "--set", "n={{ message.data.n }}",
    )  # fmt: skip
    assert added["consumer"] == "flowtide-sub-events", added
    log = tmp_path / "scheduler.out"
    proc = _scheduler(ft, log)
    try:
        wait_until(lambda: len(_runs(ft, "events")) >= 250, timeout=30, what="250 runs", proc=proc)
        proc.send_signal(signal.SIGKILL)  # mid-stream: some runs created, not acked
        proc.wait(timeout=10)
        assert len(_runs(ft, "events")) < total, "the kill came too late to matter"
        proc = _scheduler(ft, log)
        wait_until(
            lambda: len(_runs(ft, "events")) >= total, timeout=60, what="every run", proc=proc
        )
        wait_until(
            lambda: asyncio.run(_consumer(nats.url, "EVENTS", "flowtide-sub-events")) == (0, 0),
            timeout=20,
            what="every message acked",
        )
        time.sleep(2.5)  # one more ack wait: a message left unacked would be back now
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    runs = _runs(ft, "events")
    keys = Counter(k for k, _ in runs)
    assert len(runs) == total and max(keys.values()) == 1, keys.most_common(3)
    assert set(keys) == {f"EVENTS:{seq}" for seq in range(1, total + 1)}
    by_key = dict(runs)
    assert all(str(by_key[f"EVENTS:{i + 1}"]["n"]) == str(i) for i in range(total))
    shown = ft.json("subscription", "show", "events")
    assert shown["firings"] and {f["status"] for f in shown["firings"]} == {"started"}


def test_batches_core_subjects_and_refused_runs(
    ft: Flowtide, tmp_path: Path, nats: NatsServer
) -> None:
    _register(ft, tmp_path)
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "batched.yaml").write_text(SUBSCRIPTION.replace("URL", nats.url))
    out = ft.ok("catalog", "register", folder).stdout
    assert "subscription batched" in out
    # A playbook file that will not load: its message is refused, delivered again, dropped.
    broken = tmp_path / "broken.yaml"
    broken.write_text(PLAYBOOK.replace("tests/sub", "tests/broken"))
    ft.ok(
        "subscription", "add", "broken", str(broken), "--url", nats.url,
        "--stream", "BROKEN", "--max-deliver", "2", "--ack-wait", "5s",
    )  # fmt: skip
    broken.write_text("workflow: [ {step: start, tool: {kind: nosuchkind}} ]\n")
    ft.ok(
        "subscription", "add", "core", "tests/sub", "--url", nats.url,
        "--subject", "core.events", "--set", "n={{ message.data.n }}",
    )  # fmt: skip
    asyncio.run(_publish_js(nats.url, "BATCH", "batch.new", [{"n": i} for i in range(95)]))
    asyncio.run(_publish_js(nats.url, "BROKEN", "broken.new", [{"n": 0}]))
    log = tmp_path / "scheduler.out"
    proc = _scheduler(ft, log)
    try:
        wait_until(
            lambda: "subscription core: listening" in log.read_text(),
            timeout=20,
            what="the core listener",
            proc=proc,
        )
        # Core NATS: each message once; a publisher's Nats-Msg-Id repeated starts nothing.
        messages = [({"n": i}, {"Nats-Msg-Id": f"m-{i}"}) for i in range(5)]
        asyncio.run(_publish_core(nats.url, "core.events", [*messages, messages[2]]))
        wait_until(lambda: len(_runs(ft, "core")) >= 5, timeout=20, what="core runs", proc=proc)
        wait_until(
            lambda: sum(len(w["messages"]) for _, w in _runs(ft, "batched")) >= 95,
            timeout=20,
            what="every batch",
            proc=proc,
        )

        def refused() -> list[dict[str, Any]]:
            shown = ft.json("subscription", "show", "broken")
            return [f for f in shown["firings"] if f["status"] == "failed"]

        wait_until(lambda: bool(refused()), timeout=20, what="a refusal", proc=proc)
        # Delivered again after a 1 s backoff, then dropped (max_deliver 2).
        wait_until(
            lambda: asyncio.run(_consumer(nats.url, "BROKEN", "flowtide-sub-broken")) == (0, 0),
            timeout=20,
            what="the refused message dropped",
        )
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    core = _runs(ft, "core")
    assert sorted(k for k, _ in core) == [f"id:m-{i}" for i in range(5)]
    assert sorted(str(w["n"]) for _, w in core) == [str(i) for i in range(5)]
    batches = _runs(ft, "batched")
    sizes = sorted(len(w["messages"]) for _, w in batches)
    seen = [m["data"]["n"] for _, w in batches for m in w["messages"]]
    assert sorted(seen) == list(range(95)), _describe(batches)
    assert sizes[-1] == 10 and sum(sizes) == 95
    assert all(k.startswith("BATCH:") and "-" in k for k, _ in batches)
    (failed,) = refused()
    assert failed["key"] == "BROKEN:1" and "nosuchkind" in failed["reason"], failed
    assert _runs(ft, "broken") == []
    shown = ft.ok("subscription", "show", "broken").stdout
    assert "failed" in shown and "nosuchkind" in shown, shown


def _describe(batches: list[tuple[str, dict[str, Any]]]) -> str:
    return "\n".join(f"{k}: {[m['data']['n'] for m in w['messages']]}" for k, w in batches)


def test_bad_definitions_are_refused_with_the_field(ft: Flowtide, tmp_path: Path) -> None:
    _register(ft, tmp_path)
    cases = {
        ("--url", "nats://127.0.0.1:1"): "subject",
        ("--stream", "S"): "auth",
        ("--url", "nats://x", "--stream", "S", "--rate", "fast"): "rate",
        ("--url", "nats://x", "--subject", "a", "--source", "kafka"): "kafka",
        ("--url", "nats://x", "--subject", "a", "--batch", "0"): "batch",
        ("--url", "nats://x", "--subject", "a", "--consumer", "c"): "consumer",
    }
    for flags, named in cases.items():
        proc = ft("subscription", "add", "bad", "tests/sub", *flags)
        assert proc.returncode == 2, describe(proc)
        assert named in proc.stderr, describe(proc)
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "s.yaml").write_text(
        SUBSCRIPTION.replace("URL", "nats://x").replace("stream:", "strem:")
    )
    bad = ft("catalog", "register", folder / "s.yaml")
    assert bad.returncode == 2, describe(bad)
    assert "s.yaml:8" in bad.stderr and "strem" in bad.stderr, describe(bad)
    ft.ok("subscription", "add", "ok", "tests/sub", "--url", "nats://x", "--subject", "a.b")
    (item,) = ft.json("subscription", "list")
    assert item["what"] == "nats subject a.b"
    ft.ok("subscription", "pause", "ok")
    assert ft.json("subscription", "show", "ok")["paused"] is True
    ft.ok("subscription", "resume", "ok")
    ft.ok("subscription", "delete", "ok")
    assert ft.json("subscription", "list") == []
