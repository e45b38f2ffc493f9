"""The transactional outbox: command notifications written with the events that issue the
commands, published to NATS JetStream afterwards (at least once).

Rows are claimed with row locks that skip rows locked by others, plus a short lock lease
(`flowtide.store.pg.outbox.claim`), so any number of server processes relay at once without publishing a row twice in the normal case; a relay
that dies after publishing but before marking leaves the row to be published again after
the lease, and JetStream's duplicate window (the `Nats-Msg-Id` header: command id and
attempt) drops that second copy. A worker that still sees a duplicate loses the claim race
(409) and acks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Final

from flowtide import trace
from flowtide.server.jetstream import StreamLayout, ensure_stream, with_retries
from flowtide.server.logs import ensure_log_stream
from flowtide.store import pg
from flowtide.store.pg.outbox import OutboxRow
from flowtide.store.postgres import PostgresStore
from flowtide.wire import COMMAND_PREFIX, COMMAND_STREAM, command_filter, pool_consumer

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

__all__ = [
    "OUTBOX_HOLD",
    "STREAM",
    "OutboxRelay",
    "OutboxRow",
    "ensure_command_stream",
    "ensure_consumer",
]

log = logging.getLogger("flowtide.server.outbox")

STREAM: Final = COMMAND_STREAM
#: Seconds an outbox row written for `OutboxRelay.publish` stays locked: the relay takes
#: it only if the writing process did not mark it published by then (it died).
OUTBOX_HOLD: Final = 5.0
#: Seconds published rows wait before they are marked, in one transaction for all of
#: them: the mark stays out of the way of the claims the notifications set off (it ran
#: between the publish and the claim), and far below OUTBOX_HOLD.
MARK_DELAY: Final = 0.05
_SUBJECTS: Final = [f"{COMMAND_PREFIX}.>"]
#: Seconds a publish waits for JetStream's ack (nats-py's default for `js.publish`).
PUBLISH_TIMEOUT: Final = 5.0


def _outcome(sent: Any) -> Any:
    """A row's result from what `_send` got for it: the PubAck, or the exception."""
    if not isinstance(sent, asyncio.Future):
        return sent
    if sent.cancelled():
        return TimeoutError(f"no ack from JetStream within {PUBLISH_TIMEOUT:.0f} s")
    return sent.exception() or sent.result()


async def ensure_command_stream(js: JetStreamContext, layout: StreamLayout | None = None) -> None:
    """Create the command stream, or bring it to `layout` (work-queue retention: a
    message is gone once acked; one durable consumer per pool with non-overlapping
    subject filters)."""
    from nats.js.api import RetentionPolicy, StreamConfig

    layout = layout or StreamLayout()
    config = StreamConfig(
        name=STREAM,
        subjects=_SUBJECTS,
        retention=RetentionPolicy.WORK_QUEUE,
        duplicate_window=120.0,
    )
    await ensure_stream(js, layout.shape(config, layout.commands_max_bytes))


async def ensure_consumer(
    js: JetStreamContext, pool: str, layout: StreamLayout | None = None
) -> str:
    """Create `pool`'s durable pull consumer (and the stream) if missing; its name.

    The server does this when a worker of the pool registers: workers hold no right to
    manage streams or consumers (flowtide.subjects), only to pull from theirs.
    """
    from nats.js.api import AckPolicy, ConsumerConfig
    from nats.js.errors import NotFoundError

    await ensure_command_stream(js, layout)
    durable = pool_consumer(pool)
    try:
        await with_retries(lambda: js.consumer_info(STREAM, durable), f"consumer {durable}")
        return durable
    except NotFoundError:
        pass
    config = ConsumerConfig(
        durable_name=durable,
        filter_subject=command_filter(pool),
        ack_policy=AckPolicy.EXPLICIT,
        # Acked right after the claim: this only covers delivery -> claim.
        ack_wait=10.0,
        max_ack_pending=-1,
        max_waiting=512,
    )
    with contextlib.suppress(Exception):  # another server created it meanwhile
        await with_retries(lambda: js.add_consumer(STREAM, config=config), f"add {durable}")
    await with_retries(lambda: js.consumer_info(STREAM, durable), f"consumer {durable}")
    return durable


class OutboxStore:
    """The outbox's transactions (also behind the /api/internal/outbox endpoints)."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def claim(self, limit: int = 256, lease: float = 10.0) -> list[OutboxRow]:
        with self.store.transaction("outbox claim") as conn:
            return pg.outbox.claim(conn, now=time.time(), lease=lease, limit=limit)

    def mark_published(self, ids: list[int]) -> int:
        if not ids:
            return 0
        with self.store.transaction("outbox mark-published") as conn:
            return pg.outbox.mark_published(conn, ids, time.time())

    def mark_failed(self, ids: list[int], error: str) -> int:
        if not ids:
            return 0
        with self.store.transaction("outbox mark-failed") as conn:
            return pg.outbox.mark_failed(conn, ids, error[:2000])

    def pending(self) -> dict[str, Any]:
        with self.store.transaction("outbox pending-count") as conn:
            count, oldest = pg.outbox.backlog(conn)
        return {
            "pending": count,
            "oldest_age_seconds": round(time.time() - oldest, 3) if oldest else 0.0,
        }

    def prune(self, older_than: float = 3600.0) -> int:
        with self.store.transaction("outbox prune") as conn:
            return pg.outbox.prune(conn, time.time() - older_than)


class OutboxRelay:
    """Publishes pending outbox rows; woken by `poke()` after a commit, and polls as a
    backstop for rows other processes left behind."""

    def __init__(
        self,
        store: PostgresStore,
        nc: Client,
        *,
        poll: float = 0.5,
        duplicate: bool | None = None,
        layout: StreamLayout | None = None,
    ) -> None:
        #: How the command and log streams are laid out in JetStream (replicas...).
        self.layout = layout or StreamLayout()
        if duplicate is None:
            from flowtide.settings import FaultsSection, read

            duplicate = read(FaultsSection).duplicate_commands
        #: Fault injection (FLOWTIDE_FAULT_DUPLICATE_COMMANDS, drills only): every command
        #: published a second time under another message id, which JetStream keeps.
        self.duplicate = duplicate
        if duplicate:
            log.warning("fault injection on: every command is published to NATS twice")
        self.rows = OutboxStore(store)
        self.nc = nc
        self.js = nc.jetstream()
        self.poll = poll
        self.published = 0
        self.failures = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._to_mark: list[int] = []
        self._marker: asyncio.Task[None] | None = None
        self._closing = False

    def poke(self) -> None:
        self._wake.set()

    def publish(self, rows: list[OutboxRow]) -> None:
        """Publish rows this process just committed (locked for OUTBOX_HOLD), without the
        relay's claim transaction; marked published in batches afterwards."""
        task = asyncio.create_task(self._publish_now(rows))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _publish_now(self, rows: list[OutboxRow]) -> None:
        results = await self._send(rows)
        ok = [
            r.id for r, res in zip(rows, results, strict=True) if not isinstance(res, BaseException)
        ]
        self.published += len(ok)
        self._to_mark += ok
        if self._marker is None or self._marker.done():
            self._marker = asyncio.create_task(self._mark())
        failed = [r for r, res in zip(rows, results, strict=True) if isinstance(res, BaseException)]
        if failed:
            self.failures += len(failed)
            first = next(res for res in results if isinstance(res, BaseException))
            # Unlocked for the relay to try again.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.rows.mark_failed,
                    [r.id for r in failed],
                    f"{type(first).__name__}: {first}",
                )
            self.poke()

    async def _mark(self) -> None:
        # One transaction for every row published meanwhile. A row left unmarked (the
        # update failed, the process died) is published again by a relay after its hold;
        # JetStream drops the copy (same Nats-Msg-Id).
        while self._to_mark:
            if not self._closing:
                await asyncio.sleep(MARK_DELAY)
            ids, self._to_mark = self._to_mark, []
            try:
                await asyncio.to_thread(self.rows.mark_published, ids)
            except Exception as exc:  # noqa: BLE001 - see above
                log.warning("outbox mark-published: %s", exc)

    async def _send(self, rows: list[OutboxRow]) -> list[Any]:
        """Publish `rows`; one result per row, in order: the PubAck or the exception.

        Every row's PUB is handed to the NATS client in this task's first step and the
        client's flusher writes them in the loop's next turn (`Coordinator._after` counts
        on that); then the acks are awaited together. (`asyncio.gather` over `js.publish`
        took a turn more: a task per row, so the step's HTTP reply went out first.)
        """
        sent: list[Any] = []
        for r in rows:
            try:
                sent.append(
                    await self.js.publish_async(
                        r.subject,
                        r.payload.encode(),
                        headers={"Nats-Msg-Id": f"{r.command_id}-{r.id}"},
                    )
                )
            except Exception as exc:  # noqa: BLE001 - reported per row
                sent.append(exc)
        copies: list[Any] = []
        if self.duplicate:
            for r in rows:
                with contextlib.suppress(Exception):  # a lost copy is no fault of the row's
                    copies.append(
                        await self.js.publish_async(
                            r.subject,
                            r.payload.encode(),
                            headers={"Nats-Msg-Id": f"{r.command_id}-{r.id}-again"},
                        )
                    )
        if trace.enabled:
            trace.marks([r.command_id for r in rows], "published")
        waiting = [f for f in sent + copies if isinstance(f, asyncio.Future)]
        try:
            if waiting:
                await asyncio.wait(waiting, timeout=PUBLISH_TIMEOUT)
        finally:
            for f in waiting:
                f.cancel()  # no-op for the acked; frees nats-py's slot for the others
        return [_outcome(f) for f in sent]

    async def start(self) -> None:
        await ensure_command_stream(self.js, self.layout)
        # What running steps print (flowtide.server.logs).
        await ensure_log_stream(self.js, self.layout)
        self._task = asyncio.create_task(self._run(), name="flowtide-outbox")

    async def stop(self) -> None:
        for task in [self._task, *self._sending]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # What was published is marked now rather than published again after its hold.
        self._closing = True
        if self._marker is not None and not self._marker.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._marker, 5.0)

    async def _run(self) -> None:
        last_prune = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll)
            self._wake.clear()
            try:
                while await self.relay_once() > 0:
                    pass
                if time.monotonic() - last_prune > 60:
                    last_prune = time.monotonic()
                    await asyncio.to_thread(self.rows.prune)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep relaying; the rows stay pending
                self.failures += 1
                log.warning("outbox relay: %s", exc)
                await asyncio.sleep(self.poll)

    async def relay_once(self, limit: int = 256) -> int:
        """Publish one batch; returns how many rows were published."""
        rows = await asyncio.to_thread(self.rows.claim, limit)
        if not rows:
            return 0
        results = await self._send(rows)
        ok = [
            r.id for r, res in zip(rows, results, strict=True) if not isinstance(res, BaseException)
        ]
        failed = [r for r, res in zip(rows, results, strict=True) if isinstance(res, BaseException)]
        await asyncio.to_thread(self.rows.mark_published, ok)
        if failed:
            self.failures += len(failed)
            first = next(res for res in results if isinstance(res, BaseException))
            await asyncio.to_thread(
                self.rows.mark_failed, [r.id for r in failed], f"{type(first).__name__}: {first}"
            )
        self.published += len(ok)
        return len(ok)
