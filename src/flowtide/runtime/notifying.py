"""The embedded runtime's notifications (`flowtide.notify`): the deliveries a step owes,
written with it (`LocalRuntime._process`), and a relay thread that sends them. A process
that exits when its runs end (`flowtide run`) first waits, bounded, for their deliveries
(`finish`), saying so on stderr; a long-running one (`flowtide ui`) keeps the thread.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flowtide.engine.events import Event
from flowtide.engine.state import ExecutionState
from flowtide.errors import FlowtideError
from flowtide.notify.owed import owed
from flowtide.notify.relay import NotificationRelay
from flowtide.notify.settings import default_targets, relay_from
from flowtide.settings.reading import current
from flowtide.settings.tree import NotifySection
from flowtide.store.notifications import PendingNotification

if TYPE_CHECKING:
    from flowtide.runtime.local import LocalRuntime

__all__ = ["LocalNotifier"]

log = logging.getLogger("flowtide.notify")


class LocalNotifier:
    """What `LocalRuntime` does for notifications."""

    def __init__(self, runtime: LocalRuntime) -> None:
        section = current(NotifySection)
        self.section = section
        self.defaults = default_targets(section)
        self.runtime = runtime
        self.relay: NotificationRelay = relay_from(
            section,
            runtime.store,
            runtime.ids.next_id,
            credentials=runtime.credentials,
            start_playbook=self._start_playbook,
        )
        self.started: list[int] = []
        self._running = False

    def owed(
        self, states: Mapping[int, ExecutionState], recorded: Sequence[Event]
    ) -> list[PendingNotification]:
        return owed(states, recorded, self.defaults)

    def start(self) -> None:
        """Run the relay thread (from the first delivery owed on)."""
        if not self._running:
            self._running = True
            self.relay.start()

    def written(self, rows: Sequence[PendingNotification]) -> None:
        """Rows were committed: the relay takes them now."""
        if rows:
            self.start()
            self.relay.poke()

    def _start_playbook(self, path: str, version: int | None, workload: dict[str, Any]) -> int:
        """Start a notification's playbook in this runtime (called on the relay thread)."""
        rt = self.runtime
        if rt._loop is None or rt._closed:
            raise FlowtideError("the runtime is closing: no playbook can start")
        playbook, catalog_version = rt.resolve_playbook(path, None, version)

        async def go() -> int:
            return await rt.start(playbook, workload=workload, catalog_version=catalog_version)

        execution_id = asyncio.run_coroutine_threadsafe(go(), rt._loop).result(timeout=30)
        self.started.append(execution_id)
        return execution_id

    async def finish(self, execution_ids: Sequence[int], wait: Callable[[int], Any]) -> None:
        """Wait, at most FLOWTIDE_NOTIFY_EXIT_WAIT seconds, for the deliveries of
        `execution_ids` (and the runs notification playbooks started), saying so."""
        if not self._running:
            return
        budget = self.section.exit_wait
        deadline = time.monotonic() + budget
        try:
            left = await asyncio.to_thread(self.relay.pending_for, execution_ids)
            if left:
                print(
                    f"flowtide: sending {left} notification(s) (waiting up to {budget:g} s)...",
                    file=sys.stderr,
                    flush=True,
                )
                left = await asyncio.to_thread(self.relay.drain, execution_ids, budget)
                if left:
                    print(
                        f"flowtide: {left} notification(s) not sent before exit; they are"
                        " sent by the next flowtide process on this home",
                        file=sys.stderr,
                        flush=True,
                    )
            for execution_id in list(self.started):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(wait(execution_id), remaining)
                except (TimeoutError, KeyError):
                    break
        except FlowtideError as exc:
            log.warning("notifications: %s", exc)
        finally:
            self.relay.stop()
