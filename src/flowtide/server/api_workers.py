"""The worker pool: registration, heartbeats (which extend the leases of the commands a
worker runs), handing commands back, the credentials a worker's commands need, and who
is serving which pool."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from flowtide.auth.principal import Principal
from flowtide.errors import AuthError, CredentialError, NotFoundError
from flowtide.server.outbox import ensure_consumer
from flowtide.server.runtime import CoordinatorDep, RegistryDep, RuntimeDep
from flowtide.server.schemas import CommandRelease, CredentialGrant, Heartbeat, PoolRegister
from flowtide.web.access import caller
from flowtide.web.problems import RequestError, problem_responses
from flowtide.wire import (
    CREDENTIALS_PATH,
    DEREGISTER_PATH,
    HEARTBEAT_PATH,
    REGISTER_PATH,
    RELEASE_PATH,
)

__all__ = ["router"]

log = logging.getLogger("flowtide.server")

router = APIRouter()

Caller = Annotated[Principal, Depends(caller)]


@router.post(
    REGISTER_PATH,
    responses=problem_responses((503, "The pool's NATS consumer cannot be created.")),
)
async def register_worker(
    body: PoolRegister, who: Caller, runtime: RuntimeDep, workers: RegistryDep
) -> dict[str, Any]:
    """Register (or renew) a worker under the caller's credential: later requests
    naming this worker id are taken from that credential only."""
    await workers.register(
        who,
        worker_id=body.worker_id,
        pool=body.pool,
        hostname=body.hostname,
        pid=body.pid,
        concurrency=body.concurrency,
    )
    if runtime.nc is not None:
        # The pool's consumer is made here, not by the worker: a worker's NATS user
        # may only pull from it (flowtide.subjects).
        try:
            await ensure_consumer(runtime.nc.jetstream(), body.pool, runtime.settings.nats_layout)
        except Exception as exc:  # noqa: BLE001 - nats-py's errors, told as a 503
            raise RequestError(
                503,
                f"cannot create the NATS consumer of pool {body.pool!r}: "
                f"{str(exc) or type(exc).__name__}",
            ) from None
    machine = await workers.lease_machine(body.worker_id)
    shards = runtime.topology.count if runtime.topology is not None else 1
    return {
        "worker_id": body.worker_id,
        "lease": runtime.settings.lease,
        "machine": machine,
        # Claims, reports and heartbeats go per shard (X-Flowtide-Shard).
        "shards": shards,
    }


@router.post(
    HEARTBEAT_PATH,
    responses=problem_responses((404, "The worker id is not registered.")),
)
async def heartbeat(
    body: Heartbeat, who: Caller, coord: CoordinatorDep, workers: RegistryDep
) -> dict[str, Any]:
    await workers.require(who, body.worker_id)
    if not await workers.heartbeat(body.worker_id, body.running):
        raise NotFoundError(f"worker {body.worker_id!r} is not registered")
    extended = await coord.extend_leases(body.worker_id, body.commands)
    reply: dict[str, Any] = {"worker_id": body.worker_id, "leases_extended": extended}
    if body.machine is not None:
        m = body.machine
        reply["machine"] = await workers.renew_machine(
            body.worker_id, m.machine_id, m.holder, m.issued_until_ms
        )
    return reply


@router.post(
    RELEASE_PATH,
    responses=problem_responses((404, "The worker id was never registered.")),
)
async def release_commands(
    body: CommandRelease, who: Caller, coord: CoordinatorDep, workers: RegistryDep
) -> dict[str, Any]:
    """Hand back commands the calling worker holds (a worker stopping after its grace
    period): each is issued again now, for any worker of the pool. Commands it does
    not hold are left alone."""
    await workers.require(who, body.worker_id)
    released = await coord.release(body.worker_id, body.commands)
    return {"worker_id": body.worker_id, "released": released}


@router.post(
    DEREGISTER_PATH,
    responses=problem_responses((404, "The worker id is not registered.")),
)
async def deregister(body: Heartbeat, who: Caller, workers: RegistryDep) -> dict[str, Any]:
    await workers.require(who, body.worker_id)
    if body.machine is not None:
        m = body.machine
        await workers.release_machine(body.worker_id, m.machine_id, m.holder, m.issued_until_ms)
    if not await workers.deregister(body.worker_id):
        raise NotFoundError(f"worker {body.worker_id!r} is not registered")
    return {"worker_id": body.worker_id, "status": "stopped"}


@router.post(
    CREDENTIALS_PATH,
    responses=problem_responses(
        (404, "No such credential, or the worker id was never registered."),
        (503, "The credential vault is unavailable (the master key)."),
    ),
)
async def worker_credential(
    body: CredentialGrant,
    request: Request,
    who: Caller,
    runtime: RuntimeDep,
    coord: CoordinatorDep,
    workers: RegistryDep,
) -> dict[str, Any]:
    """A credential's decrypted body, for a command the calling worker holds now (its
    claim is live): workers need no master key, and get nothing between commands.
    Each grant is logged (alias, command, worker; never the value)."""
    there = await runtime.elsewhere(request, body.execution_id)
    if there is not None:
        return there  # type: ignore[return-value]
    await workers.require(who, body.worker_id)
    if not await coord.holds_command(body.worker_id, body.execution_id, body.command_id):
        raise AuthError(
            f"worker {body.worker_id!r} holds no live claim on command {body.command_id}"
            f" of execution {body.execution_id}"
        )
    try:
        data = await asyncio.to_thread(runtime.vault().resolve, body.name)
    except CredentialError as exc:
        if exc.missing:
            raise NotFoundError(f"credential {body.name!r} not found") from None
        raise RequestError(503, f"credential vault unavailable: {exc}") from None
    log.info(
        "credential %r given to worker %s for command %s of execution %s",
        body.name,
        body.worker_id,
        body.command_id,
        body.execution_id,
    )
    return {"name": body.name, "data": data}


@router.get("/api/worker/pools")
async def pools(runtime: RuntimeDep, workers: RegistryDep) -> dict[str, Any]:
    rows = await workers.all()
    now = time.time()
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        alive = r.status != "stopped" and now - r.heartbeat < runtime.settings.worker_timeout
        out.setdefault(r.pool, []).append(
            {
                "worker_id": r.worker_id,
                "hostname": r.hostname,
                "pid": r.pid,
                "concurrency": r.concurrency,
                "last_heartbeat_age": round(now - r.heartbeat, 3),
                "status": r.status if alive or r.status == "stopped" else "lost",
                "running": r.running,
            }
        )
    return {"pools": [{"pool": k, "workers": v} for k, v in out.items()]}
