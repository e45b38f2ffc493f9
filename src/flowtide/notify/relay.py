"""The relay: leases owed deliveries, sends them, records each attempt as an event of
its execution, and retries with exponential backoff while a target is down.

A row is leased for longer than an attempt may take; a relay that dies mid-attempt leaves
it to be taken again when the lease runs out (a delivery is then sent at most twice, the
usual outbox bound). On PostgreSQL the lease skips rows another server holds, so the
servers of a shard share the work and no row is sent twice at once.

Embedded (`flowtide run`), `drain` waits (bounded) for a run's deliveries before the
process exits; long-running processes (`flowtide ui`, the server) run `run_forever` (a
thread) or call `run_once` from their own loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import secret_values
from flowtide.errors import FlowtideError
from flowtide.notify.targets import Attempt, Sender, masked_target
from flowtide.redaction import mask_text, mask_value
from flowtide.store.base import ExecutionRow, Store
from flowtide.store.notifications import NotificationRow

__all__ = ["NotificationRelay", "backoff_delay"]

log = logging.getLogger("flowtide.notify")


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Seconds before attempt `attempt + 1` after `attempt` failed ones (1, 2, ...)."""
    return float(min(cap, base * 2.0 ** (attempt - 1)))


class NotificationRelay:
    """Delivers the notification outbox of one store (one shard)."""

    def __init__(
        self,
        store: Store,
        sender: Sender,
        next_id: Callable[[], int],
        *,
        attempts: int = 6,
        backoff: float = 10.0,
        max_backoff: float = 300.0,
        public_url: str | None = None,
        clock: Callable[[], float] = time.time,
        batch: int = 32,
    ) -> None:
        self.store = store
        self.sender = sender
        self.next_id = next_id
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.public_url = public_url.rstrip("/") if public_url else None
        self.clock = clock
        self.batch = batch
        # Longer than an attempt may take (an SMTP dialogue is several timeouts).
        self.lease = max(60.0, sender.timeout * 6)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one pass ----------------------------------------------------------------------

    def run_once(self) -> int:
        """Send every delivery due now; how many attempts were made."""
        rows = self.store.lease_notifications(now=self.clock(), lease=self.lease, limit=self.batch)
        for row in rows:
            try:
                self._deliver(row)
            except FlowtideError as exc:
                # The store failed: the lease runs out and the row is tried again.
                log.warning("notification %s of execution %s: %s", row.id, row.execution_id, exc)
        return len(rows)

    def _secrets(self, execution_id: int) -> frozenset[str]:
        found: frozenset[str] = frozenset()
        for event in self.store.events(execution_id, types=[ev.SECRETS_ADDED]):
            found |= secret_values(event)
        return found

    def document(self, row: NotificationRow, execution: ExecutionRow | None) -> dict[str, Any]:
        """The document sent: what the transition recorded, with the run's start, duration,
        trigger and the link to its UI page."""
        doc = dict(row.doc)
        ended = float(doc.get("time") or row.created)
        if execution is not None:
            doc["started"] = execution.created
            doc["duration"] = round(max(0.0, ended - execution.created), 3)
            doc["trigger"] = execution.trigger
        doc["ended"] = ended if doc.get("transition") != "deadline_missed" else None
        doc["link"] = (
            f"{self.public_url}/ui/executions/{row.execution_id}" if self.public_url else None
        )
        return doc

    def _deliver(self, row: NotificationRow) -> None:
        secrets = self._secrets(row.execution_id)
        try:
            execution: ExecutionRow | None = self.store.get_execution(row.execution_id)
        except FlowtideError:
            execution = None
        doc = mask_value(self.document(row, execution), secrets)
        kind = str(row.target.get("kind"))
        config: Mapping[str, Any] = row.target.get("config") or {}
        attempt_no = row.attempts + 1
        try:
            got = self.sender.send(kind, config, doc)
        except Exception as exc:  # noqa: BLE001 - a target's failure is data, never a crash
            got = Attempt(False, error=f"{type(exc).__name__}: {exc}")
        now = self.clock()
        retry_at = None
        if not got.ok and got.retry and attempt_no < self.attempts:
            retry_at = now + backoff_delay(attempt_no, self.backoff, self.max_backoff)
        payload: ev.NotificationPayload = {
            "on": row.on,
            "target": kind,
            "to": masked_target(kind, config),
            "attempt": attempt_no,
        }
        if got.status_code is not None:
            payload["status_code"] = got.status_code
        if got.error is not None:
            payload["error"] = mask_text(got.error, secrets)[:2000]
        if retry_at is not None:
            payload["retry_at"] = retry_at
        if got.started_execution_id is not None:
            payload["started_execution_id"] = got.started_execution_id
        event = Event(
            event_id=self.next_id(),
            execution_id=row.execution_id,
            type=ev.NOTIFICATION_SENT if got.ok else ev.NOTIFICATION_FAILED,
            status="sent" if got.ok else "failed",
            payload=payload,
            parent_event_id=row.event_id,
            time=now,
        )
        self.store.settle_notification(row.id, event, retry_at=retry_at, secrets=secrets)
        if not got.ok:
            log.info(
                "execution %s: notification to %s failed (attempt %d%s): %s",
                row.execution_id,
                payload["to"],
                attempt_no,
                ", retried" if retry_at is not None else ", given up",
                payload.get("error"),
            )

    # -- waiting and running -----------------------------------------------------------

    def drain(
        self,
        execution_ids: Sequence[int] | None,
        timeout: float,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> int:
        """Deliver until nothing is owed for `execution_ids` (None: any) or `timeout`
        seconds passed; how many deliveries are still owed."""
        deadline = time.monotonic() + timeout
        while True:
            self.run_once()
            left = self.store.pending_notifications(execution_ids)
            if left == 0 or time.monotonic() >= deadline:
                return left
            sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def pending_for(self, execution_ids: Sequence[int] | None) -> int:
        return self.store.pending_notifications(execution_ids)

    def poke(self) -> None:
        """Deliveries were written: look now rather than at the next poll."""
        self._wake.set()

    def run_forever(self, poll: float = 1.0) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the relay outlives a store hiccup
                log.exception("notification relay pass failed")
            self._wake.wait(poll)
            self._wake.clear()

    def start(self, poll: float = 1.0) -> None:
        """Run in a daemon thread (long-running processes)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.run_forever, args=(poll,), name="flowtide-notify", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
