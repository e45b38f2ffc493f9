"""A subscription's server named by a credential is the credential's: when the listener
fails (no stream, no server), the error readers see names the credential, never its URL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from flowtide.dev.postgres import free_port
from flowtide.errors import TriggerError
from flowtide.triggers.natssource import NatsSource
from flowtide.triggers.subscription import SubscriptionSpec
from kv.natsserver import NatsServer


def _error(url: str, **spec: Any) -> str:
    source = NatsSource(
        SubscriptionSpec(name="orders", playbook="p", auth="orders_nats", **spec),
        lambda alias: {"url": url},
    )

    async def open_it() -> str:
        try:
            await source.open()
        except TriggerError as exc:
            return str(exc)
        finally:
            await source.close()
        raise AssertionError("the listener opened")

    return asyncio.run(open_it())


@pytest.mark.nats
def test_a_missing_stream_names_the_credential_not_its_url(tmp_path: Path) -> None:
    server = NatsServer.start(tmp_path / "nats", "-js")
    try:
        message = _error(server.url, stream="NOPE")
    finally:
        server.stop()
    assert "has no stream 'NOPE'" in message
    assert "credential 'orders_nats'" in message
    assert server.url not in message and "127.0.0.1" not in message


def test_an_unreachable_server_names_the_credential_not_its_url() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    message = _error(url, stream="ORDERS")
    assert url not in message and "127.0.0.1" not in message
    assert "orders_nats" in message
