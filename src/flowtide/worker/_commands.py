"""Running a claimed command in one of the worker's threads: the step's playbook (parsed
once per text), its context rebuilt from the claim reply, and what the step's tools ask
the server meanwhile (credentials, cancellation, sub-playbooks) on a blocking httpx
client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from flowtide import tracing
from flowtide.engine.events import Event
from flowtide.engine.state import context_from_parts
from flowtide.ids import Snowflake
from flowtide.logs import LogSpool
from flowtide.playbook.loader import parse_playbook
from flowtide.runtime.command import run_chunk, run_command
from flowtide.runtime.pipeline import StepRunner
from flowtide.tools.registry import cancel_running
from flowtide.tools.subplaybook import child_result
from flowtide.wire import (
    CANCELLATION_CHECK_PATH,
    CHILD_RESULT_PATH,
    CREDENTIALS_PATH,
    EXECUTE_PATH,
    EXECUTION_HEADER,
    TRACEPARENT_HEADER,
    Claimed,
    ExecutionShare,
)

__all__ = ["CommandCredentials", "CommandRunner"]

#: Seconds a cancellation check's answer serves the execution's other commands.
CANCEL_TTL = 1.0
#: Answers kept at most: past it, the expired ones go (one per execution ever run would
#: otherwise stay for the worker's life).
CANCEL_CACHE_MAX = 256
#: Seconds between a chunk's reports of the iterations it finished while it runs (a
#: worker that dies mid-chunk loses only what it ran since the last one).
CHUNK_REPORT_EVERY = 0.05


class CommandCredentials:
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
            r = self.client.post(
                CREDENTIALS_PATH,
                json={**self.body, "name": alias},
                # For a gateway in front of shards: the execution this request is about.
                headers={EXECUTION_HEADER: self.body["execution_id"]},
            )
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


class CommandRunner:
    """Runs claimed commands (thread-safe: one serves all the worker's threads)."""

    def __init__(
        self,
        client: httpx.Client,
        *,
        worker_id: str,
        pool: str,
        home: Path,
        template_env: Mapping[str, str],
        ids: Snowflake,
    ) -> None:
        self.client = client
        self.worker_id = worker_id
        self.pool = pool
        self.home = home
        self.template_env = template_env
        self.ids = ids
        self._runners: dict[tuple[str, str | None], StepRunner] = {}
        self._runners_lock = threading.Lock()
        self._cancel_cache: dict[int, tuple[float, bool]] = {}
        self._cancel_lock = threading.Lock()
        #: Commands whose thread is still inside `run` (a stuck one keeps the process
        #: from exiting normally: see `Worker.stuck`).
        self.in_threads = 0
        self._in_threads_lock = threading.Lock()
        #: Where what running steps print goes (the worker's `NatsLogSpool`, once NATS
        #: is connected; None: only to the events, as the step ends).
        self.logs: LogSpool | None = None

    def runner(self, share: ExecutionShare) -> StepRunner:
        # One parse per playbook text (the commands of an execution arrive together, and
        # the same playbook runs again and again): parsing costs ~100 ms on a slow machine.
        with self._runners_lock:
            key = (share.playbook_text, share.playbook_file)
            cached = self._runners.get(key)
            if cached is None:
                parsed = parse_playbook(share.playbook_text, share.playbook_file)
                cached = StepRunner(
                    parsed,
                    run_playbook=self.run_child,
                    data_dir=(self.home / "data").absolute(),
                )
                if len(self._runners) >= 64:
                    self._runners.pop(next(iter(self._runners)))
                self._runners[key] = cached
            return cached

    def cancelled(self, execution_id: int) -> bool:
        now = time.monotonic()
        cached = self._cancel_cache.get(execution_id)
        if cached is not None and now - cached[0] < CANCEL_TTL:
            return cached[1]
        try:
            r = self.client.get(CANCELLATION_CHECK_PATH.format(execution_id=execution_id))
            flag = bool(r.json().get("cancelled")) if r.status_code == 200 else False
        except httpx.HTTPError:
            flag = False
        with self._cancel_lock:
            cache = self._cancel_cache
            cache.pop(execution_id, None)  # re-inserted last: the dict stays oldest first
            cache[execution_id] = (now, flag)
            if len(cache) > CANCEL_CACHE_MAX:
                for key in [k for k, (at, _) in cache.items() if now - at >= CANCEL_TTL]:
                    del cache[key]
                while len(cache) > CANCEL_CACHE_MAX:
                    del cache[next(iter(cache))]
        if flag:
            cancel_running(execution_id)
        return flag

    def run(
        self,
        claimed: Claimed,
        share: ExecutionShare,
        on_started: Callable[[list[Event]], None] | None = None,
        report: Callable[[list[Event]], None] | None = None,
        stopped: Callable[[], bool] | None = None,
    ) -> list[Event]:
        """Run `claimed` in this thread; its events. `on_started`: given `command.started`
        as the command starts (then it is not among the events returned); `report`: given
        events to send while it runs (`run_command`); `stopped`: a chunk runs no further
        iteration once it says so (`run_chunk`)."""
        with self._in_threads_lock:
            self.in_threads += 1
        try:
            return self._run(claimed, share, on_started, report, stopped)
        finally:
            with self._in_threads_lock:
                self.in_threads -= 1

    def _run(
        self,
        claimed: Claimed,
        share: ExecutionShare,
        on_started: Callable[[list[Event]], None] | None,
        report: Callable[[list[Event]], None] | None = None,
        stopped: Callable[[], bool] | None = None,
    ) -> list[Event]:
        command = claimed.command
        runner = self.runner(share)
        credentials = CommandCredentials(
            self.client, self.worker_id, command.execution_id, command.command_id
        )
        if claimed.chunk is not None:
            return self._run_chunk(claimed, share, runner, credentials, on_started, report, stopped)
        parts = share.context
        base = context_from_parts(runner.playbook, command.execution_id, parts, self.template_env)
        ctx = parts["ctx"]
        return run_command(
            runner,
            command,
            base,
            ctx,
            next_id=self.ids.next_id,
            worker_id=self.worker_id,
            iterator=claimed.iterator,
            element=claimed.element,
            size=claimed.size,
            credentials=credentials,
            cancelled=lambda: self.cancelled(command.execution_id),
            traceparent=share.traceparent,
            logs=self.logs,
            on_started=on_started,
            report=report,
        )

    def _run_chunk(
        self,
        claimed: Claimed,
        share: ExecutionShare,
        runner: StepRunner,
        credentials: CommandCredentials,
        on_started: Callable[[list[Event]], None] | None,
        report: Callable[[list[Event]], None] | None,
        stopped: Callable[[], bool] | None = None,
    ) -> list[Event]:
        """Run a chunk of loop iterations (`run_chunk`): what finished goes to `report`
        every `CHUNK_REPORT_EVERY` seconds, so a worker that dies mid-chunk loses only
        what it ran since."""
        command = claimed.command
        eid = command.execution_id
        parts = share.context
        return run_chunk(
            runner,
            command,
            context_from_parts(runner.playbook, eid, parts, self.template_env),
            parts,
            claimed.chunk or [],
            post=report if report is not None else (lambda events: None),
            every=CHUNK_REPORT_EVERY if report is not None else float("inf"),
            next_id=self.ids.next_id,
            worker_id=self.worker_id,
            iterator=claimed.iterator,
            size=claimed.size,
            env=self.template_env,
            credentials=credentials,
            cancelled=lambda: self.cancelled(eid),
            traceparent=share.traceparent,
            logs=self.logs,
            on_started=on_started,
            stopped=stopped,
        )

    def run_child(
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

        # A gateway sends it to the parent's shard, whose servers hold the command; the
        # command running in this thread is the child's parent span.
        headers = {EXECUTION_HEADER: str(parent_execution_id)}
        under = tracing.current()
        if under is not None:
            headers[TRACEPARENT_HEADER] = under
        r = self.client.post(
            EXECUTE_PATH,
            json={
                "path": path,
                "payload": workload,
                "pool": self.pool,
                "parent_execution_id": parent_execution_id,
            },
            headers=headers,
        )
        if r.status_code >= 400:
            message = r.json().get("error", {}).get("message", r.text)
            raise ToolError(f"sub-playbook '{path}': {message}", kind="playbook_error")
        child = r.json()["execution_id"]
        while True:
            # The intact result, not the masked document: the parent's step uses it.
            doc = self.client.get(CHILD_RESULT_PATH.format(execution_id=child)).json()
            if doc["status"] != "running":
                break
            time.sleep(0.1)
        return child_result(
            path, child, doc["status"], doc.get("error"), doc["steps"], doc["result"], return_step
        )
