"""The fault matrix (bench/faults.py) once per fault, at CI sizes (`--quick`: 40
iterations, a 5 s shard outage, a 3 s nats-server stop, a cluster's stream leader
stopped 12 s): every run completes with exactly its results, none twice, none stuck,
and under duplicate-commands the stream really took each command twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flowtide.dev.postgres import find_pg_bin

from .stack import flowtide_env

pytestmark = [
    pytest.mark.skipif(find_pg_bin() is None, reason="PostgreSQL server not installed"),
    pytest.mark.nats,
]

ROOT = Path(__file__).resolve().parents[2]
ONE_SHARD = [
    "kill-worker",
    "kill-server",
    "kill-nats",
    "stop-nats",
    "pg-restart-fast",
    "pg-restart-immediate",
    "stop-worker",
    "duplicate-commands",
]
#: NATS as a cluster of three (bench/faults_nats.py).
NATS_CLUSTER = [
    "kill-nats-leader",
    "kill-nats-follower",
    "stop-nats-leader",
    "nats-rolling-restart",
]


def _matrix(tmp_path: Path, faults: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "faults.py"),
            "--quick",
            "--trials",
            "1",
            "--seed",
            "7",
            "--json",
            "--faults",
            ",".join(faults),
        ],
        capture_output=True,
        text=True,
        env=flowtide_env(tmp_path),
        cwd=tmp_path,
        timeout=timeout,
    )
    assert proc.stdout, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    assert sorted(report["faults"]) == sorted(faults), proc.stderr[-4000:]
    for fault, entry in report["faults"].items():
        summary = entry["summary"]
        trial = entry["trials"][0]
        assert summary["trials"] == 1, fault
        assert trial["completed"] and trial["exact"], (fault, trial, proc.stderr[-3000:])
        assert trial["duplicated"] == 0 and not trial["stuck"], (fault, trial)
        assert summary["ok"] == 1, (fault, trial)
        if fault != "duplicate-commands":
            # The fault struck mid-run, and the run went on after it.
            assert trial["struck_at"] is not None and trial["struck_at"] < 40, (fault, trial)
            assert trial["recover"] is not None, (fault, trial)
    assert proc.returncode == 0 and report["ok"], proc.stderr[-3000:]
    return report


@pytest.mark.timeout(300)
def test_every_fault_of_one_shard_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    report = _matrix(tmp_path, ONE_SHARD, timeout=290)
    doubled = report["faults"]["duplicate-commands"]["trials"][0]
    assert doubled["published"] > 0 and doubled["published"] % 2 == 0, doubled


@pytest.mark.timeout(200)
def test_a_shards_postgresql_stopped_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    report = _matrix(tmp_path, ["shard-pg-stop"], timeout=190)
    trial = report["faults"]["shard-pg-stop"]["trials"][0]
    # The outage (5 s at CI sizes) held the run up: the fault was real.
    assert trial["delay"] is not None and trial["delay"] > 3, trial
    # The other shard ran meanwhile, each run well under the pool's 10 s wait that once
    # held every one of them up.
    assert trial["others"] and all(0 <= t < 8 for t in trial["others"]), trial


@pytest.mark.timeout(300)
def test_a_nats_clusters_node_failures_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    report = _matrix(tmp_path, NATS_CLUSTER, timeout=290)
    for fault in NATS_CLUSTER:
        trial = report["faults"][fault]["trials"][0]
        assert report["faults"][fault]["nats_nodes"] == 3, fault
        # The node struck is named: the drill found the stream leaders through JetStream.
        assert trial["detail"].startswith(("killed nats-", "stopped nats-", "each node")), trial
    stopped = report["faults"]["stop-nats-leader"]["trials"][0]
    assert "stopped nats-" in stopped["detail"] and "for 12 s" in stopped["detail"], stopped
