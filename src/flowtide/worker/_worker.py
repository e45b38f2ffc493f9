"""The worker: pulls its pool's notifications, claims, runs and reports commands, and
keeps its leases alive until `stop()` (then a grace period, then hands back the rest)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from flowtide import trace, tracing
from flowtide.errors import ServerError
from flowtide.home import find_home
from flowtide.ids import default_generator, lease_margin
from flowtide.natsauth import NatsAuth, connect_nats
from flowtide.playbook.template import visible_env
from flowtide.settings import LimitsSection, current
from flowtide.sharding import shard_for
from flowtide.tools.files import FileAccess, roots_from_env
from flowtide.tools.files import configure as configure_files
from flowtide.tools.python_pool import Isolation
from flowtide.tools.registry import cancel_running
from flowtide.wire import (
    COMMAND_STREAM,
    DEREGISTER_PATH,
    HEARTBEAT_PATH,
    REGISTER_PATH,
    RELEASE_PATH,
    Claimed,
    ExecutionShare,
    pool_consumer,
    worker_inbox,
)
from flowtide.worker._api import Api
from flowtide.worker._claims import claim
from flowtide.worker._commands import CommandRunner
from flowtide.worker._logs import NatsLogSpool
from flowtide.worker._pull import Puller, check_consumer
from flowtide.worker._python import start_python
from flowtide.worker._reports import Handed, Reporter
from flowtide.worker._shares import ShareCache

__all__ = ["Worker"]

log = logging.getLogger("flowtide.worker")

#: Seconds a small top-up of the pull requests waits for more slots to free up.
TOP_UP_WAIT = 0.05
#: Seconds a command runs before its `command.started` is reported on its own (so the
#: run's page shows the step running); a command done sooner reports it with the rest,
#: which costs a short loop iteration no request of its own.
STARTED_AFTER = 1.0
#: Seconds a finished command's report keeps its slot while the server has not settled
#: it (normally milliseconds; a report of a shard that is down waits for its database).
REPORT_HOLDS_SLOT = 2.0


class _Start:
    """A command's `command.started`, made in its thread as it starts, and whether it was
    reported on its own (`Worker._report_started`)."""

    __slots__ = ("events", "finished", "sent", "stale")

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.finished = False
        self.sent = False
        #: The server answered a report of the command as stale (a chunk: issued again,
        #: closed, or its execution ended): it runs no further iteration.
        self.stale = threading.Event()


class Worker:
    """Claims and runs commands of one pool until `stop()`."""

    def __init__(
        self,
        server: str,
        nats_url: str,
        *,
        pool: str = "default",
        concurrency: int = 8,
        worker_id: str | None = None,
        home: Path | None = None,
        token: str | None = None,
        nats_auth: NatsAuth | None = None,
        ca: str | None = None,
        python: Isolation | None = None,
        grace: float = 10.0,
        file_roots: Sequence[str] | None = None,
    ) -> None:
        """`token` and `ca`: see flowtide.auth.login and flowtide.tls (FLOWTIDE_TOKEN,
        FLOWTIDE_CA and FLOWTIDE_CLIENT_CERT/KEY by default). `python`: how python steps
        run (default: in child processes, `Isolation.from_env(mode="process")`). `grace`:
        seconds that running commands get to finish once `stop()` is called; what is still
        running then is stopped and handed back to the server for another worker.
        `file_roots`: the folders duckdb, transfer, artifact and script files may use
        (`flowtide.tools.files`; default FLOWTIDE_FILE_ROOTS, else the working directory;
        `["*"]`: any), the home never but its data folder.

        Raises:
            FlowtideError: the token file or a TLS file cannot be read, or a python or
                file-root setting is not understood.
        """
        from flowtide.auth.login import resolve_token
        from flowtide.tls import client_tls

        self.server = server.rstrip("/")
        token = resolve_token(self.server, token)
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self._tls = client_tls(self.server, ca=ca).context()
        self.nats_url = nats_url
        self.nats_auth = nats_auth if nats_auth is not None else NatsAuth()
        self.pool = pool
        self.concurrency = concurrency
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.home = find_home(home)
        # The process-wide generator (run_command's events draw from it too), under the
        # machine id the server leases to this worker at register (flowtide.machines).
        self.ids = default_generator()
        self.ids.wait_for_lease = 300.0
        self._machine: dict[str, Any] | None = None
        self.running = 0
        self.completed = 0
        # Commands claimed and not yet reported: the heartbeat extends only their leases.
        #: The commands running here: command id -> its execution id.
        self.held: dict[int, int] = {}
        #: The cluster's shards (the register reply says): claims, reports, heartbeats
        #: and hand-backs go per shard, each to the shard that owns the executions.
        self.shards = 1
        self._threads = ThreadPoolExecutor(concurrency, thread_name_prefix=self.worker_id)
        self._stop = asyncio.Event()
        #: Fetched notifications not yet settled (claim lost, or command reported).
        self._taken = 0
        self._slot_freed = asyncio.Event()
        # Reports are retried while the server is away for up to four leases (the
        # register reply sets the lease).
        #: The execution shares (playbook, context) this worker holds, by revision.
        self._shares = ShareCache()
        self._reports = Reporter(self.worker_id, 120.0, shares=self._shares)
        self._sync = httpx.Client(
            base_url=self.server, timeout=30.0, headers=self._headers, verify=self._tls
        )
        # A worker shows templates only the variables FLOWTIDE_TEMPLATE_ENV lists.
        self.template_env = visible_env(os.environ, embedded=False)
        self._commands = CommandRunner(
            self._sync,
            worker_id=self.worker_id,
            pool=self.pool,
            home=self.home,
            template_env=self.template_env,
            ids=self.ids,
        )
        self.python = python or Isolation.from_env(mode="process", embedded=False)
        # The result limits, read now: a bad value stops the worker before it claims.
        current(LimitsSection)
        self.files = FileAccess.for_worker(
            roots_from_env() if file_roots is None else file_roots,
            home=self.home.absolute(),
            data_dir=(self.home / "data").absolute(),
        )
        self.grace = grace
        #: Set once the grace period is over: what finishes now is handed back, not reported.
        self._handing_back = False
        #: The tasks running claimed commands (the run loop's, once it started).
        self._tasks: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        """Stop claiming; running commands get `grace` seconds (see `__init__`)."""
        self._stop.set()

    @property
    def stuck(self) -> bool:
        """Whether threads are still running commands (code that cannot be interrupted):
        the process should then end without waiting for them."""
        return self._commands.in_threads > 0

    async def run(self) -> None:
        from flowtide.redaction import install_log_masking

        # Values the steps' tools touch are masked in this process's logs.
        install_log_masking()
        trace.start("worker")
        tracing.start("worker")
        # The files in-process tools may use, for this process (see flowtide.tools.files).
        configure_files(self.files)
        # Before it registers: a worker whose python steps cannot start takes no command.
        await start_python(self.python, self.worker_id)
        async with Api(self.server, 30.0, self._headers, self._tls) as client:
            self.client = client
            # NATS first: credentials it refuses end the worker before it registers. Its
            # replies come to the pool's own inbox prefix, the one its user may read.
            nc = await connect_nats(
                self.nats_url,
                self.nats_auth,
                name=self.worker_id,
                inbox_prefix=worker_inbox(self.pool),
            )
            try:
                # Registering makes the server create the pool's consumer if missing.
                await self._register()
                durable = pool_consumer(self.pool)
                await check_consumer(
                    nc.jetstream(), durable, nats_url=self.nats_url, pool=self.pool
                )
            except BaseException:
                with contextlib.suppress(Exception):
                    await nc.close()
                raise
            self._commands.logs = NatsLogSpool(nc, asyncio.get_running_loop(), self.pool)
            puller = Puller(nc, COMMAND_STREAM, durable, self._slot_freed)
            await puller.start()
            # Paid once here rather than inside the first HTTP step it runs.
            from flowtide.tools import http as http_tool

            await asyncio.to_thread(http_tool.warm_up)
            beat = asyncio.create_task(self._heartbeat())
            reporter = asyncio.create_task(self._reports.run(client))
            asker = asyncio.create_task(self._ask(puller))
            tasks: set[asyncio.Task[None]] = set()
            self._tasks = tasks
            try:
                while not self._stop.is_set():
                    # A slot is taken from the delivery until the command's report is
                    # settled (or its claim is lost): no more is asked for than can run.
                    msgs = await puller.take(timeout=1.0)
                    if not msgs:
                        continue
                    self._taken += len(msgs)
                    task = asyncio.create_task(self._claim(msgs, tasks))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                asker.cancel()
                for msg in await puller.close():
                    with contextlib.suppress(Exception):
                        await msg.nak()
                # The heartbeat goes on meanwhile: it keeps the running commands' leases.
                await self._finish(tasks)
                beat.cancel()
                reporter.cancel()
                # No id after this: the machine id goes back with the last one used.
                held = (
                    self._machine_held(last_ms=self.ids.end_lease())
                    if self._machine is not None
                    else {}
                )
                with contextlib.suppress(Exception):
                    await client.post(
                        DEREGISTER_PATH,
                        {"worker_id": self.worker_id, "running": 0, **held},
                    )
                with contextlib.suppress(Exception):
                    await nc.close()
                self._threads.shutdown(wait=False, cancel_futures=True)
                self._sync.close()

    async def _finish(self, tasks: set[asyncio.Task[None]]) -> None:
        """Let running commands finish for `grace` seconds; then stop them (python child
        processes killed, Spark jobs cancelled) and hand them back to the server, which
        issues them again for another worker at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        while tasks and loop.time() < deadline:
            await asyncio.wait(list(tasks), timeout=deadline - loop.time())
        if not tasks:
            return
        # First: whatever finishes from here on is not reported (it was handed back).
        self._handing_back = True
        log.warning(
            "grace period (%gs) over: stopping %d running commands and handing them back",
            self.grace,
            len(self.held),
        )
        for shard, held in self._held_by_shard().items():
            try:
                r = await self.client.post(
                    RELEASE_PATH,
                    {"worker_id": self.worker_id, "commands": [str(c) for c in sorted(held)]},
                    shard=shard,
                )
                r.raise_for_status()
            except ServerError as exc:
                # Their leases run out instead: the reaper issues them again later.
                log.warning("handing back %d commands failed: %s", len(held), exc)
        cancel_running(None)
        for task in tasks:
            task.cancel()
        await asyncio.wait(list(tasks), timeout=2.0)

    def _held_by_shard(self) -> dict[int | None, list[int]]:
        """The commands held, by the shard of their execution (None: one shard)."""
        if self.shards <= 1:
            return {None: list(self.held)} if self.held else {}
        out: dict[int | None, list[int]] = {}
        for command_id, execution_id in self.held.items():
            out.setdefault(shard_for(execution_id, self.shards), []).append(command_id)
        return out

    async def _ask(self, puller: Puller) -> None:
        """Keep pull requests open for the free slots: asks again when a slot frees up, a
        request ends, or nothing arrived for a second. A small top-up left for later is
        asked for after TOP_UP_WAIT at the latest: a slot that runs handed-over commands
        never frees up, and a notification nobody asked for would wait for the second."""
        deferred = False
        while True:
            self._slot_freed.clear()
            deferred = await puller.ask(self.concurrency - self._taken, top_up=deferred)
            if not deferred:
                await self._slot_freed.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TOP_UP_WAIT):
                    await self._slot_freed.wait()

    def _release(self, n: int = 1) -> None:
        self._taken -= n
        self._slot_freed.set()

    def _machine_held(self, *, last_ms: int | None = None) -> dict[str, Any]:
        """The machine-id lease as a heartbeat sends it (with the bound of its ids over
        the renewed term), or the deregistration (`last_ms`: the lease ended, the last
        millisecond used)."""
        if self._machine is None:
            return {}
        if last_ms is None:
            last_ms = self.ids.issued_until_ms(extended_by=float(self._machine["seconds"]))
        return {
            "machine": {
                "machine_id": self._machine["machine_id"],
                "holder": self._machine["holder"],
                "issued_until_ms": max(0, last_ms),
            }
        }

    def _take_machine(self, reply: Any, sent: float) -> None:
        """Issue ids under the machine id of a register or heartbeat reply, until a
        margin short of its lease (measured from `sent`, before the request went)."""
        machine = reply.get("machine") if isinstance(reply, dict) else None
        if not isinstance(machine, dict):
            return  # a server that leases none: the hashed machine id stays
        seconds = float(machine["seconds"])
        self.ids.lease(
            int(machine["machine_id"]),
            valid_for=sent + seconds - lease_margin(seconds) - time.monotonic(),
            floor_ms=int(machine.get("floor_ms") or 0),
        )
        self._machine = machine

    async def _register(self) -> None:
        sent = time.monotonic()
        r = await self.client.post(
            REGISTER_PATH,
            {
                "worker_id": self.worker_id,
                "pool": self.pool,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "concurrency": self.concurrency,
            },
        )
        if r.status_code in (401, 403):
            from flowtide.errors import AuthError

            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text[:300]
            hint = (
                " (give the worker a token of role worker: FLOWTIDE_TOKEN, FLOWTIDE_TOKEN_FILE"
                " or --token-file)"
                if r.status_code == 401
                else ""
            )
            raise AuthError(
                f"{self.server} refused worker {self.worker_id}: {message}{hint}",
                status=r.status_code,
            )
        r.raise_for_status()
        reply = r.json()
        self.shards = max(1, int(reply.get("shards", 1)))
        self._reports.shards = self.shards
        self.lease = float(reply.get("lease", 30.0))
        self._reports.patience = max(60.0, 4 * self.lease)
        self._take_machine(reply, sent)

    async def _heartbeat(self) -> None:
        while True:
            every = self.lease / 6
            if self._machine is not None:
                every = min(every, float(self._machine["seconds"]) / 4)
            await asyncio.sleep(max(0.5, every))
            try:
                sent = time.monotonic()
                if self.shards > 1:
                    # Each shard extends the leases it holds; the machine id is renewed
                    # in the first (any server reaches the cluster database).
                    held = self._held_by_shard()
                    await asyncio.gather(
                        *(self._beat_shard(s, held.get(s, [])) for s in range(1, self.shards))
                    )
                    commands = held.get(0, [])
                else:
                    commands = list(self.held)
                r = await self.client.post(
                    HEARTBEAT_PATH,
                    {
                        "worker_id": self.worker_id,
                        "running": self.running,
                        "commands": [str(c) for c in commands],
                        **self._machine_held(),
                    },
                    shard=0 if self.shards > 1 else None,
                )
                if r.status_code == 404:
                    # The server no longer knows this worker (its row was removed): the
                    # beats would extend nothing until it registers again.
                    log.warning("heartbeat: worker %s unknown, registering again", self.worker_id)
                    await self._register()
                    continue
                r.raise_for_status()
                self._take_machine(r.json(), sent)
            except ServerError as exc:
                log.warning("heartbeat failed: %s", exc)

    def _run(
        self,
        claimed: Claimed,
        share: ExecutionShare,
        start: _Start,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> list[Any]:
        """Run a claimed command in this worker thread (`loop`: the worker's, which sends
        what the command reports while it runs)."""
        trace.mark("started", claimed.command.command_id)
        command = claimed.command

        def report(events: list[Any]) -> None:
            # Any thread (a spark loop's monitor): sent from the event loop, in order
            # with the command's other reports.
            if loop is not None and not loop.is_closed():
                send = self._report_part if claimed.chunk is not None else self._report_progress
                asyncio.run_coroutine_threadsafe(
                    send(command.execution_id, command.command_id, start, events), loop
                )

        return self._commands.run(
            claimed, share, start.events.extend, report, stopped=start.stale.is_set
        )

    async def _report_progress(
        self, execution_id: int, command_id: int, start: _Start, events: list[Any]
    ) -> None:
        """Send events of a running command (its progress), after its `command.started`
        (sent with them when it was not yet); dropped once the command's own report is
        on its way: that one says how it ended."""
        if start.finished:
            return
        with_start = not start.sent
        if with_start:
            start.sent = True
            events = [*start.events, *events]
        try:
            await self._reports.send(execution_id, [e.to_dict() for e in events], command_id)
        except Exception as exc:  # noqa: BLE001 - progress is news, never a result
            if with_start:
                start.sent = False  # it goes with the final report then
            log.debug("command %s: progress not reported: %s", command_id, exc)

    async def _report_part(
        self, execution_id: int, command_id: int, start: _Start, events: list[Any]
    ) -> None:
        """Send the iterations a chunk finished while it runs (after its `command.started`,
        sent with them when it was not yet). Results, not news: never dropped here; one
        that cannot be sent is left to the chunk's lease (its iterations not reported
        are issued again once the lease runs out)."""
        if not start.sent:
            start.sent = True
            events = [*start.events, *events]
        try:
            await self._reports.send(
                execution_id,
                [e.to_dict() for e in events],
                command_id,
                on_stale=start.stale.set,
            )
        except Exception as exc:  # noqa: BLE001 - its lease runs out: issued again
            log.warning("command %s: iterations not reported: %s", command_id, exc)

    async def _report_started(self, execution_id: int, command_id: int, start: _Start) -> None:
        """After `STARTED_AFTER` seconds, report the command's `command.started` if it is
        still running. Queued before the command's own report, so it arrives first."""
        await asyncio.sleep(STARTED_AFTER)
        if start.finished or not start.events:
            return
        start.sent = True
        try:
            await self._reports.send(execution_id, [e.to_dict() for e in start.events], command_id)
        except Exception as exc:  # noqa: BLE001 - the final report still says it ran
            # It goes with the final report then (the server skips it by its event id
            # if this one was written after all).
            start.sent = False
            log.debug("command %s: started not reported: %s", command_id, exc)

    async def _beat_shard(self, shard: int, commands: list[int]) -> None:
        """The heartbeat of shard `shard` (> 0): the leases of its executions' commands."""
        try:
            r = await self.client.post(
                HEARTBEAT_PATH,
                {
                    "worker_id": self.worker_id,
                    "running": self.running,
                    "commands": [str(c) for c in commands],
                },
                shard=shard,
            )
            if r.status_code != 404:  # 404: shard 0's beat registers again
                r.raise_for_status()
        except ServerError as exc:
            log.warning("heartbeat to shard %s failed: %s", shard, exc)

    async def _claim(self, msgs: list[Any], tasks: set[asyncio.Task[None]]) -> None:
        """Claim the notifications that arrived together (one request per shard), ack
        them, and start the commands won."""
        won = await claim(
            self.client, self.worker_id, msgs, self._release, self.shards, self._shares
        )
        for claimed, share in won:
            task = asyncio.create_task(self._handle(claimed, share))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _handle(self, claimed: Claimed, share: ExecutionShare) -> None:
        command_id = claimed.command.command_id
        execution_id = claimed.command.execution_id
        handed: Handed | None = None
        released = False
        self.held[command_id] = execution_id
        self.running += 1
        start = _Start()
        early = asyncio.create_task(self._report_started(execution_id, command_id, start))
        self._tasks.add(early)
        early.add_done_callback(self._tasks.discard)
        try:
            try:
                loop = asyncio.get_running_loop()
                events = await loop.run_in_executor(
                    self._threads, self._run, claimed, share, start, loop
                )
            finally:
                self.running -= 1
                start.finished = True
                if not start.sent:
                    early.cancel()
            if not start.sent:
                events = [*start.events, *events]
            if self._handing_back:
                return  # handed back to the server: another worker runs it again
            trace.mark("done", command_id)
            # The slot stays taken until the report is settled: the server may hand the
            # execution's next command over in the answer, to run in it. A report not
            # settled within REPORT_HOLDS_SLOT seconds (its shard down or slow) frees
            # the slot and goes on alone: otherwise a shard's outage left every slot
            # to its finished commands, and no other shard's command ran.
            sending = asyncio.ensure_future(
                self._reports.send(
                    execution_id,
                    [e.to_dict() for e in events],
                    command_id,
                    take=not (self._stop.is_set() or self._handing_back),
                )
            )
            done, _ = await asyncio.wait((sending,), timeout=REPORT_HOLDS_SLOT)
            if not done:
                released = True
                self._release()
            handed = await sending
            self.completed += 1
        except Exception as exc:  # noqa: BLE001 - one bad command must not stop the worker
            # Its lease runs out and the reaper issues it again.
            log.warning("command %s of execution %s: %s", command_id, execution_id, exc)
        finally:
            self.held.pop(command_id, None)
            if handed is None and not released:
                self._release()
        if handed is not None:
            if released:
                # Its slot was freed while the report waited: the handed command takes
                # one again (at most one more than the concurrency meanwhile, per such
                # report; its lease is already running).
                self._taken += 1
            # Claimed for this worker: it runs in the slot this command had.
            task = asyncio.create_task(self._handle(*handed))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
