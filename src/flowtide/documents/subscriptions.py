"""What people and programs read about subscriptions: one in a list, its full document
(source, batch, rate, its latest firings: messages that started a run, were part of a
batch's run, or failed to start one, with why; its latest runs, one per message or batch,
and refused messages apart), and its listener's state where the process that answers runs
it. Shared by the server, `flowtide ui` and the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from typing_extensions import TypedDict

from flowtide.documents.schedules import FiringItem, firing_item
from flowtide.store.triggers import FiringRow, TriggerRow, TriggerStore
from flowtide.triggers.subscription import SubscriptionSpec, consumer_name

__all__ = [
    "SubscriptionDocument",
    "SubscriptionItem",
    "read_subscription",
    "subscription_document",
    "subscription_item",
]

#: The latest runs a document lists (one per message, or per batch) and refused messages.
RUNS_SHOWN: Final = 30
REFUSED_SHOWN: Final = 20


class SubscriptionItem(TypedDict):
    """A subscription as a list shows it."""

    name: str
    #: Catalog path (or, on a local store, a file).
    playbook: str
    version: int | None
    #: nats, or a plugin's source name.
    source: str
    #: One line: `nats stream ORDERS (consumer flowtide-sub-orders)`, `nats subject a.b`.
    what: str
    paused: bool
    description: str


class SubscriptionDocument(SubscriptionItem):
    """A subscription with its definition and latest firings."""

    #: The credential alias naming the server (never its contents).
    auth: Any
    url: str | None
    subject: str | None
    stream: str | None
    consumer: str | None
    workload: dict[str, Any]
    #: {size, max_wait} or null.
    batch: dict[str, Any] | None
    #: Messages per second at most, or null.
    rate: float | None
    ack_wait: float
    max_deliver: int
    config: dict[str, Any]
    created: float
    updated: float
    #: Latest firings, newest first: `started` (a run), `batched` (in a batch's run),
    #: `failed` (no run: `reason` says why).
    firings: list[FiringItem]
    #: Its latest runs, newest first: the `started` firings only (a batch's is keyed by
    #: its messages' range, `STREAM:4-6`), whatever its batches' members.
    runs: list[FiringItem]
    #: Its latest messages that started no run (`failed`, `reason` says why).
    refused: list[FiringItem]
    #: The listener's state in the process that answered, when it runs it:
    #: {connected, started, acked, refused, error}; null otherwise.
    listener: dict[str, Any] | None


def _what(spec: SubscriptionSpec) -> str:
    if spec.source == "nats":
        if spec.stream:
            what = f"nats stream {spec.stream} (consumer {consumer_name(spec)})"
            return what + (f" subject {spec.subject}" if spec.subject else "")
        return f"nats subject {spec.subject}"
    return spec.source


def subscription_item(row: TriggerRow, spec: SubscriptionSpec) -> SubscriptionItem:
    return {
        "name": row.name,
        "playbook": spec.playbook,
        "version": spec.version,
        "source": spec.source,
        "what": _what(spec),
        "paused": row.paused,
        "description": spec.description,
    }


def subscription_document(
    row: TriggerRow,
    spec: SubscriptionSpec,
    *,
    firings: Sequence[FiringRow],
    runs: Sequence[FiringRow] = (),
    refused: Sequence[FiringRow] = (),
    listener: dict[str, Any] | None = None,
) -> SubscriptionDocument:
    auth: Any = spec.auth
    if isinstance(auth, dict):
        # A mapping may carry fields besides the alias: show the alias only.
        auth = {"credential": auth.get("credential") or auth.get("key") or auth.get("alias")}
    return {
        **subscription_item(row, spec),
        "auth": auth,
        "url": spec.url,
        "subject": spec.subject,
        "stream": spec.stream,
        "consumer": consumer_name(spec) if spec.stream else spec.consumer,
        "workload": spec.workload,
        "batch": None
        if spec.batch is None
        else {"size": spec.batch.size, "max_wait": spec.batch.max_wait},
        "rate": spec.rate,
        "ack_wait": spec.ack_wait,
        "max_deliver": spec.max_deliver,
        "config": spec.config,
        "created": row.created,
        "updated": row.updated,
        "firings": [firing_item(f) for f in firings],
        "runs": [firing_item(f) for f in runs],
        "refused": [firing_item(f) for f in refused],
        "listener": listener,
    }


def read_subscription(
    store: TriggerStore,
    row: TriggerRow,
    spec: SubscriptionSpec,
    *,
    limit: int = 50,
    listener: dict[str, Any] | None = None,
) -> SubscriptionDocument:
    """The document of a subscription with its latest `limit` firings, runs and refused
    messages read from `store`. Blocks on the store: run it in a thread.

    Raises:
        StoreError: the store failed.
    """
    tid = row.trigger_id
    return subscription_document(
        row,
        spec,
        firings=store.firings(tid, limit=limit),
        runs=store.firings(tid, limit=RUNS_SHOWN, status="started"),
        refused=store.firings(tid, limit=REFUSED_SHOWN, status="failed"),
        listener=listener,
    )
