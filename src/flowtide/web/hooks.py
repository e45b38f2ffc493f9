"""Webhooks, one router for every app that serves them (the server, `flowtide ui`,
`flowtide scheduler`): list, add, read and delete hooks, and the delivery endpoint.

`POST /api/hooks/{name}` is public (no token) but signed (`flowtide.triggers.hooks.verify`:
HMAC-SHA256 of the raw body with the hook's secret, compared in constant time; with
`X-Flowtide-Timestamp`, a replay window). A delivery is refused with 401 when it is not
signed with the hook's secret, and an unknown name gets the same 401 (names cannot be
probed); a delivery id seen within the dedup window answers 200 with the run it started;
past the hook's rate, 429 with `Retry-After` (counted per server process); the body is
capped by the app's Gate like any other (413). A new run: 202.

In a cluster of several shards, a hook is its shard's (`shard_for(trigger_id, n)`): a
server of another shard checks the signature and sends a signed delivery on, raw body
and headers intact, once (`ShardedReads.trigger_elsewhere`), so its firing and its run
are written in the owner's one transaction and a delivery sent to two servers starts one
run. (A forged one is refused where it lands: it costs no forward, and a known name of
another shard answers as fast as an unknown name.)

Refused deliveries are kept in the memory of the process that refused them (the latest
50 of each hook, `flowtide.triggers.hooks.Refusals`): a flood of bad requests costs no writes.
Accepted ones are the hook's firings in the store.

Mount `router` on any FastAPI app whose `app.state.reads` is an `ExecutionReads`, behind
`flowtide.web.access.Gate` (it caps the body, and lets the delivery through without a
token: `PUBLIC_REQUESTS`) and an `authorizer` over `RULES`. Its settings
(`flowtide.settings.HooksSection`) are read on the first request, or given as
`app.state.hooks = HookDesk(...)` (tests inject the clocks there).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Final, Protocol, TypeVar, runtime_checkable

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response
from pydantic import Field
from typing_extensions import TypedDict

from flowtide import tracing
from flowtide.errors import (
    AlreadyFired,
    CredentialError,
    NotFoundError,
    PlaybookError,
    TemplateError,
    TriggerError,
)
from flowtide.store.triggers import Firing
from flowtide.triggers.hooks import (
    HOOK,
    RateLimits,
    Refusals,
    decode_body,
    delivery_id,
    delivery_workload,
    hook_secret,
    shown_headers,
    verify,
)
from flowtide.web.fields import INT32_MAX, RequestBody
from flowtide.web.problems import RequestError, error_response, problem_responses
from flowtide.web.reads import ExecutionReads, reads_of
from flowtide.wire import TRACEPARENT_HEADER

if TYPE_CHECKING:
    from flowtide.playbook.model import Playbook
    from flowtide.store.base import Store
    from flowtide.store.triggers import FiringRow, TriggerRow

__all__ = [
    "HookDesk",
    "HookDocument",
    "HookItem",
    "ShardedReads",
    "hook_document",
    "hook_item",
    "router",
]

T = TypeVar("T")
Reads = Annotated[ExecutionReads, Depends(reads_of)]
HookName = Annotated[str, PathParam(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")]
#: How long a hook's definition, secret and playbook are reused before being read again
#: (a changed secret or a deleted hook takes effect within it).
_FRESH: Final = 2.0
#: Generations of one delivery id (a sender reusing an id after the dedup window).
_GENERATIONS: Final = 16
#: The largest body checked and parsed on the event loop (larger: in a thread).
_INLINE_BODY: Final = 64 * 1024
#: Unknown names remembered at most (the oldest forgotten first).
_MAX_UNKNOWN: Final = 10_000
#: What an unknown name is checked against: a signature never verifies with it.
_NO_SECRET: Final = os.urandom(32)


@runtime_checkable
class ShardedReads(Protocol):
    """A read port of a cluster of several shards: a hook's requests go to its shard."""

    async def trigger_elsewhere(self, request: Request, trigger_id: int) -> Response | None:
        """None when this process's shard owns the trigger; else the owner's answer to
        the request (sent on once, body and headers intact)."""
        ...


@dataclass
class _Hook:
    row: TriggerRow
    secret: bytes
    read_at: float


@dataclass
class HookDesk:
    """What the hooks of one app hold in its process: settings, clocks, rate buckets,
    refused deliveries, and definitions read lately."""

    replay_window: float = 300.0
    dedup_window: float = 86400.0
    default_rate: float = 50.0
    #: Wall seconds (timestamps, dedup window).
    clock: Callable[[], float] = time.time
    #: Monotonic seconds (rate buckets, caches).
    monotonic: Callable[[], float] = time.monotonic
    limits: RateLimits = field(default_factory=RateLimits)
    refusals: Refusals = field(default_factory=Refusals)
    _hooks: dict[str, _Hook] = field(default_factory=dict)
    #: Names found to be no hook, and when: an unknown name costs what a known one does
    #: (one store read per _FRESH s), so neither its timing nor a flood tells names apart.
    _unknown: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _playbooks: dict[str, tuple[float, Playbook, int | None]] = field(default_factory=dict)

    @classmethod
    def from_settings(cls) -> HookDesk:
        from flowtide.settings import HooksSection, current

        s = current(HooksSection)
        return cls(replay_window=s.replay_window, dedup_window=s.dedup_window, default_rate=s.rate)

    async def hook(self, store: Store, name: str) -> _Hook | None:
        """Hook `name` and its secret (None: no such hook), read again after _FRESH s."""
        now = self.monotonic()
        held = self._hooks.get(name)
        if held is not None and now - held.read_at < _FRESH:
            return held
        missing = self._unknown.get(name)
        if missing is not None and now - missing < _FRESH:
            return None

        def read() -> _Hook | None:
            try:
                row = store.get_trigger(HOOK, name)
                secret = hook_secret(store, name)
            except NotFoundError:
                return None
            return _Hook(row, secret, now)

        found = await asyncio.to_thread(read)
        if found is None:
            self._hooks.pop(name, None)
            self._unknown[name] = now
            self._unknown.move_to_end(name)
            while len(self._unknown) > _MAX_UNKNOWN:
                self._unknown.popitem(last=False)
        else:
            self._unknown.pop(name, None)
            if len(self._hooks) >= 10_000:
                self._hooks.clear()
            self._hooks[name] = found
        return found

    def forget(self, name: str) -> None:
        self._hooks.pop(name, None)
        self._unknown.pop(name, None)
        self.refusals.forget(name)

    async def playbook(self, store: Store, ref: dict[str, Any]) -> tuple[Playbook, int | None]:
        """The playbook a hook starts (read and parsed again after _FRESH s)."""
        from flowtide.triggers.targets import load_target

        key = json.dumps(ref, sort_keys=True)
        now = self.monotonic()
        held = self._playbooks.get(key)
        if held is not None and now - held[0] < _FRESH:
            return held[1], held[2]
        playbook, version = await asyncio.to_thread(load_target, store, ref)
        if len(self._playbooks) >= 1000:
            self._playbooks.clear()
        self._playbooks[key] = (now, playbook, version)
        return playbook, version


def desk_of(request: Request) -> HookDesk:
    """The app's `HookDesk`, made from the settings on first use."""
    desk: HookDesk | None = getattr(request.app.state, "hooks", None)
    if desk is None:
        desk = request.app.state.hooks = HookDesk.from_settings()
    return desk


Desk = Annotated[HookDesk, Depends(desk_of)]


# -- documents -----------------------------------------------------------------------------


class HookItem(TypedDict):
    name: str
    trigger_id: str
    playbook: dict[str, Any]
    workload: dict[str, Any] | None
    rate: float | None
    url: str
    created: float
    updated: float


class Delivery(TypedDict):
    delivery: str
    execution_id: str | None
    status: str
    #: The status of the run it started (running, completed, failed, cancelled).
    execution_status: str | None
    time: float


class Refused(TypedDict):
    time: float
    status: int
    why: str
    delivery: str | None


class HookDocument(HookItem):
    deliveries: list[Delivery]
    refused: list[Refused]


class HookList(TypedDict):
    items: list[HookItem]


class Delivered(TypedDict):
    execution_id: str | None
    status: str
    delivery: str | None


def hook_document(
    row: TriggerRow, firings: list[FiringRow], refused: list[dict[str, Any]]
) -> HookDocument:
    """A hook as `GET /api/hooks/{name}` and `flowtide hook show` give it: never its
    secret; its latest deliveries (`firings`) and refusals (of one process)."""
    return {
        **hook_item(row),
        "deliveries": [
            {
                "delivery": f.key,
                "execution_id": None if f.execution_id is None else str(f.execution_id),
                "status": f.status,
                "execution_status": f.execution_status,
                "time": f.time,
            }
            for f in firings
        ],
        "refused": [
            {"time": r["time"], "status": r["status"], "why": r["why"], "delivery": r["delivery"]}
            for r in refused
        ],
    }


def hook_item(row: TriggerRow) -> HookItem:
    """A hook as lists show it (never its secret)."""
    spec = row.spec
    return {
        "name": row.name,
        "trigger_id": str(row.trigger_id),
        "playbook": dict(spec.get("playbook") or {}),
        "workload": spec.get("workload"),
        "rate": spec.get("rate"),
        "url": f"/api/hooks/{row.name}",
        "created": row.created,
        "updated": row.updated,
    }


class HookRequest(RequestBody):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    playbook: str = Field(
        min_length=1, max_length=1024, description="Catalog path of the playbook it starts."
    )
    version: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = Field(
        None, description="Catalog version (default: the latest at each delivery)."
    )
    workload: dict[str, Any] | None = Field(
        None,
        description="The run's workload as templates over `hook.body`, `hook.headers`,"
        " `hook.delivery` (default: {body, headers, delivery}).",
    )
    rate: str | float | None = Field(
        None, description="Deliveries allowed per second (N/s, N/m, N/h), per server process."
    )
    secret: str | None = Field(
        None, max_length=8192, repr=False, description="The HMAC secret (never shown again)."
    )
    secret_credential: str | None = Field(
        None, max_length=256, description="Or: the credential alias whose value is the secret."
    )


router = APIRouter(tags=["hooks"])


@router.get("/api/hooks")
async def list_hooks(reads: Reads) -> HookList:
    """Every hook (never a secret)."""
    rows = await asyncio.to_thread(reads.store.list_triggers, HOOK)
    return {"items": [hook_item(r) for r in rows]}


@router.post(
    "/api/hooks",
    status_code=201,
    responses=problem_responses((404, "No such catalog playbook or credential.")),
)
async def add_hook(body: HookRequest, reads: Reads, desk: Desk) -> HookItem:
    """Add a hook (or replace the one of that name: it keeps its id, shard and firings)."""
    from flowtide.triggers.hooks import add_hook as store_hook
    from flowtide.triggers.hooks import credential_secret, store_sealer
    from flowtide.triggers.targets import playbook_ref

    if (body.secret is None) == (body.secret_credential is None):
        raise RequestError.of_field("secret", "give exactly one of secret, secret_credential")
    store = reads.store

    def add() -> TriggerRow:
        ref = playbook_ref(body.playbook, version=body.version, local=reads.local)
        if "path" in ref:
            store.get_playbook(ref["path"], ref.get("version"))  # NotFoundError: 404
        if body.secret_credential is not None:
            from flowtide.credentials import CredentialVault

            vault = CredentialVault(store, store_sealer(store).key.home)
            secret = credential_secret(
                vault.resolve(body.secret_credential), body.secret_credential
            )
        else:
            secret = (body.secret or "").encode()
        return store_hook(
            store, body.name, ref, secret=secret, workload=body.workload, rate=body.rate
        )

    try:
        row = await asyncio.to_thread(add)
    except TriggerError as exc:
        raise RequestError.of_field(exc.field or "body", str(exc)) from None
    except CredentialError as exc:
        status = 404 if exc.missing else 422
        raise RequestError.of_field("secret_credential", str(exc), status) from None
    desk.forget(row.name)
    return hook_item(row)


@router.get("/api/hooks/{name}", responses=problem_responses(404))
async def get_hook(name: HookName, request: Request, reads: Reads, desk: Desk) -> HookDocument:
    """A hook, its latest deliveries (the runs they started) and the latest refused
    ones with why (those this server process refused: see the module)."""
    store = reads.store
    row = await asyncio.to_thread(store.get_trigger, HOOK, name)
    if isinstance(reads, ShardedReads):
        there = await reads.trigger_elsewhere(request, row.trigger_id)
        if there is not None:
            return there  # type: ignore[return-value]  # the owning shard's answer
    firings = await asyncio.to_thread(store.firings, row.trigger_id, limit=50)
    return hook_document(row, firings, desk.refusals.of(name))


@router.delete("/api/hooks/{name}", responses=problem_responses(404))
async def delete_hook(name: HookName, reads: Reads, desk: Desk) -> dict[str, str]:
    """Delete a hook (the runs it started stay, with their trigger)."""
    await asyncio.to_thread(reads.store.delete_trigger, HOOK, name)
    desk.forget(name)
    return {"deleted": name}


@router.post(
    "/api/hooks/{name}",
    status_code=202,
    openapi_extra={
        "requestBody": {
            "content": {
                "application/json": {"schema": {}},
                "application/x-www-form-urlencoded": {"schema": {"type": "object"}},
                "text/plain": {"schema": {"type": "string"}},
            }
        }
    },
    responses={
        200: {"description": "A delivery id seen before: the run it started, nothing new."},
        **problem_responses(
            (400, "The body or the delivery id is malformed."),
            (401, "Not signed with the hook's secret (or no such hook), or a stale timestamp."),
            (409, "The hook's playbook cannot start (missing, invalid, or the hook paused)."),
            (429, "Over the hook's rate (see Retry-After)."),
        ),
    },
)
async def deliver(name: HookName, request: Request, reads: Reads, desk: Desk) -> Any:
    """Deliver to a hook: a signed body starts one run of its playbook (see the module)."""
    body = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    hook = await desk.hook(reads.store, name)
    now = desk.clock()
    why = await _off_loop(
        len(body),
        lambda: verify(
            hook.secret if hook is not None else _NO_SECRET,
            body,
            headers,
            now=now,
            window=desk.replay_window,
        ),
    )

    def refuse(status: int, message: str, delivery: str | None = None, **extra: Any) -> Any:
        if hook is not None:
            desk.refusals.add(name, status, message, delivery, now)
        response = error_response(status, message)
        response.headers.update(extra)
        return response

    if why is not None:
        return refuse(401, f"delivery refused: {why}")
    assert hook is not None  # an unknown name never verifies
    if isinstance(reads, ShardedReads):
        # Signed: on to the shard that owns the hook (only then: a forged delivery costs
        # no forward, and a known name answers as fast as an unknown one).
        there = await reads.trigger_elsewhere(request, hook.row.trigger_id)
        if there is not None:
            return there
    try:
        delivery = delivery_id(headers)
    except TriggerError as exc:
        return refuse(400, str(exc))
    if hook.row.paused:
        return refuse(409, f"hook {name!r} is paused", delivery)
    spec = hook.row.spec
    rate = float(spec.get("rate") or desk.default_rate)
    wait = desk.limits.take(hook.row.trigger_id, rate, desk.monotonic())
    if wait > 0:
        retry = max(1, math.ceil(wait))
        return refuse(
            429, f"over the hook's rate ({rate:g}/s)", delivery, **{"Retry-After": str(retry)}
        )
    key, seen = await _firing_key(reads.store, hook.row.trigger_id, delivery, now, desk)
    if seen is not None:
        return _duplicate(seen.execution_id, delivery)
    try:
        workload = await _off_loop(
            len(body),
            lambda: delivery_workload(
                spec.get("workload"),
                name=name,
                body=decode_body(body, headers.get("content-type")),
                headers=shown_headers(headers),
                delivery=delivery,
            ),
        )
        playbook, version = await desk.playbook(reads.store, spec["playbook"])
    except TriggerError as exc:
        return refuse(400, str(exc), delivery)
    except (TemplateError, PlaybookError, NotFoundError) as exc:
        return refuse(409, f"hook {name!r} cannot start its playbook: {exc}", delivery)
    firing = Firing(trigger_id=hook.row.trigger_id, kind=HOOK, name=name, key=key)
    try:
        execution_id = await reads.start(
            playbook,
            workload=workload,
            catalog_version=version,
            firing=firing,
            traceparent=tracing.incoming(headers.get(TRACEPARENT_HEADER)),
        )
    except AlreadyFired as exc:  # the same delivery, raced here by another request
        return _duplicate(exc.execution_id, delivery)
    except (TemplateError, PlaybookError) as exc:
        return refuse(409, f"hook {name!r} cannot start its playbook: {exc}", delivery)
    started: Delivered = {
        "execution_id": str(execution_id),
        "status": "running",
        "delivery": delivery,
    }
    return JSONResponse(started, status_code=202)


async def _off_loop(size: int, work: Callable[[], T]) -> T:
    """`work()` on the event loop for a small body; in a thread for a large one (hashing
    or parsing 16 MiB takes tens of milliseconds that no other request should wait)."""
    if size <= _INLINE_BODY:
        return work()
    return await asyncio.to_thread(work)


def _duplicate(execution_id: int | None, delivery: str | None) -> JSONResponse:
    seen: Delivered = {
        "execution_id": None if execution_id is None else str(execution_id),
        "status": "duplicate",
        "delivery": delivery,
    }
    return JSONResponse(seen, status_code=200)


async def _firing_key(
    store: Store, trigger_id: int, delivery: str | None, now: float, desk: HookDesk
) -> tuple[str, FiringRow | None]:
    """The firing key of a delivery, and the run it started when it is a duplicate (the
    same id within the dedup window). Without an id, a new key each time. An id first
    seen longer ago than the window fires again, as `ID#2` (then `ID#3`...), so two
    servers racing on a reused id still agree on one key."""
    if delivery is None:
        from flowtide.ids import new_id

        return f"~{new_id()}", None

    given: str = delivery

    def look() -> tuple[str, FiringRow | None]:
        key = given
        for generation in range(2, _GENERATIONS + 2):
            found = store.firing(trigger_id, key)
            if found is None:
                return key, None
            if now - found.time <= desk.dedup_window or generation > _GENERATIONS:
                return key, found
            key = f"{given}#{generation}"
        return key, None

    return await asyncio.to_thread(look)
