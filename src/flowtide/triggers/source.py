"""The port of a subscription's source: what a source hands the listener (`Delivery`)
and what the listener asks of it (`Source`). Sources by name: `flowtide.triggers.sources`.

A source hands out deliveries; the listener starts each one's run and only then calls
`ack` (or `nak` with a delay, or `term`). A delivery's `key` is what makes a message
start exactly one run: every delivery of one message must carry the same key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Delivery", "Source"]


async def _nothing(*_: Any) -> None:
    return None


@dataclass
class Delivery:
    """One message as a source delivered it."""

    #: Unique within the subscription and the same for every delivery of one message
    #: (JetStream: `<stream>:<stream sequence>`; core NATS: `id:<Nats-Msg-Id>`).
    key: str
    #: What the workload templates see as `message`: `data` (JSON-decoded when it is
    #: JSON, else text), `subject`, `headers`, `seq`, `id`.
    message: dict[str, Any]
    #: How many times it was delivered (1: the first time).
    attempt: int = 1
    #: Its run was created (or had been): the source may forget it.
    ack: Callable[[], Awaitable[None]] = _nothing
    #: Its run could not start: deliver it again after `delay` seconds.
    nak: Callable[[float], Awaitable[None]] = _nothing
    #: Its run cannot start: never deliver it again.
    term: Callable[[], Awaitable[None]] = _nothing


class Source(Protocol):
    """A subscription's messages (see the module docstring)."""

    async def open(self) -> None:
        """Connect and bind (a JetStream source creates its durable consumer).

        Raises:
            TriggerError: the server cannot be reached, refuses the credentials, or
                has no such stream.
        """
        ...

    async def fetch(self, limit: int, timeout: float) -> list[Delivery]:
        """Up to `limit` messages, waiting at most `timeout` seconds for the first ones
        (fewer, or none, when the time runs out). Raises TriggerError."""
        ...

    async def close(self) -> None:
        """Disconnect (messages fetched and not acked are delivered again later)."""
        ...
