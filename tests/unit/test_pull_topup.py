"""The worker's pull requests (`flowtide.worker._pull.Puller.ask`): how much it asks
JetStream for, and when a small top-up waits."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from flowtide.worker._pull import Puller


class _Nats:
    """What Puller.ask uses of a NATS client: the pull requests it publishes."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        self.asked.append(json.loads(payload)["batch"])


def _ask(puller: Puller, free: int, **kwargs: Any) -> bool:
    return asyncio.run(puller.ask(free, **kwargs))


def test_a_small_top_up_is_left_for_later_and_asked_for_when_told() -> None:
    nc = _Nats()
    puller = Puller(nc, "S", "C", asyncio.Event())
    assert _ask(puller, 8) is False and nc.asked == [8]
    puller.credit = 7  # one delivered, its slot taken and freed again
    # 1 more wanted of 8 slots: less than a quarter, so left for later...
    assert _ask(puller, 8) is True and nc.asked == [8]
    # ...until the caller says so (its wait for more slots ran out).
    assert _ask(puller, 8, top_up=True) is False and nc.asked == [8, 1]
    assert puller.credit == 8


def test_nothing_to_ask_for_is_not_a_deferred_top_up() -> None:
    nc = _Nats()
    puller = Puller(nc, "S", "C", asyncio.Event())
    puller.credit, puller._asked_at = 8, time.monotonic()  # asked just now
    assert _ask(puller, 8) is False and _ask(puller, 8, top_up=True) is False
    assert nc.asked == []


def test_what_was_asked_on_a_lost_connection_is_asked_again_on_the_new_one() -> None:
    # The pull requests lived on the old connection: the node that held them may have
    # died (a NATS cluster), so their credit must not hold the next ones back until they
    # would have expired.
    nc = _Nats()
    nc.stats = {"reconnects": 0}  # type: ignore[attr-defined]
    puller = Puller(nc, "S", "C", asyncio.Event())
    assert _ask(puller, 8) is False and nc.asked == [8]
    assert _ask(puller, 8) is False and nc.asked == [8]  # all 8 still asked for
    nc.stats["reconnects"] = 1  # type: ignore[attr-defined]
    assert _ask(puller, 8) is False and nc.asked == [8, 8]
    assert puller.credit == 8
    assert _ask(puller, 8) is False and nc.asked == [8, 8]  # once per reconnect
