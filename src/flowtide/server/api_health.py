"""Liveness, readiness and the Prometheus metrics of a server process."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from flowtide.server import metrics
from flowtide.server.runtime import RuntimeDep
from flowtide.server.schemas import Readiness
from flowtide.store import pg

__all__ = ["router"]

router = APIRouter()

#: Seconds the KV check of /readyz waits for the bucket's status.
KV_TIMEOUT = 2.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "A check failed: not ready."}},
)
async def readyz(runtime: RuntimeDep) -> JSONResponse:
    checks: dict[str, str] = {}

    def ping() -> None:
        with runtime.store.transaction("readyz") as conn:
            pg.ping(conn)

    try:
        await asyncio.to_thread(ping)
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        checks["database"] = f"error: {exc}"
    if runtime.nc is not None:
        checks["nats"] = "ok" if runtime.nc.is_connected else "disconnected"
    if runtime.kv is not None:
        # The loop-state bucket answers (a JetStream stream info; in memory: at once).
        try:
            await asyncio.wait_for(runtime.kv.status(), KV_TIMEOUT)
            checks["kv"] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            checks["kv"] = f"error: {type(exc).__name__}: {exc}"[:300]
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"ready": ok, "checks": checks}, 200 if ok else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "The Prometheus text exposition format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def prometheus_metrics(runtime: RuntimeDep) -> Response:
    """Prometheus text format: counters of every server process, gauges read from
    the database now (see flowtide.server.metrics)."""
    body = await asyncio.to_thread(metrics.exposition, runtime.store, runtime.open_executions)
    return Response(body, media_type=metrics.CONTENT_TYPE)
