"""A worker process of the distributed runtime (`flowtide worker`).

It pulls command notifications of its pool from NATS JetStream (one durable consumer per
pool, shared by every worker of the pool; pull requests kept open for its free slots) and
claims what arrived together in one request (`POST /api/commands/claim`: per command
exactly one claimer wins; a loser acks and moves on). It runs each command won with the
same `StepRunner` as the embedded runtime in a thread, and sends the events back in
batches (`POST /api/events/reports`, retried; the server drops event ids it already
has). Its own calls to the server go through aiohttp (`_Api`); the steps' threads use a
blocking httpx client (credentials, cancellation checks). It registers its pool and
heartbeats; the heartbeat extends the leases of the commands it holds, so a worker that
dies loses them to the server's reaper after one lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from flowtide.engine.state import context_from_parts
from flowtide.ids import Snowflake
from flowtide.natsauth import NatsAuth, connect_nats
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.template import visible_env
from flowtide.runtime.pipeline import StepRunner, child_result, crashed, outcome_events
from flowtide.tools.python_pool import Isolation
from flowtide.tools.registry import cancel_running
from flowtide.wire import (
    CANCELLATION_CHECK_PATH,
    CHILD_RESULT_PATH,
    CLAIM_PATH,
    COMMAND_STREAM,
    CREDENTIALS_PATH,
    DEREGISTER_PATH,
    EXECUTE_PATH,
    HEARTBEAT_PATH,
    REGISTER_PATH,
    RELEASE_PATH,
    REPORTS_PATH,
    Claimed,
    ClaimReply,
    ClaimRequest,
    ExecutionShare,
    Notification,
    Report,
    ReportsReply,
    pool_consumer,
    reports_body,
    worker_inbox,
)

__all__ = ["RemoteWorker"]

log = logging.getLogger("flowtide.worker")


class _CommandCredentials:
    """A command's credential resolver: the server gives a credential's body to the
    worker that holds a live claim on the command, and to nobody else (workers have no
    master key). Bodies are kept for the command's run only."""

    def __init__(
        self, client: httpx.Client, worker_id: str, execution_id: int, command_id: int
    ) -> None:
        self.client = client
        self.body = {
            "worker_id": worker_id,
            "execution_id": str(execution_id),
            "command_id": str(command_id),
        }
        self._got: dict[str, dict[str, Any]] = {}

    def resolve(self, alias: str) -> dict[str, Any]:
        from flowtide.errors import CredentialError

        found = self._got.get(alias)
        if found is not None:
            return found
        try:
            r = self.client.post(CREDENTIALS_PATH, json={**self.body, "name": alias})
        except httpx.HTTPError as exc:
            raise CredentialError(f"credential '{alias}': server unreachable: {exc}") from None
        if r.status_code == 404:
            raise CredentialError(
                f"credential '{alias}' is not defined on the server; an admin adds it with:"
                f" flowtide credential set {alias} --server URL --json '{{...}}'",
                missing=True,
            )
        if r.status_code == 422:
            raise CredentialError(f"'{alias}' is not a credential alias")
        if r.status_code >= 400:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text[:300]
            raise CredentialError(f"credential '{alias}': HTTP {r.status_code}: {message}")
        body = r.json()["data"]
        self._got[alias] = body
        return dict(body)


class ApiError(Exception):
    """A call to the server that got no usable answer (connection, timeout, 4xx/5xx)."""


@dataclass(frozen=True)
class _Reply:
    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise ApiError(f"HTTP {self.status_code}: {self.text[:500]}")


class _Api:
    """The worker's own calls to the server, on one aiohttp session (kept-alive
    connections). aiohttp rather than httpx here: on a claim's path it takes about 1 ms
    less per request than httpx's async client (bench/RESULTS.md)."""

    def __init__(
        self, server: str, timeout: float, headers: Mapping[str, str], tls: ssl.SSLContext
    ) -> None:
        self.server = server
        self.timeout = timeout
        self.headers = dict(headers)
        self.tls = tls
        self._session: Any = None

    async def __aenter__(self) -> _Api:
        import aiohttp

        self._errors: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            headers=self.headers,
            connector=aiohttp.TCPConnector(ssl=self.tls),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    async def post(self, path: str, body: Any) -> _Reply:
        """POST `body` as JSON; the reply, whatever its status. Raises ApiError when none
        came (connection refused or lost, timeout)."""
        return await self.post_json(path, json.dumps(body).encode())

    async def post_json(self, path: str, data: bytes) -> _Reply:
        """POST JSON text already encoded (see `post`)."""
        headers = {"content-type": "application/json"}
        try:
            async with self._session.post(self.server + path, data=data, headers=headers) as r:
                return _Reply(r.status, await r.read())
        except self._errors as exc:
            raise ApiError(f"POST {path}: {str(exc) or type(exc).__name__}") from exc


@dataclass
class _Pending:
    execution_id: int
    #: The report as JSON text, encoded once (batches are joined from these).
    raw: bytes
    done: asyncio.Future[None]
    give_up: float


class _Reporter:
    """Sends the worker's reports to the server, as many per request as are waiting.

    One request is in flight at a time; what finishes meanwhile goes in the next one, so
    under load a request carries many reports (one transaction per execution on the
    server) and a lone report leaves at once. A report the server could not take (a
    restart, a network blip, a 5xx) is sent again for up to `patience` seconds; past
    that its command has been issued again and the report would be stale anyway.
    """

    def __init__(
        self,
        worker_id: str,
        patience: float,
        *,
        max_batch: int = 256,
        max_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.worker_id = worker_id
        self.patience = patience
        self.max_batch = max_batch
        # Well under the server's request cap (16 MiB by default): a batch holds reports
        # up to this size, or one report alone (a result is at most 4 MiB: pipeline).
        self.max_bytes = max_bytes
        self._waiting: list[_Pending] = []
        self._wake = asyncio.Event()

    async def send(self, execution_id: int, events: list[dict[str, Any]]) -> None:
        """Queue one command's report; returns when the server took it (or refused it as
        stale or invalid, which is logged). Raises RuntimeError when it gave up."""
        done = asyncio.get_running_loop().create_future()
        raw = Report(execution_id, events).to_json()
        self._waiting.append(_Pending(execution_id, raw, done, time.monotonic() + self.patience))
        self._wake.set()
        await done

    async def run(self, client: _Api) -> None:
        delay = 0.2
        while True:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            size, n = 0, 0
            for p in self._waiting[: self.max_batch]:
                size += len(p.raw)
                if n and size > self.max_bytes:
                    break
                n += 1
            batch = self._waiting[:n]
            del self._waiting[:n]
            problem = await self._post(client, batch)
            if problem is None:
                delay = 0.2
                continue
            now = time.monotonic()
            retry = []
            for p in batch:
                if p.done.done():
                    continue
                if now > p.give_up:
                    p.done.set_exception(
                        RuntimeError(f"report for execution {p.execution_id} failed: {problem}")
                    )
                else:
                    retry.append(p)
            self._waiting[:0] = retry
            if retry:
                log.warning(
                    "%d reports not taken, retrying in %.1fs: %s", len(retry), delay, problem
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _post(self, client: _Api, batch: list[_Pending]) -> str | None:
        """Settle what the server took; the problem when some of it is to be sent again."""
        body = reports_body(self.worker_id, [p.raw for p in batch])
        try:
            r = await client.post_json(REPORTS_PATH, body)
        except ApiError as exc:
            return str(exc)
        if r.status_code >= 500:
            return f"HTTP {r.status_code}"
        if r.status_code >= 400:
            # The whole body was refused (it is ours, so this is a bug): nothing to retry.
            for p in batch:
                p.done.set_exception(RuntimeError(f"reports refused: {r.text[:500]}"))
            return None
        problem = None
        for p, result in zip(batch, ReportsReply.from_json(r.body).results, strict=True):
            if result.code >= 500:
                problem = f"HTTP {result.code}: {result.message}"
                continue
            if result.code >= 400:
                # 409: stale (the command was issued again meanwhile).
                log.warning("report for execution %s refused: %s", p.execution_id, result.to_dict())
            p.done.set_result(None)
        return problem


class _Puller:
    """Pull requests on a JetStream consumer kept open for a worker's free slots, with the
    messages handed over as they arrive.

    nats-py's `fetch(batch=n)` returns once it has n messages or its pull request ends:
    when fewer than n arrive on a lingering request, the ones that did wait for its
    expiry (up to a second here, seen as 0.8 s gaps in a loop's log). Here each message
    is the caller's as soon as it lands, with whatever else landed meanwhile.

    `credit` counts the messages asked for and not delivered: a request that expires
    ends with a 408 status saying how many of its batch it did not deliver. The credit
    of requests lost otherwise (a reconnect, a 409) is dropped once every request asked
    for must have expired.
    """

    def __init__(
        self, nc: Any, stream: str, consumer: str, changed: asyncio.Event, *, expires: float = 5.0
    ) -> None:
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.expires = expires
        self.credit = 0
        self._asked_at = 0.0
        self._inbox = nc.new_inbox()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._sub: Any = None
        #: Set when credit was returned (a request ended) or nothing arrived for a while:
        #: the asker looks again.
        self.changed = changed

    async def start(self) -> None:
        async def deliver(msg: Any) -> None:
            self._queue.put_nowait(msg)

        self._sub = await self.nc.subscribe(self._inbox, cb=deliver)

    async def ask(self, free: int) -> None:
        """Ask for messages up to `free` minus what is already asked for; small top-ups
        wait until a quarter of the slots are free, so that a busy worker keeps a few
        requests open rather than one per finished command."""
        now = time.monotonic()
        if self.credit and now - self._asked_at > self.expires + 2.0:
            self.credit = 0  # every request asked for has expired by now
        want = free - self.credit
        if want <= 0 or (self.credit and want < max(1, free // 4)):
            return

        body = {"batch": want, "expires": int(self.expires * 1e9)}
        await self.nc.publish(self.subject, json.dumps(body).encode(), reply=self._inbox)
        self.credit += want
        self._asked_at = now

    async def take(self, timeout: float) -> list[Any]:
        """The messages that arrived (at least one, or none after `timeout` seconds)."""
        try:
            # (asyncio.timeout, not wait_for: on 3.11 wait_for runs the get in a task of
            # its own, one more turn of the loop before the message is the caller's.)
            async with asyncio.timeout(timeout):
                first = await self._queue.get()
        except TimeoutError:
            self.changed.set()  # a stale credit is dropped by the next ask
            return []
        got = [first]
        while not self._queue.empty():
            got.append(self._queue.get_nowait())
        msgs = []
        for msg in got:
            status = msg.headers.get("Status") if msg.headers else None
            if status is None and msg.reply:
                self.credit -= 1
                msgs.append(msg)
            elif status is not None:
                # 408: the request expired; 409: it was ended (consumer changed, too
                # many waiting). Either way its undelivered part is no longer asked for.
                undelivered = msg.headers.get("Nats-Pending-Messages")
                if undelivered is not None:
                    self.credit -= int(undelivered)
                elif status != "100":
                    log.info("pull request ended: %s %s", status, msg.headers.get("Description"))
                self.changed.set()
        self.credit = max(0, self.credit)
        return msgs

    async def close(self) -> list[Any]:
        """Stop receiving; the messages received and not taken (to be nak'ed)."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        left = []
        while not self._queue.empty():
            msg = self._queue.get_nowait()
            if msg.reply and "Status" not in (msg.headers or {}):
                left.append(msg)
        return left


class RemoteWorker:
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
    ) -> None:
        """`token` and `ca`: see flowtide.auth.login and flowtide.tls (FLOWTIDE_TOKEN,
        FLOWTIDE_CA and FLOWTIDE_CLIENT_CERT/KEY by default). `python`: how python steps
        run (default: in child processes, `Isolation.from_env(mode="process")`). `grace`:
        seconds that running commands get to finish once `stop()` is called; what is still
        running then is stopped and handed back to the server for another worker.

        Raises:
            FlowtideError: the token file or a TLS file cannot be read, or a python
                setting is not understood.
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
        self.home = home or Path(".flowtide")
        self.ids = Snowflake()
        self.running = 0
        self.completed = 0
        # Commands claimed and not yet reported: the heartbeat extends only their leases.
        self.held: set[int] = set()
        self._runners: dict[tuple[str, str | None], StepRunner] = {}
        self._runners_lock = threading.Lock()
        self._threads = ThreadPoolExecutor(concurrency, thread_name_prefix=self.worker_id)
        self._stop = asyncio.Event()
        #: Fetched notifications not yet settled (claim lost, or command reported).
        self._taken = 0
        self._slot_freed = asyncio.Event()
        # Reports are retried while the server is away for up to four leases (the
        # register reply sets the lease).
        self._reports = _Reporter(self.worker_id, 120.0)
        self._cancel_cache: dict[int, tuple[float, bool]] = {}
        self._sync = httpx.Client(
            base_url=self.server, timeout=30.0, headers=self._headers, verify=self._tls
        )
        # A worker shows templates only the variables FLOWTIDE_TEMPLATE_ENV lists.
        self.template_env = visible_env(os.environ, embedded=False)
        self.python = python or Isolation.from_env(mode="process", embedded=False)
        self.grace = grace
        #: Set once the grace period is over: what finishes now is handed back, not reported.
        self._handing_back = False
        #: Commands whose thread is still inside `_run_command` (a stuck one keeps the
        #: process from exiting normally: see `stuck`).
        self._in_threads = 0
        self._in_threads_lock = threading.Lock()

    def stop(self) -> None:
        """Stop claiming; running commands get `grace` seconds (see `__init__`)."""
        self._stop.set()

    @property
    def stuck(self) -> bool:
        """Whether threads are still running commands (code that cannot be interrupted):
        the process should then end without waiting for them."""
        return self._in_threads > 0

    async def _start_python(self) -> None:
        """Set up python steps (and warn when this process runs as root).

        Raises:
            ToolError: a python child process cannot start (as the chosen user): the
                worker must not take commands it would fail, or run as root unasked.
        """
        from flowtide.tools.registry import get_tool

        tool = get_tool("python")
        tool.configure(self.python)
        await asyncio.to_thread(tool.warm)
        if os.geteuid() == 0:
            if self.python.mode != "process":
                who = "as root, in the worker process"
            else:
                who = f"as user {tool.pool().user}, in child processes"
            log.warning(
                "flowtide worker %s runs as root: run it as an unprivileged user. Python"
                " steps run %s (--python-user, --python-isolation).",
                self.worker_id,
                who,
            )

    async def run(self) -> None:
        from flowtide.redaction import install_log_masking

        # Values the steps' tools touch are masked in this process's logs.
        install_log_masking()
        # Before it registers: a worker whose python steps cannot start takes no command.
        await self._start_python()
        async with _Api(self.server, 30.0, self._headers, self._tls) as client:
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
                await self._check_consumer(nc.jetstream(), durable)
            except BaseException:
                with contextlib.suppress(Exception):
                    await nc.close()
                raise
            puller = _Puller(nc, COMMAND_STREAM, durable, self._slot_freed)
            await puller.start()
            # Paid once here rather than inside the first HTTP step it runs.
            from flowtide.tools import http as http_tool

            await asyncio.to_thread(http_tool.warm_up)
            beat = asyncio.create_task(self._heartbeat())
            reporter = asyncio.create_task(self._reports.run(client))
            asker = asyncio.create_task(self._ask(puller))
            tasks: set[asyncio.Task[None]] = set()
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
                with contextlib.suppress(Exception):
                    await client.post(
                        DEREGISTER_PATH,
                        {"worker_id": self.worker_id, "running": 0},
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
        held = sorted(self.held)
        log.warning(
            "grace period (%gs) over: stopping %d running commands and handing them back",
            self.grace,
            len(held),
        )
        if held:
            try:
                r = await self.client.post(
                    RELEASE_PATH,
                    {"worker_id": self.worker_id, "commands": [str(c) for c in held]},
                )
                r.raise_for_status()
            except ApiError as exc:
                # Their leases run out instead: the reaper issues them again later.
                log.warning("handing back %d commands failed: %s", len(held), exc)
        cancel_running(None)
        for task in tasks:
            task.cancel()
        await asyncio.wait(list(tasks), timeout=2.0)

    async def _check_consumer(self, js: Any, durable: str) -> None:
        """Fail clearly when the pool's consumer is missing or out of reach. The server
        creates it (`ensure_consumer`) when the worker registers: a worker's NATS user
        may pull from it, never create it."""
        import nats.errors
        from nats.js.errors import NotFoundError

        from flowtide.errors import NatsError
        from flowtide.urls import redact_url

        where = f"consumer {durable} of stream {COMMAND_STREAM} at {redact_url(self.nats_url)}"
        try:
            await js.consumer_info(COMMAND_STREAM, durable)
        except NotFoundError:
            raise NatsError(
                f"no {where}: the server creates it when a worker registers"
                " (is the server connected to the same NATS, with --nats?)",
                url=redact_url(self.nats_url),
            ) from None
        except nats.errors.TimeoutError:
            # A refused request gets no reply; the refusal itself is logged just before.
            raise NatsError(
                f"no answer about {where} (a permissions violation logged above means"
                " this NATS user is not the one for pool " + repr(self.pool) + ")",
                url=redact_url(self.nats_url),
            ) from None

    async def _ask(self, puller: _Puller) -> None:
        """Keep pull requests open for the free slots: asks again when a slot frees up, a
        request ends, or nothing arrived for a second."""
        while True:
            self._slot_freed.clear()
            await puller.ask(self.concurrency - self._taken)
            await self._slot_freed.wait()

    def _release(self, n: int = 1) -> None:
        self._taken -= n
        self._slot_freed.set()

    async def _register(self) -> None:
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
        self.lease = float(r.json().get("lease", 30.0))
        self._reports.patience = max(60.0, 4 * self.lease)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(max(0.5, self.lease / 6))
            try:
                r = await self.client.post(
                    HEARTBEAT_PATH,
                    {
                        "worker_id": self.worker_id,
                        "running": self.running,
                        "commands": [str(c) for c in self.held],
                    },
                )
                if r.status_code == 404:
                    # The server no longer knows this worker (its row was removed): the
                    # beats would extend nothing until it registers again.
                    log.warning("heartbeat: worker %s unknown, registering again", self.worker_id)
                    await self._register()
                    continue
                r.raise_for_status()
            except ApiError as exc:
                log.warning("heartbeat failed: %s", exc)

    async def _claim(self, msgs: list[Any], tasks: set[asyncio.Task[None]]) -> None:
        """Claim the notifications that arrived together in one request, ack them, and
        start the commands won."""
        notes: list[Notification] = []
        kept: list[Any] = []
        for msg in msgs:
            try:
                notes.append(Notification.from_json(msg.data))
                kept.append(msg)
            except ValueError as exc:
                # Not ours to run, ever: dropped rather than redelivered forever.
                log.warning("unreadable notification %r: %s", msg.data[:200], exc)
                with contextlib.suppress(Exception):
                    await msg.term()
                self._release()
        if not notes:
            return
        request = ClaimRequest(self.worker_id, [n.claim_item() for n in notes])
        try:
            r = await self.client.post_json(CLAIM_PATH, request.to_json())
            r.raise_for_status()
            reply = ClaimReply.from_json(r.body)
        except Exception as exc:  # noqa: BLE001 - the notifications come back later
            log.warning("claim of %d commands failed: %s", len(notes), exc)
            for msg in kept:
                with contextlib.suppress(Exception):
                    await msg.nak(delay=1.0)
            self._release(len(kept))
            return
        # Claimed or not, the notifications have done their job: the claim row is the
        # durable record, and the reaper re-issues a claimed command that is lost.
        for msg in kept:
            with contextlib.suppress(Exception):
                await msg.ack()
        for result in reply.results:
            if not isinstance(result, Claimed):
                self._release()
                continue
            share = reply.executions[result.command.execution_id]
            task = asyncio.create_task(self._handle(result, share))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _handle(self, claimed: Claimed, share: ExecutionShare) -> None:
        command_id = claimed.command.command_id
        execution_id = claimed.command.execution_id
        self.held.add(command_id)
        self.running += 1
        try:
            try:
                events = await asyncio.get_running_loop().run_in_executor(
                    self._threads, self._run_command, claimed, share
                )
            finally:
                self.running -= 1
            if self._handing_back:
                return  # handed back to the server: another worker runs it again
            await self._reports.send(execution_id, [e.to_dict() for e in events])
            self.completed += 1
        except Exception as exc:  # noqa: BLE001 - one bad command must not stop the worker
            # Its lease runs out and the reaper issues it again.
            log.warning("command %s of execution %s: %s", command_id, execution_id, exc)
        finally:
            self.held.discard(command_id)
            self._release()

    def _runner(self, share: ExecutionShare) -> StepRunner:
        # One parse per playbook text (the commands of an execution arrive together, and
        # the same playbook runs again and again): parsing costs ~100 ms on a slow machine.
        with self._runners_lock:
            key = (share.playbook_text, share.playbook_file)
            cached = self._runners.get(key)
            if cached is None:
                parsed = parse_playbook(share.playbook_text, share.playbook_file)
                cached = StepRunner(
                    parsed,
                    run_playbook=self._run_child,
                    data_dir=(self.home / "data").absolute(),
                )
                if len(self._runners) >= 64:
                    self._runners.pop(next(iter(self._runners)))
                self._runners[key] = cached
            return cached

    def _cancelled(self, execution_id: int) -> bool:
        now = time.monotonic()
        cached = self._cancel_cache.get(execution_id)
        if cached is not None and now - cached[0] < 1.0:
            return cached[1]
        try:
            r = self._sync.get(CANCELLATION_CHECK_PATH.format(execution_id=execution_id))
            flag = bool(r.json().get("cancelled")) if r.status_code == 200 else False
        except httpx.HTTPError:
            flag = False
        self._cancel_cache[execution_id] = (now, flag)
        if flag:
            cancel_running(execution_id)
        return flag

    def _run_command(self, claimed: Claimed, share: ExecutionShare) -> list[Any]:
        with self._in_threads_lock:
            self._in_threads += 1
        try:
            return self._run_command_in_thread(claimed, share)
        finally:
            with self._in_threads_lock:
                self._in_threads -= 1

    def _run_command_in_thread(self, claimed: Claimed, share: ExecutionShare) -> list[Any]:
        command = claimed.command
        runner = self._runner(share)
        step = runner.playbook.steps[command.step]
        parts = share.context
        base = context_from_parts(runner.playbook, command.execution_id, parts, self.template_env)
        ctx = parts["ctx"]
        credentials = _CommandCredentials(
            self._sync, self.worker_id, command.execution_id, command.command_id
        )
        try:
            if command.extra.get("cursor"):
                outcome = runner.claim(
                    step,
                    base,
                    ctx,
                    execution_id=command.execution_id,
                    credentials=credentials,
                )
            else:
                outcome = runner.run(
                    step,
                    base,
                    ctx,
                    execution_id=command.execution_id,
                    credentials=credentials,
                    iterator=claimed.iterator,
                    element=claimed.element,
                    index=command.loop_index,
                    cancelled=lambda: self._cancelled(command.execution_id),
                )
        except Exception as exc:  # noqa: BLE001 - report, never lose a command
            outcome = crashed(exc)
        return outcome_events(command, outcome, self.ids.next_id, self.worker_id)

    def _run_child(
        self,
        *,
        path: str,
        workload: dict[str, Any],
        return_step: str | None,
        parent_execution_id: int,
        base_dir: Path,
    ) -> Any:
        """A `playbook` step: start the child through the API and wait for it."""
        from flowtide.errors import ToolError

        r = self._sync.post(
            EXECUTE_PATH,
            json={
                "path": path,
                "payload": workload,
                "pool": self.pool,
                "parent_execution_id": parent_execution_id,
            },
        )
        if r.status_code >= 400:
            message = r.json().get("error", {}).get("message", r.text)
            raise ToolError(f"sub-playbook '{path}': {message}", kind="playbook_error")
        child = r.json()["execution_id"]
        while True:
            # The intact result, not the masked document: the parent's step uses it.
            doc = self._sync.get(CHILD_RESULT_PATH.format(execution_id=child)).json()
            if doc["status"] != "running":
                break
            time.sleep(0.1)
        return child_result(
            path, child, doc["status"], doc.get("error"), doc["steps"], doc["result"], return_step
        )
