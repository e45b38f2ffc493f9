"""The subscriptions API of both apps (the server and `flowtide ui`), and the listeners
each long-running app runs while it serves (`listening`).

Readers list and read subscriptions; operators add, replace, pause, resume and delete
them. A subscription's document is read on the shard that owns it (the request is
forwarded there), where its firings are written and its listeners run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from pydantic import Field
from typing_extensions import TypedDict

from flowtide.documents.subscriptions import (
    SubscriptionDocument,
    SubscriptionItem,
    read_subscription,
    subscription_document,
    subscription_item,
)
from flowtide.errors import FlowtideError, NotFoundError, TriggerError
from flowtide.ids import default_generator
from flowtide.store.triggers import TriggerRow
from flowtide.triggers.listener import Listeners
from flowtide.triggers.subscription import SubscriptionSpec, subscription_from_json
from flowtide.triggers.subscriptions import define_subscription, subscription_from_fields
from flowtide.web.fields import INT32_MAX, RequestBody
from flowtide.web.problems import RequestError, problem_responses
from flowtide.web.reads import ExecutionReads, reads_of
from flowtide.web.schedules import ReadsFirer

__all__ = ["listening", "router"]

Reads = Annotated[ExecutionReads, Depends(reads_of)]
Name = Annotated[str, PathParam(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]

router = APIRouter(tags=["subscriptions"])
KIND = "subscription"


@contextlib.asynccontextmanager
async def listening(
    app: FastAPI, reads: ExecutionReads, credentials: Callable[[str], dict[str, Any]]
) -> AsyncIterator[Listeners]:
    """Run the listeners of the subscriptions `reads` owns while the app serves
    (`app.state.listeners`); `credentials(alias)` resolves a subscription's `auth`."""
    listeners = Listeners(ReadsFirer(reads), credentials)
    app.state.listeners = listeners
    task = asyncio.create_task(listeners.run(), name="flowtide-listeners")
    try:
        yield listeners
    finally:
        listeners.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        app.state.listeners = None


def _poke(request: Request) -> None:
    listeners = getattr(request.app.state, "listeners", None)
    if listeners is not None:
        listeners.changed()


class SubscriptionRequest(RequestBody):
    """A subscription: the fields of a `kind: Subscription` document's `spec:`, and its
    name."""

    name: str = Field(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    playbook: str = Field(max_length=4096, description="Catalog path of the playbook.")
    version: int | None = Field(
        None, ge=1, le=INT32_MAX, description="Catalog version (default: the latest)."
    )
    source: str | None = Field(None, max_length=64, description="nats, or a plugin's source.")
    auth: str | dict[str, Any] | None = Field(
        None, description="Credential alias with the server's url and login."
    )
    url: str | None = Field(None, max_length=2048, description="Server URL (overrides auth's).")
    subject: str | None = Field(None, max_length=255, description="Core subject, or a filter.")
    stream: str | None = Field(None, max_length=255, description="JetStream stream.")
    consumer: str | None = Field(None, max_length=255, description="Durable consumer name.")
    workload: dict[str, Any] | None = Field(
        None, description="The run's workload; templates see `message` (or `messages`)."
    )
    batch: dict[str, Any] | int | None = Field(None, description="{size, max_wait}")
    rate: str | float | None = Field(None, description="Messages per second at most: `100/s`.")
    ack_wait: str | float | None = Field(None, description="JetStream ack wait: `30s`.")
    max_deliver: int | None = Field(None, ge=1, description="Deliveries of a refused message.")
    paused: bool | None = None
    config: dict[str, Any] | None = Field(None, description="A plugin source's fields.")
    description: str | None = Field(None, max_length=1000)
    replace: bool = Field(False, description="Replace a subscription of this name.")


class SubscriptionList(TypedDict):
    items: list[SubscriptionItem]


def _refused(exc: FlowtideError) -> RequestError:
    field = getattr(exc, "field", None) or "subscription"
    message = getattr(exc, "message", None) or str(exc)
    return RequestError(400, str(message), field=field)


async def _row(reads: ExecutionReads, name: str) -> tuple[TriggerRow, SubscriptionSpec]:
    try:
        row = await asyncio.to_thread(reads.store.get_trigger, KIND, name)
    except NotFoundError:
        raise RequestError(404, f"no subscription named {name!r}") from None
    return row, subscription_from_json(row.spec)


def _listener_status(request: Request, trigger_id: int) -> dict[str, Any] | None:
    listeners = getattr(request.app.state, "listeners", None)
    if listeners is None:
        return None
    status: dict[str, Any] | None = listeners.status(trigger_id)
    return status


@router.get("/api/subscriptions")
async def list_subscriptions(reads: Reads) -> SubscriptionList:
    """Every subscription by name."""
    rows = await asyncio.to_thread(reads.store.list_triggers, KIND)
    return {"items": [subscription_item(r, subscription_from_json(r.spec)) for r in rows]}


@router.post(
    "/api/subscriptions",
    status_code=201,
    responses=problem_responses((400, "An invalid field, named."), 409),
)
async def add_subscription(
    body: SubscriptionRequest, request: Request, reads: Reads
) -> SubscriptionDocument:
    """Add a subscription (or replace one, with `replace`). The playbook must be in the
    catalog. The servers of the shard that owns it start listening within seconds."""
    fields = body.model_dump(exclude={"name", "replace"})
    try:
        spec = subscription_from_fields(body.name, fields)
    except TriggerError as exc:
        raise _refused(exc) from None

    def define() -> TriggerRow:
        return define_subscription(
            reads.store,
            spec,
            new_id=default_generator().next_id,
            now=time.time(),
            local=False,
            replace_existing=body.replace,
        )

    try:
        row = await asyncio.to_thread(define)
    except TriggerError as exc:
        if exc.field == "name":
            raise RequestError(409, str(exc), field="name") from None
        raise _refused(exc) from None
    _poke(request)
    return subscription_document(row, subscription_from_json(row.spec), firings=[])


@router.get("/api/subscriptions/{name}", responses=problem_responses(404))
async def get_subscription(name: Name, request: Request, reads: Reads) -> SubscriptionDocument:
    """A subscription: its definition, latest firings (failed ones with why), latest runs
    (one per message or batch) and refused messages and, from a process that runs it,
    its listener's state (read on the shard that owns it)."""
    row, spec = await _row(reads, name)
    there = await reads.route_to(request, row.trigger_id)
    if there is not None:
        return there  # type: ignore[return-value]  # the owning shard's answer
    listener = _listener_status(request, row.trigger_id)
    return await asyncio.to_thread(read_subscription, reads.store, row, spec, listener=listener)


@router.delete("/api/subscriptions/{name}", status_code=204, responses=problem_responses(404))
async def delete_subscription(name: Name, request: Request, reads: Reads) -> Response:
    """Delete a subscription: its listeners stop (a JetStream consumer stays, for the
    stream's owner to remove; the runs it started stay, and say it started them)."""
    try:
        await asyncio.to_thread(reads.store.delete_trigger, KIND, name)
    except NotFoundError:
        raise RequestError(404, f"no subscription named {name!r}") from None
    _poke(request)
    return Response(status_code=204)


async def _set_paused(
    name: str, paused: bool, request: Request, reads: ExecutionReads
) -> SubscriptionItem:
    try:
        row = await asyncio.to_thread(
            reads.store.set_trigger_paused, KIND, name, paused, now=time.time()
        )
    except NotFoundError:
        raise RequestError(404, f"no subscription named {name!r}") from None
    _poke(request)
    return subscription_item(row, subscription_from_json(row.spec))


@router.post("/api/subscriptions/{name}/pause", responses=problem_responses(404))
async def pause_subscription(name: Name, request: Request, reads: Reads) -> SubscriptionItem:
    """Pause: its listeners stop; JetStream messages wait in the stream."""
    return await _set_paused(name, True, request, reads)


@router.post("/api/subscriptions/{name}/resume", responses=problem_responses(404))
async def resume_subscription(name: Name, request: Request, reads: Reads) -> SubscriptionItem:
    """Resume: its listeners start again where the consumer is."""
    return await _set_paused(name, False, request, reads)
