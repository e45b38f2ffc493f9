"""The faults of a NATS cluster, for bench/faults.py: its stack runs NATS as three
nats-servers (`flowtide dev up --nats-cluster 3`), the server's streams and bucket at R3.

    kill-nats-leader      kill -9 the node that leads the command stream, then start it
                          again (the stream elects another leader meanwhile)
    kill-nats-follower    kill -9 a node that leads none of the server's streams, then
                          start it again
    stop-nats-leader      SIGSTOP the command stream's leader for --nats-cluster-stop s
                          (12: past JetStream's election timeout), then SIGCONT
    nats-rolling-restart  restart each node in turn (SIGTERM, start, wait until every
                          replica of every stream is current again), as an upgrade does

Which node led what is found through JetStream (`flowtide.dev.natsnodes.stream_report`).
"""

from __future__ import annotations

import random
import signal
import time
from typing import Any

CLUSTER_FAULTS = (
    "kill-nats-leader",
    "kill-nats-follower",
    "stop-nats-leader",
    "nats-rolling-restart",
)
COMMANDS = "FLOWTIDE_COMMANDS"


def leaders(stack: Any) -> dict[str, str | None]:
    """Each of the server's streams' leader now (None while it elects one)."""
    from flowtide.dev.natsnodes import stream_report

    return {doc["stream"]: doc.get("leader") for doc in stream_report(stack)}


def wait_current(stack: Any, timeout: float = 60.0) -> float:
    """Wait until every stream has a leader and every replica is current; seconds taken."""
    from flowtide.dev.natsnodes import stream_report

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        report = stream_report(stack)
        if report and all(
            doc.get("leader") and all(p["current"] and not p.get("offline") for p in doc["peers"])
            for doc in report
        ):
            return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError(f"the NATS streams are not all current after {timeout:g} s")


def choose(drill: Any, fault: str, rng: random.Random) -> tuple[str, str]:
    """The node a cluster `fault` will strike and why, found before the run starts (a
    look-up through JetStream takes longer than a CI-sized run)."""
    stack = drill.stack
    nodes = [n.name for n in stack.nats_nodes()]
    if fault == "nats-rolling-restart":
        return "", "every node in turn"
    lead = leaders(stack)
    leader = lead.get(COMMANDS) or rng.choice(nodes)
    if fault == "kill-nats-follower":
        busy = {name for name in lead.values() if name}
        spare = [n for n in nodes if n not in busy] or [n for n in nodes if n != leader]
        victim = rng.choice(spare)
        return victim, f"leading {sorted(s for s, n in lead.items() if n == victim)}"
    return leader, f"leader of {COMMANDS}"


def strike(drill: Any, fault: str, victim: tuple[str, str], out: Any) -> float:
    """Inflict a cluster `fault` on `drill`'s stack at `victim` (`choose`) and undo it;
    the monotonic time it ended (the kill, or the end of the outage / the restarts).
    `out.detail` names the node struck."""
    stack = drill.stack
    name, why = victim
    if fault in ("kill-nats-leader", "kill-nats-follower"):
        stack.signal(name, signal.SIGKILL)
        end = time.monotonic()
        out.detail = f"killed {name} ({why})"
        drill.up()
        return end
    if fault == "stop-nats-leader":
        stack.signal(name, signal.SIGSTOP)
        out.detail = f"stopped {name} for {drill.args.nats_cluster_stop:g} s ({why})"
        try:
            time.sleep(drill.args.nats_cluster_stop)
        finally:
            stack.signal(name, signal.SIGCONT)
        return time.monotonic()
    if fault == "nats-rolling-restart":
        took = []
        for node in stack.nats_nodes():
            stack.procs.stop(node.name)
            drill.up()
            took.append(round(wait_current(stack), 1))
        out.detail = f"each node back and current in {took} s"
        return time.monotonic()
    raise ValueError(f"unknown fault {fault!r}")
