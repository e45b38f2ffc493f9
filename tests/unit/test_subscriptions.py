"""Subscriptions without a NATS server: documents read with their errors located, the
pacing of a rate with an injected clock, batch keys and backoff, and the listener's
exactly-once rule over a real SQLite store with deliveries that record their acks: a
batch regrouped after a redelivery starts only its messages that never fired."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

from flowtide.documents.subscriptions import read_subscription
from flowtide.errors import TriggerError
from flowtide.playbook.source import load_yaml
from flowtide.store.sqlite import SQLiteStore
from flowtide.store.triggers import Firing
from flowtide.triggers.listener import Listener, Pacer, batch_key, nak_delay
from flowtide.triggers.source import Delivery
from flowtide.triggers.subscription import (
    Batch,
    consumer_name,
    parse_rate,
    subscription_from_document,
    subscription_from_json,
    subscription_to_json,
)

DOC = """\
apiVersion: noetl.io/v2
kind: Subscription
metadata: {name: orders}
spec:
  playbook: shop/order
  source: nats
  auth: nats_events
  stream: ORDERS
  subject: orders.created
  batch: {size: 50, max_wait: 2s}
  rate: 100/s
  workload: {order: "{{ message.data }}"}
"""


def read(text: str) -> Any:
    doc, positions = load_yaml(textwrap.dedent(text), "sub.yaml")
    return subscription_from_document(doc, source="sub.yaml", positions=positions)


def test_a_document_is_read_and_stored_as_written() -> None:
    spec = read(DOC)
    assert (spec.name, spec.playbook, spec.auth, spec.stream, spec.subject) == (
        "orders",
        "shop/order",
        "nats_events",
        "ORDERS",
        "orders.created",
    )
    assert spec.batch == Batch(50, 2.0) and spec.rate == 100.0
    assert consumer_name(spec) == "flowtide-sub-orders"
    assert subscription_from_json(subscription_to_json(spec)) == spec


@pytest.mark.parametrize(
    ("change", "line", "field"),
    [
        (("stream: ORDERS", "strem: ORDERS"), 8, "strem"),
        (("rate: 100/s", "rate: fast"), 11, "rate"),
        (("{size: 50, max_wait: 2s}", "{size: 0}"), 10, "batch"),
        (("auth: nats_events", "url: nats://u:p@h:4222"), 7, "url"),
    ],
)
def test_errors_name_the_line_and_the_field(change: tuple[str, str], line: int, field: str) -> None:
    with pytest.raises(TriggerError) as caught:
        read(DOC.replace(*change))
    assert caught.value.location is not None and caught.value.location.startswith(
        f"sub.yaml:{line}:"
    ), caught.value
    assert caught.value.field == field
    assert "subscription 'orders'" in str(caught.value)


def test_rates() -> None:
    assert parse_rate("100/s") == 100 and parse_rate("30/m") == 0.5 and parse_rate(2) == 2
    assert parse_rate("36/h") == pytest.approx(0.01)
    for bad in ("0/s", "fast", True, -1):
        with pytest.raises(TriggerError):
            parse_rate(bad)


def test_the_pacer_allows_the_rate_and_no_more() -> None:
    pacer = Pacer(10.0)
    assert pacer.allowance(0.0) == 10
    pacer.take(10, 0.0)
    assert pacer.allowance(0.0) == 0 and pacer.wait(0.0) == pytest.approx(0.1)
    assert pacer.allowance(0.5) == 5
    pacer.take(5, 0.5)
    assert pacer.allowance(100.0) == 10  # a quiet hour does not bank more than a second


def test_batch_keys_and_backoff() -> None:
    def js(seq: int) -> Delivery:
        return Delivery(key=f"S:{seq}", message={"seq": seq})

    assert batch_key([js(7), js(3), js(5)]) == "S:3-7"
    core = [Delivery(key="id:a", message={"seq": None}), Delivery(key="id:b", message={})]
    assert batch_key(core) == "id:a..id:b"
    assert [nak_delay(n) for n in (1, 2, 3, 10)] == [1, 2, 4, 60]


class _Firer:
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.next = 1

    def owns(self, trigger_id: int) -> bool:
        return True

    async def start(
        self, playbook: Any, *, workload: dict[str, Any], version: int | None, firing: Firing
    ) -> int:
        execution_id, self.next = self.next, self.next + 1
        self.store.create_execution(
            execution_id,
            playbook_path="shop/order",
            playbook_version=version,
            playbook_file=None,
            playbook_text="kind: Playbook\n",
            workload=workload,
            created=1.0,
            firing=firing,
        )
        return execution_id

    async def cancel(self, execution_id: int, reason: str) -> None:
        raise AssertionError("not used")


def test_a_regrouped_batch_starts_only_what_never_fired(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "flowtide.db")
    pb = tmp_path / "order.yaml"
    pb.write_text("workflow:\n  - step: start\n    tool: {kind: noop}\n")
    spec = subscription_from_json(
        {"name": "orders", "playbook": str(pb), "url": "nats://x", "stream": "S"}
    )
    row = store.put_trigger(
        "subscription", "orders", subscription_to_json(spec), trigger_id=5, now=1
    )
    firer = _Firer(store)
    listener = Listener(row, spec, firer, credentials=lambda alias: {})
    acked: list[str] = []

    def delivery(seq: int) -> Delivery:
        async def ack() -> None:
            acked.append(f"S:{seq}")

        return Delivery(key=f"S:{seq}", message={"seq": seq, "data": seq}, ack=ack)

    async def main() -> None:
        await listener.start_batch([delivery(1), delivery(2), delivery(3)])
        # Redelivered 2 and 3 (the ack was lost) arrive with new ones: 2 and 3 are acked
        # and start nothing; 4 and 5 start a batch of their own.
        await listener.start_batch([delivery(3), delivery(4), delivery(2), delivery(5)])
        # A single message that was in a batch starts nothing either.
        await listener.start_one(delivery(4))

    asyncio.run(main())
    ids = sorted(r.execution_id for r in store.list_executions(limit=10))
    runs = {store.get_execution(i).trigger["message"]: store.get_execution(i) for i in ids}
    assert sorted(runs) == ["S:1-3", "S:4-5"]
    assert [m["data"] for m in runs["S:1-3"].workload["messages"]] == [1, 2, 3]
    assert [m["data"] for m in runs["S:4-5"].workload["messages"]] == [4, 5]
    assert sorted(acked) == sorted(["S:1", "S:2", "S:3", "S:2", "S:3", "S:4", "S:5", "S:4"])
    assert (listener.started, listener.refused) == (2, 0)
    # A message whose run could not start, recorded as the listener does.
    refused = Firing(5, "subscription", "orders", "S:6", slot=9.0, status="failed", reason="boom")
    store.record_firings([refused], now=9.0)
    # Its document lists one run per batch and the refused message apart from the
    # batches' members (the page's squares and refused table).
    doc = read_subscription(store, row, spec, listener={"connected": True})
    assert [f["key"] for f in doc["runs"]] == ["S:4-5", "S:1-3"]
    assert [f["execution_status"] for f in doc["runs"]] == ["created", "created"]
    assert [(f["key"], f["reason"]) for f in doc["refused"]] == [("S:6", "boom")]
    assert {f["status"] for f in doc["firings"]} == {"started", "batched", "failed"}
    assert len(doc["firings"]) == 2 + 5 + 1 and doc["listener"] == {"connected": True}
    store.close()
