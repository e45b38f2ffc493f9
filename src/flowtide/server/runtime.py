"""What one server process holds while it runs (store, KV, NATS connection,
coordinator, outbox relay, worker registry, authenticator), and the FastAPI dependencies
through which the routes reach it.

The app keeps its `Runtime` in `app.state.runtime`; a route asks for the part it needs
(`CoordinatorDep`, `RegistryDep`, `RuntimeDep`), so the routers are plain modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import Response

from flowtide import topology, trace, tracing
from flowtide.auth.oidc import JwtVerifier
from flowtide.errors import AuthError
from flowtide.ids import default_generator
from flowtide.machines import MachineLease, holder_name
from flowtide.notify.relay import NotificationRelay
from flowtide.redaction import install_log_masking
from flowtide.server import metrics
from flowtide.server.coordinator import Coordinator
from flowtide.server.deadlines import DeadlineWatch
from flowtide.server.forwarding import Peers, ShardUnavailable, forwarded
from flowtide.server.notifying import start_notifications
from flowtide.server.outbox import OutboxRelay, OutboxStore
from flowtide.server.retention import RetentionWatch
from flowtide.server.servers import ServerRegistry
from flowtide.server.settings import ServerSettings
from flowtide.server.stalls import StallWatch
from flowtide.server.vault import ServerVault, server_home
from flowtide.server.worker_registry import WorkerRegistry
from flowtide.sharding import shard_for
from flowtide.web.access import Authenticator
from flowtide.web.errors import serving_shard
from flowtide.web.problems import error_response
from flowtide.wire import FORWARDED_HEADER

__all__ = [
    "CoordinatorDep",
    "OutboxDep",
    "RegistryDep",
    "Runtime",
    "RuntimeDep",
    "coordinator",
    "outbox",
    "registry",
    "runtime",
]

log = logging.getLogger("flowtide.server")

#: Seconds between two reads of a cluster's shard map (the `shard_endpoint` table).
MAP_EVERY = 5.0

#: Connections per pool of one server process (PostgreSQL's default max_connections is
#: 100: mind --workers N times this, times the number of servers).
_POOL_SIZE = 16


class Runtime:
    """What one server process holds: store, KV, NATS connection, coordinator, relay."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.store: Any = None
        self.kv: Any = None
        #: Where the next new top-level execution goes (`placed`): shards in turn.
        self._placement = itertools.count(secrets.randbelow(1 << 16))
        self.nc: Any = None
        self.coordinator: Coordinator | None = None
        self.relay: OutboxRelay | None = None
        self.notifications: NotificationRelay | None = None
        self.outbox: OutboxStore | None = None
        #: The open executions of /metrics, read at most every few seconds.
        self.open_executions: metrics.OpenExecutionsReader | None = None
        self.auth: Authenticator | None = None
        self.workers: WorkerRegistry | None = None
        self._vault: ServerVault | None = None
        self._vault_store: Any = None
        self.tasks: list[asyncio.Task[None]] = []
        self.machine: MachineLease | None = None
        self.servers: ServerRegistry | None = None
        self.topology: topology.Topology | None = None
        #: The other shards' servers (a cluster of several shards only).
        self.peers: Peers | None = None
        #: Why the last map read was not taken (a changed number of shards), or None.
        self.map_problem: str | None = None
        self._reload = asyncio.Event()

    async def start(self) -> None:
        from flowtide.errors import NatsError
        from flowtide.kv import KVError, connect
        from flowtide.loopstate import LoopState, retrying
        from flowtide.store.postgres import PostgresStore

        s = self.settings
        # Secrets this process meets (executions' secret sets) are masked in its logs.
        install_log_masking()
        trace.start("server")
        tracing.start("server")
        # Which database is this process's: its shard's, and the cluster database
        # (flowtide.topology: a shard list, the cluster database's shard map, or --db).
        self.topology = await asyncio.to_thread(
            lambda: topology.load(
                db=s.db, shards=s.shards, cluster_db=s.cluster_db, home=server_home()
            )
        )
        shard = self.topology.served_shard(s.shard_index)
        serving_shard(shard.index, self.topology.count)
        cluster = None if self.topology.cluster == shard.dsn else self.topology.cluster
        self.store = await asyncio.to_thread(
            lambda: PostgresStore(shard.dsn, cluster_dsn=cluster, max_size=_POOL_SIZE)
        )
        self.servers = ServerRegistry(self.store, shard.index, s.advertise_url)
        await self.servers.start()
        if self.topology.count > 1:
            from flowtide.tls import client_tls

            tls = client_tls("", home=server_home())
            self.peers = Peers(self.servers, verify=tls.context())
        # Blocking database calls run in threads: more threads than the pool has
        # connections, so a burst of requests waiting for a connection cannot take every
        # thread from the steps that hold one (see Coordinator's step_slots).
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(_POOL_SIZE * 2, thread_name_prefix="flowtide-db")
        )
        # A machine id of its own for this process's ids (flowtide.machines): event,
        # command and execution ids are primary keys that every process writes.
        self.machine = MachineLease(self.store, holder_name("server"), default_generator())
        await asyncio.to_thread(self.machine.acquire)
        self.tasks.append(asyncio.create_task(self.machine.keep(), name="flowtide-machine-id"))
        self.outbox = OutboxStore(self.store)
        self.open_executions = metrics.OpenExecutionsReader(self.store, s.stalled_after)
        self.workers = WorkerRegistry(self.store, worker_timeout=s.worker_timeout)
        self.auth = await asyncio.to_thread(self._authenticator)
        layout = s.nats_layout
        # A NATS cluster that has just started (or lost a node) may take seconds to give
        # the bucket a leader: waited for, within a minute.
        try:
            self.kv = await retrying(
                lambda: connect(
                    s.kv,
                    s.kv_bucket,
                    ttl=3600,
                    replicas=layout.replicas,
                    storage="memory" if layout.storage == "memory" else "file",
                    placement=layout.kv_placement(),
                    # A bucket made with other settings is brought to these (storage refused).
                    apply=True,
                    nats_auth=s.nats_auth,
                ),
                budget=60.0,
            )
        except KVError as exc:
            if "not clustered" in exc.message:
                raise NatsError(
                    f"{exc.message}: set FLOWTIDE_NATS_REPLICAS=1 (--nats-replicas 1) or run"
                    " a NATS cluster (`flowtide dev up --nats-cluster 3`)"
                ) from None
            if "storage" in exc.message:
                raise NatsError(
                    f"{exc.message}. For the loop-state bucket: keep FLOWTIDE_NATS_STORAGE"
                    " (--nats-storage) as it was, or remove the bucket while no run is in"
                    f" flight (`nats kv rm {s.kv_bucket}`) and start the server again"
                ) from None
            raise
        self.coordinator = Coordinator(
            self.store,
            ids=default_generator(),
            loopstate=LoopState(self.kv),
            local_kv=s.kv.startswith("memory:"),
            lease=s.lease,
            step_slots=_POOL_SIZE - 4,
            cache_bytes=s.state_cache_bytes,
            shard=shard.index,
            shards=self.topology.count,
        )
        if s.nats:
            from flowtide.natsauth import connect_nats

            self.nc = await connect_nats(s.nats, s.nats_auth, name="flowtide-server")
            self.relay = OutboxRelay(self.store, self.nc, layout=layout)
            self.coordinator.on_outbox = self.relay.poke
            self.coordinator.publish = self.relay.publish
            await self.relay.start()
        self.notifications = start_notifications(
            self.store,
            self.coordinator,
            credentials=self.vault(),
            advertise_url=s.advertise_url,
            loop=asyncio.get_running_loop(),
        )
        self.tasks.append(asyncio.create_task(self._reaper(), name="flowtide-reaper"))
        self.tasks.append(
            asyncio.create_task(DeadlineWatch(self.coordinator).run(), name="flowtide-deadlines")
        )
        if s.retention is not None:
            self.tasks.append(
                asyncio.create_task(
                    RetentionWatch(
                        self.store,
                        s.retention,
                        # One server of the shard per round when they share a bucket.
                        kv=None if s.kv.startswith("memory:") else self.kv,
                        shard=shard.index,
                        holder=holder_name("server"),
                    ).run(),
                    name="flowtide-retention",
                )
            )
        if s.stalled_after > 0:
            self.tasks.append(
                asyncio.create_task(
                    StallWatch(self.coordinator, s.stalled_after).run(), name="flowtide-stalls"
                )
            )
        self.tasks.append(asyncio.create_task(self._watch_map(), name="flowtide-shard-map"))
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            # SIGHUP: read the map now (one process; uvicorn's supervisor of --workers N
            # takes SIGHUP itself and restarts its processes one by one, which read it).
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._reload.set)
        metrics.process_started()

    def route_context(self) -> tuple[int, int, str, Peers | None] | None:
        """What `Forwarder` needs: (own shard, shards, server id, peers); None until
        started."""
        if self.topology is None or self.servers is None:
            return None
        return self.servers.shard, self.topology.count, self.servers.server_id, self.peers

    def fan_out(self, request: Request) -> tuple[int, int, str, Peers] | None:
        """(own shard, shards, server id, peers) when a cluster-wide read is to ask every
        shard: a cluster of several shards, and a request no server forwarded here (that
        one asks for this shard's part only)."""
        ctx = self.route_context()
        if ctx is None or FORWARDED_HEADER in request.headers:
            return None
        own, shards, server_id, peers = ctx
        if peers is None or shards <= 1:
            return None
        return own, shards, server_id, peers

    async def elsewhere(self, request: Request, execution_id: int) -> Response | None:
        """For a route whose body (or query) names the execution: None when this shard
        owns it; else the answer of the owner's servers (the request forwarded once), or
        421 for a request that was forwarded here already."""
        ctx = self.route_context()
        if ctx is None or ctx[1] <= 1:
            return None
        own, shards, server_id, peers = ctx
        home = shard_for(execution_id, shards)
        if home == own:
            return None
        if peers is None or FORWARDED_HEADER in request.headers:
            return error_response(
                421, f"this server serves shard {own}; execution {execution_id} is shard {home}'s"
            )
        return await forwarded(peers, home, server_id, request)  # type: ignore[no-any-return]

    async def placed(self, request: Request, chosen: int | None) -> Response | None:
        """For a new top-level execution: None when it is to be created here; else the
        answer of the shard it is placed on (the request forwarded once). Without
        `chosen`, the next shard in turn (each process starts at a random one):
        executions spread evenly over the cluster whichever server a client reaches (a
        client's keep-alive connection sticks to one). A shard that cannot take it (no server answers, or a 5xx) makes it land here; a
        chosen one answers as it does."""
        ctx = self.route_context()
        if ctx is None or ctx[1] <= 1 or FORWARDED_HEADER in request.headers:
            return None
        own, shards, server_id, peers = ctx
        if chosen is not None and chosen >= shards:
            return error_response(
                400, f"shard {chosen}: the cluster has {shards} (0..{shards - 1})"
            )
        target = chosen if chosen is not None else next(self._placement) % shards
        if target == own or peers is None:
            return None
        try:
            answer: Response = await forwarded(peers, target, server_id, request)
        except ShardUnavailable:
            if chosen is not None:
                raise
            return None
        if answer.status_code >= 500 and chosen is None:
            # That shard cannot take it now (its database down...): it runs here.
            return None
        return answer

    def vault(self) -> ServerVault:
        """The credential vault over this runtime's store (the key is loaded once)."""
        if self._vault is None or self._vault_store is not self.store:
            self._vault = ServerVault(self.store, server_home())
            self._vault_store = self.store
        return self._vault

    def _authenticator(self) -> Authenticator:
        """Tokens of the cluster database, and JWTs when configured. Without either way
        in (no active token, no JWKS), the server would answer nobody: it refuses."""
        from flowtide.auth.sessions import PgSessions, Sessions
        from flowtide.auth.tokens import TokenStore

        s = self.settings
        if s.insecure_no_auth:
            log.warning(
                "AUTHENTICATION IS OFF (--insecure-no-auth): anyone who reaches this server"
                " can run code on its workers and change its credentials"
            )
            return Authenticator(None, insecure=True)
        tokens = TokenStore(self.store)
        if s.jwt is None and not tokens.any_active():
            raise AuthError(
                "no way to authenticate: the database has no active API token and no JWKS"
                " URL is set. Create an admin token with `flowtide token create --role admin"
                " --db URL`, or give --jwks-url, or (on a trusted machine only)"
                " --insecure-no-auth",
                status=401,
            )
        return Authenticator(
            tokens,
            JwtVerifier(s.jwt) if s.jwt else None,
            # The web UI's sessions: in the cluster database, so every server takes them.
            sessions=Sessions(PgSessions(self.store)),
        )

    async def _watch_map(self) -> None:
        """Read the map again on SIGHUP, and every MAP_EVERY seconds when it is the
        cluster database's table."""
        assert self.topology is not None
        every = MAP_EVERY if self.topology.source == "table" else None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload.wait(), every)
            self._reload.clear()
            try:
                await self.reload_map()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep the map it has, say why
                log.warning("shard map not read again: %s", exc)

    async def reload_map(self) -> None:
        """Take the shard map as it is now: a shard moved to a new address is used there
        (this process's own database included, without dropping calls in flight); a
        changed number of shards is refused (no re-sharding) and the map kept."""
        s = self.settings
        old = self.topology
        assert old is not None and self.servers is not None
        new = await asyncio.to_thread(
            lambda: topology.load(
                db=s.db, shards=s.shards, cluster_db=s.cluster_db, home=server_home()
            )
        )
        if new.count != old.count:
            problem = (
                f"the shard map now has {new.count} shard{'s' if new.count != 1 else ''};"
                f" this server started with {old.count}: the number of shards cannot change"
                " (executions stay on the shard their id hashes to; no re-sharding). The map"
                " it had is kept; put the map back, or move shards to new addresses instead"
            )
            if problem != self.map_problem:
                log.error("%s", problem)
            self.map_problem = problem
            return
        self.map_problem = None
        own = self.servers.shard
        moved = new.shard(own)
        if moved.dsn != old.shard(own).dsn:
            await asyncio.to_thread(self.store.move_shard, moved.dsn)
            log.warning("shard %d: its database is now %s", own, moved.display)
        self.topology = new

    async def _reaper(self) -> None:
        assert self.coordinator is not None
        while True:
            await asyncio.sleep(self.settings.reap_interval)
            try:
                await self.coordinator.reap()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep reaping
                log.warning("reaper: %s", exc)

    async def stop(self) -> None:
        metrics.process_stopped()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.relay is not None:
            await self.relay.stop()
        if self.notifications is not None:
            await asyncio.to_thread(self.notifications.stop)
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        if self.kv is not None:
            with contextlib.suppress(Exception):
                await self.kv.close()
        if self.peers is not None:
            await self.peers.close()
        if self.servers is not None:
            await self.servers.stop()
        if self.machine is not None:
            await asyncio.to_thread(self.machine.release)
        if self.store is not None:
            await asyncio.to_thread(self.store.close)


# The dependencies are coroutines: FastAPI runs a plain function dependency in a worker
# thread, a hop per request that the claim and report paths would pay for nothing.


async def runtime(request: Request) -> Runtime:
    """The runtime of the app serving the request."""
    held: Runtime = request.app.state.runtime
    return held


async def coordinator(request: Request) -> Coordinator:
    held = (await runtime(request)).coordinator
    assert held is not None, "the app has not started"
    return held


async def registry(request: Request) -> WorkerRegistry:
    held = (await runtime(request)).workers
    assert held is not None, "the app has not started"
    return held


async def outbox(request: Request) -> OutboxStore:
    held = (await runtime(request)).outbox
    assert held is not None, "the app has not started"
    return held


RuntimeDep = Annotated[Runtime, Depends(runtime)]
CoordinatorDep = Annotated[Coordinator, Depends(coordinator)]
RegistryDep = Annotated[WorkerRegistry, Depends(registry)]
OutboxDep = Annotated[OutboxStore, Depends(outbox)]
