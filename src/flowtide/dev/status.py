"""What `flowtide dev status` shows: each part of the stack running (and healthy),
unhealthy (alive, not answering) or stopped, by its process and what it answers (a
server's /readyz; the workers as the servers list them), and the same per shard.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from flowtide.dev.layout import StackLayout, pg_role, server_role
from flowtide.dev.processes import Processes, nats_ok

__all__ = [
    "Component",
    "components",
    "shard_health",
    "shard_status",
    "worker_pools",
    "worker_state",
]

#: What `shard_health` reads of a server's /metrics: its key, the metric (a sum of its
#: samples with these labels).
_HEALTH: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("outbox_pending", "flowtide_outbox_pending", {}),
    ("outbox_oldest_age_seconds", "flowtide_outbox_oldest_pending_age_seconds", {}),
    ("open_executions", "flowtide_executions", {"status": "running"}),
    ("oldest_open_age_seconds", "flowtide_oldest_open_execution_age_seconds", {}),
    ("idle_past_stalled_after", "flowtide_executions_idle_past_stalled_after", {}),
    ("stalled", "flowtide_executions_stalled_total", {}),
    ("redriven", "flowtide_executions_redriven_total", {}),
)


@dataclass
class Component:
    """One part of the stack as `status` sees it."""

    name: str
    state: str  # running | stopped | unhealthy
    pid: int | None
    url: str | None
    log: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def components(layout: StackLayout, procs: Processes) -> list[Component]:
    """Each part: running (and healthy), unhealthy (alive, not answering) or stopped."""
    out = []
    shards = layout.config.shards
    for part in layout.pg_parts():
        pg_pid = part.pg.pid() if part.pg.is_running() else None
        out.append(
            Component(
                part.name,
                "running" if pg_pid else "stopped",
                pg_pid,
                _redacted(part.url),
                str(part.pg.log_path),
                pg_role(part).strip(" ()") if shards > 1 else "",
            )
        )
    users = ", ".join(sorted(layout.config.nats_passwords))
    ca = layout.ca.ca if layout.config.tls else None
    for node in layout.nats_nodes():
        nats_state = "stopped"
        if procs.alive(node.name):
            nats_state = "running" if nats_ok(node.port, ca) else "unhealthy"
        detail = f"users {users}" if users else ""
        if node.route_port is not None:
            detail = f"routes on 127.0.0.1:{node.route_port}" + (f", {detail}" if detail else "")
        out.append(
            Component(
                node.name,
                nats_state,
                procs.pid(node.name),
                node.url(layout.config.tls),
                str(procs.log(node.name)),
                detail,
            )
        )
    answering = []
    for server in layout.servers():
        state = "stopped"
        if procs.alive(server.name):
            state = "running" if layout.http_ok("/readyz", base=server.url) else "unhealthy"
        if state == "running":
            answering.append(server.url)
        out.append(
            Component(
                server.name,
                state,
                procs.pid(server.name),
                server.url,
                str(procs.log(server.name)),
                server_role(server, shards).strip(" ()"),
            )
        )
    # What the servers know of the workers (the cluster database's: any server).
    pools = worker_pools(layout, answering[0]) if answering else None
    names = sorted(
        {n for n in layout.config.pids if n.startswith("worker-")}
        | {f"worker-{i}" for i in range(layout.config.workers)},
        key=lambda n: int(n.split("-")[1]),
    )
    for name in names:
        state = "stopped"
        detail = ""
        if procs.alive(name):
            registered = worker_state(layout, name, pools) if pools is not None else None
            state = "running" if registered == "ready" else "unhealthy"
            detail = (
                f"pool {layout.config.pool}, {layout.config.concurrency} at once,"
                f" in {layout.config.workdir or layout.dir}"
            )
            if shards > 1:
                detail += f", via {layout.worker_server(name).name}"
            if registered and registered != "ready":
                detail += f", server says {registered}"
        out.append(Component(name, state, procs.pid(name), None, str(procs.log(name)), detail))
    return out


def shard_status(layout: StackLayout, components: list[Component]) -> dict[str, Any]:
    """Per shard, its PostgreSQL server (port, database, up or not) and its flowtide
    server (URL, up or not), and the cluster database's server; from `components`
    (what `components` returned)."""
    found = {c.name: c for c in components}

    def state(name: str) -> dict[str, Any]:
        part = found.get(name)
        running = part is not None and part.state == "running"
        return {
            "name": name,
            "state": part.state if part is not None else "stopped",
            "up": running,
            "pid": part.pid if part is not None else None,
        }

    parts = layout.pg_parts()
    shards = []
    for server in layout.servers():
        pg = next(p for p in parts if p.shard == server.shard)
        shards.append(
            {
                "shard": server.shard,
                "postgres": {
                    **state(pg.name),
                    "port": pg.pg.port,
                    "database": pg.database,
                },
                "server": {**state(server.name), "url": server.url, "port": server.port},
                "health": shard_health(layout, server.url)
                if found.get(server.name) is not None and found[server.name].state == "running"
                else None,
            }
        )
    cluster = parts[0]
    return {
        "count": layout.config.shards,
        "cluster_database": {
            **state(cluster.name),
            "port": cluster.pg.port,
            "database": cluster.database,
        },
        "shards": shards,
    }


def shard_health(layout: StackLayout, base: str) -> dict[str, float] | None:
    """A shard's backlog as its server's /metrics tells it (outbox pending and the age of
    the oldest, open executions and the age of the oldest, runs idle past the stalled
    threshold, runs failed as stalled and re-driven so far); None when it does not
    answer."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        r = layout.http_get("/metrics", base=base, **layout.admin_headers())
        if r.status_code != 200:
            return None
        samples = [s for f in text_string_to_metric_families(r.text) for s in f.samples]
    except (httpx.HTTPError, ValueError):
        return None
    out: dict[str, float] = {}
    for key, name, labels in _HEALTH:
        out[key] = sum(
            s.value for s in samples if s.name == name and labels.items() <= s.labels.items()
        )
    return out


def worker_pools(layout: StackLayout, base: str | None = None) -> list[Any] | None:
    """The worker pools as the server at `base` (shard 0's) lists them, None when it
    does not answer."""
    import httpx

    try:
        doc = layout.http_get("/api/worker/pools", base=base, **layout.admin_headers()).json()
        return list(doc["pools"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def worker_state(layout: StackLayout, name: str, pools: list[Any] | None = None) -> str | None:
    """The server's word on worker `name`: ready, lost, stopped, or None (unknown)."""
    if pools is None:
        pools = worker_pools(layout, layout.worker_server(name).url)
        if pools is None:
            return None
    pid = layout.config.pids.get(name)
    for pool in pools:
        for w in pool["workers"]:
            if w["worker_id"] == f"dev-{name}" and w["pid"] == pid:
                return str(w["status"])
    return None


def _redacted(url: str) -> str:
    from flowtide.urls import redact_url

    return redact_url(url)
