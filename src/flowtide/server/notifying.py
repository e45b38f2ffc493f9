"""The server's notifications (`flowtide.notify`): the server-wide default targets handed
to the step transaction (which writes the deliveries a transition owes with it), and the
relay thread that leases this shard's deliveries (`FOR UPDATE SKIP LOCKED`: with several
servers on a shard each delivery is taken by one) and sends them."""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from flowtide.notify.relay import NotificationRelay
from flowtide.notify.settings import default_targets, relay_from
from flowtide.playbook.loader import parse_playbook
from flowtide.settings.reading import current
from flowtide.settings.tree import NotifySection

if TYPE_CHECKING:
    from flowtide.server.coordinator import Coordinator
    from flowtide.store.postgres import PostgresStore

__all__ = ["start_notifications"]


def start_notifications(
    store: PostgresStore,
    coordinator: Coordinator,
    *,
    credentials: Any,
    advertise_url: str | None,
    loop: asyncio.AbstractEventLoop,
) -> NotificationRelay:
    """Hand the defaults to the steps and start the relay thread (stop it with `stop`).

    Raises:
        SettingsError: FLOWTIDE_NOTIFY_DEFAULT is invalid.
    """
    section = current(NotifySection)
    steps = coordinator.steps
    steps.notify_defaults = default_targets(section)

    def start_playbook(path: str, version: int | None, workload: dict[str, Any]) -> int:
        row = store.get_playbook(path, version)
        playbook = parse_playbook(row.text, row.source_file)
        started = coordinator.execute(playbook, workload=workload, catalog_version=row.version)
        return asyncio.run_coroutine_threadsafe(started, loop).result(timeout=30)

    own = [socket.gethostname()]
    if advertise_url:
        own.append(urlsplit(advertise_url).hostname or "")
    relay = relay_from(
        section,
        store,
        coordinator.ids.next_id,
        credentials=credentials,
        start_playbook=start_playbook,
        own_hosts=own,
        public_url=advertise_url,
    )
    steps.on_notify = relay.poke
    relay.start()
    return relay
