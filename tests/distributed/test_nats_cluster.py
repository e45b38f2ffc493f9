"""flowtide on NATS as a JetStream cluster of three (real nats-servers on loopback, with
flowtide's users): the server keeps its streams and bucket at the replicas it is told,
brings existing ones to a changed setting, refuses what JetStream cannot change with the
reason, and a run completes exactly across the cluster."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from natsserver import NatsCluster, NatsServer

from flowtide.dev.nats import SERVER_USER
from flowtide.natsauth import connect_nats

from .stack import Stack

pytestmark = pytest.mark.nats

STREAMS = ("FLOWTIDE_COMMANDS", "FLOWTIDE_LOGS", "KV_flowtide_state")

LOOP = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cluster_loop, path: tests/cluster_loop}
workflow:
  - step: start
    next: [{step: work}]
  - step: work
    loop: {in: "{{ range(30) | list }}", iterator: item, spec: {mode: parallel}}
    tool: {kind: python, input: {i: "{{ item }}"}, code: "result = i * 2"}
    next: [{step: total}]
  - step: total
    tool: {kind: python, input: {rows: "{{ work.results }}"}, code: "result = sum(rows)"}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster.start(tmp_path_factory.mktemp("cluster"), 3, secured=True) as nodes:
        yield nodes


def _replicas(url: str, users: dict[str, Any]) -> dict[str, tuple[int, str | None]]:
    """Each of the server's streams: (replicas, its leader)."""

    async def main() -> dict[str, tuple[int, str | None]]:
        nc = await connect_nats(url, users[SERVER_USER].auth(), name="test", wait=False)
        try:
            js = nc.jetstream()
            out = {}
            for name in STREAMS:
                info = await js.stream_info(name)
                leader = info.cluster.leader if info.cluster else None
                out[name] = (info.config.num_replicas, leader)
            return out
        finally:
            await nc.close()

    return asyncio.run(main())


def _stack(pg_server: Any, root: Path, url: str, users: dict[str, Any], **env: str) -> Stack:
    db = pg_server.create_database(f"nats_cluster_{abs(hash(root)) % 10**8}")
    return Stack(db=db, nats=url, kv=url, root=root, nats_users=users, extra_env=env)


def test_the_server_brings_its_streams_to_three_replicas_and_a_run_completes(
    pg_server: Any, cluster: NatsCluster, tmp_path: Path
) -> None:
    stack = _stack(pg_server, tmp_path, cluster.url, cluster.users)
    try:
        stack.start_server()  # the default: one replica
        assert {n for n, _ in _replicas(cluster.url, cluster.users).values()} == {1}
        stack.stop()
        stack.extra_env["FLOWTIDE_NATS_REPLICAS"] = "3"
        stack.start_server()
        got = _replicas(cluster.url, cluster.users)
        assert {n for n, _ in got.values()} == {3}, got
        assert all(leader for _, leader in got.values()), got
        log = stack.log("server")
        assert "FLOWTIDE_COMMANDS: applying num_replicas 1 -> 3" in log, log
        stack.start_worker(concurrency=4)
        stack.wait_workers(1)
        playbook = tmp_path / "loop.yaml"
        playbook.write_text(LOOP)
        done = stack.run("run", playbook, "--json", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["result"] == 870, done.stdout[-2000:]
    finally:
        stack.stop()


def _server_exit(stack: Stack) -> str:
    """Start the server, expecting it to refuse to start; what it said."""
    with pytest.raises(RuntimeError, match="server exited") as caught:
        stack.start_server()
    return str(caught.value)


def test_three_replicas_on_one_nats_server_are_refused_with_the_way_out(
    pg_server: Any, tmp_path: Path
) -> None:
    with NatsServer.start_secured(tmp_path / "nats") as nats:
        stack = _stack(pg_server, tmp_path, nats.url, nats.users, FLOWTIDE_NATS_REPLICAS="3")
        try:
            text = _server_exit(stack)
            assert "3 replicas need a NATS cluster of at least 3 nodes" in text, text
            assert "Traceback" not in text, text
            assert "--nats-replicas 1" in text and "--nats-cluster 3" in text, text
        finally:
            stack.stop()


def test_a_streams_storage_cannot_change_and_the_server_says_why(
    pg_server: Any, tmp_path: Path
) -> None:
    with NatsServer.start_secured(tmp_path / "nats") as nats:
        stack = _stack(pg_server, tmp_path, nats.url, nats.users)
        try:
            stack.start_server()
            stack.stop()
            stack.extra_env["FLOWTIDE_NATS_STORAGE"] = "memory"
            text = _server_exit(stack)
            # The bucket is opened first; the streams say the same in their words.
            assert "is stored in file" in text and "to memory storage" in text, text
            assert "keep FLOWTIDE_NATS_STORAGE (--nats-storage) as it was" in text, text
            assert "Traceback" not in text, text
        finally:
            stack.stop()


def test_a_run_goes_on_while_the_node_leading_the_bucket_is_frozen(
    pg_server: Any, cluster: NatsCluster, tmp_path: Path
) -> None:
    """The bucket's leader SIGSTOPped past JetStream's election timeout: its replicas
    elect another, and the loop's writes wait for it instead of failing the run."""
    stack = _stack(pg_server, tmp_path, cluster.url, cluster.users, FLOWTIDE_NATS_REPLICAS="3")
    playbook = tmp_path / "loop.yaml"
    slow = "__import__('time').sleep(0.02) or i * 2"
    playbook.write_text(LOOP.replace("range(30)", "range(400)").replace("i * 2", slow))
    paused: int | None = None
    try:
        stack.start_server()
        stack.start_worker(concurrency=4)
        stack.wait_workers(1)
        leader = _replicas(cluster.url, cluster.users)["KV_flowtide_state"][1]
        run = subprocess.Popen(
            [sys.executable, "-m", "flowtide.cli", "run", str(playbook), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**stack.env, "FLOWTIDE_SERVER": stack.url},
            cwd=tmp_path,
        )
        time.sleep(1.5)
        paused = next(i for i, n in enumerate(cluster.nodes) if n.root.name == leader)
        cluster.pause(paused)
        time.sleep(10)
        cluster.resume(paused)
        paused = None
        out, errs = run.communicate(timeout=120)
        assert run.returncode == 0, out[-2000:] + errs[-2000:]
        assert json.loads(out)["result"] == sum(i * 2 for i in range(400)), out[-2000:]
    finally:
        if paused is not None:
            cluster.resume(paused)
        stack.stop()
