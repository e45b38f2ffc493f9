"""The store port: event log, commands, execution projection, catalog and credentials.

The port is synchronous: the runtime calls it from a dedicated writer thread, and readers
(API, CLI) call it from their own threads. Every adapter is usable from several threads.

Per-execution data (executions, events, commands) is always addressed by execution_id so a
sharded router can forward each call to the owning shard; catalog and credentials are
cluster-wide. Adapters raise only `flowtide.errors.StoreError` / `NotFoundError`. The
triggers' part of the port (schedules, webhooks, subscriptions) is `store.triggers`.

Secrets: a writer passes each execution's secret set (the values its tools touched); what
holds one of them is stored sealed with the master key and read back intact
(`flowtide.sealing`), so the store never holds a secret in plaintext and readers never
see altered data.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from flowtide.engine.events import Command, Event
from flowtide.store.catalogpaths import catalog_path_problem
from flowtide.store.notifications import NotificationStore, PendingNotification
from flowtide.store.retention import RetentionStore
from flowtide.store.triggers import Firing, TriggerStore

__all__ = [
    "COMMAND_STATUSES",
    "ENDED_STATUSES",
    "EXECUTION_CREATED",
    "INTERRUPTED",
    "PENDING_COMMAND_STATUSES",
    "UNSET",
    "CatalogRow",
    "CommandRow",
    "CommandUpdate",
    "ExecutionRow",
    "ExecutionUpdate",
    "Store",
    "Unset",
    "catalog_path_problem",
]

#: Status of an execution row right after `create_execution`.
EXECUTION_CREATED: Final = "created"

#: The statuses of an execution that has ended (its log no longer grows).
ENDED_STATUSES: Final = frozenset({"completed", "failed", "cancelled"})
#: What an embedded execution whose row says running is shown as once no live process
#: runs it (`flowtide.runlock.stopped_runs`): derived when read, never stored.
INTERRUPTED: Final = "interrupted"
COMMAND_STATUSES: Final = frozenset({"issued", "claimed", "completed", "failed", "cancelled"})
#: Statuses of commands a worker still has to finish (`pending_commands`).
PENDING_COMMAND_STATUSES: Final = ("issued", "claimed")


class Unset(enum.Enum):
    """Type of `UNSET`: "leave this column as it is" (distinct from None, which clears)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset.UNSET


@dataclass(frozen=True, slots=True)
class ExecutionRow:
    """The projection of one execution (the event log stays the source of truth)."""

    execution_id: int
    parent_execution_id: int | None
    parent_command_id: int | None
    playbook_path: str | None
    playbook_version: int | None
    playbook_file: str | None
    playbook_text: str
    workload: dict[str, Any]
    status: str
    result: Any
    error: dict[str, Any] | None
    created: float
    updated: float
    #: What started it: {"kind", "name", key} (`store.triggers.TRIGGER_KEYS`), or None.
    trigger: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class ExecutionUpdate:
    """A change to an execution row, applied inside an `append` batch.

    `result` / `error` left as `UNSET` keep their stored value; `error=None` clears it.
    """

    execution_id: int
    status: str
    updated: float
    result: Any | Unset = UNSET
    error: dict[str, Any] | None | Unset = UNSET


@dataclass(frozen=True, slots=True)
class CommandRow:
    """One command as stored: its identity plus its latest status."""

    command_id: int
    execution_id: int
    step: str
    status: str
    attempt: int
    loop_instance: int | None
    loop_index: int | None
    worker_id: str | None
    payload: dict[str, Any] | None
    created: float
    updated: float

    def to_command(self) -> Command:
        """Rebuild the engine's `Command` (payload as written by `CommandUpdate.from_command`)."""
        payload = self.payload or {}
        return Command(
            command_id=self.command_id,
            execution_id=self.execution_id,
            step=self.step,
            attempt=self.attempt,
            loop_instance=self.loop_instance,
            loop_index=self.loop_index,
            issued_event_id=payload.get("issued_event_id"),
            extra=dict(payload.get("extra") or {}),
        )


@dataclass(frozen=True, slots=True)
class CommandUpdate:
    """Insert-or-update of one command, keyed by `command_id`.

    On insert every field is taken (`attempt` None means 1) and `created = updated = time`.
    On update the command's identity (execution_id, step, loop_instance, loop_index,
    created) is kept; `status` and `updated` are overwritten; `attempt`, `worker_id` and
    `payload` are overwritten only when not None, except that going back to `issued`
    (a re-issue after a lease expired) clears `worker_id` unless one is given.
    Several updates of one command in a batch apply in order: the last one wins.
    """

    command_id: int
    execution_id: int
    step: str
    status: str
    time: float
    attempt: int | None = None
    loop_instance: int | None = None
    loop_index: int | None = None
    worker_id: str | None = None
    payload: dict[str, Any] | None = None

    @classmethod
    def from_command(
        cls,
        command: Command,
        *,
        status: str = "issued",
        time: float,
        worker_id: str | None = None,
    ) -> CommandUpdate:
        """Build the update recording `command` with `status` (default: just issued)."""
        return cls(
            command_id=command.command_id,
            execution_id=command.execution_id,
            step=command.step,
            status=status,
            time=time,
            attempt=command.attempt,
            loop_instance=command.loop_instance,
            loop_index=command.loop_index,
            worker_id=worker_id,
            payload={"issued_event_id": command.issued_event_id, "extra": command.extra},
        )


@dataclass(frozen=True, slots=True)
class CatalogRow:
    """One registered playbook version; `versions` counts every version of `path`."""

    path: str
    version: int
    text: str
    source_file: str | None
    created: float
    versions: int


@runtime_checkable
class Store(TriggerStore, NotificationStore, RetentionStore, Protocol):
    """Event log, commands, execution projection, playbook catalog and credentials."""

    # -- executions ------------------------------------------------------------------

    def create_execution(
        self,
        execution_id: int,
        *,
        playbook_path: str | None,
        playbook_version: int | None,
        playbook_file: str | None,
        playbook_text: str,
        workload: dict[str, Any],
        parent_execution_id: int | None = None,
        parent_command_id: int | None = None,
        created: float,
        secrets: Collection[str] = (),
        firing: Firing | None = None,
        deadline: float | None = None,
        sla: float | None = None,
    ) -> None:
        """Record a new execution with status `EXECUTION_CREATED` and `updated = created`.

        Args:
            execution_id: snowflake id of the execution.
            playbook_path: catalog path, when the playbook came from the catalog.
            playbook_version: catalog version, when the playbook came from the catalog.
            playbook_file: file the playbook was read from, when it came from a file.
            playbook_text: the exact YAML that runs (executions never follow catalog edits).
            workload: the merged workload (JSON-serialisable).
            parent_execution_id: the execution whose `playbook` step started this one.
            parent_command_id: the command of that step.
            created: Unix seconds.
            secrets: the execution's secret set so far (a sub-playbook inherits its
                parent's): a workload holding one is stored sealed.
            firing: the trigger firing that starts it, recorded in the same transaction
                (the execution's `trigger`).
            deadline: when its playbook's `timeout:` runs out; sla: its `sla:` (instants).
        Raises:
            AlreadyFired: `firing` was recorded before; nothing is written.
            StoreError: the execution already exists, or the store failed.
        """
        ...

    def get_execution(self, execution_id: int) -> ExecutionRow:
        """Return one execution.

        Args:
            execution_id: the execution to read.
        Returns:
            Its row.
        Raises:
            NotFoundError: no such execution.
            StoreError: the store failed.
        """
        ...

    def list_executions(
        self,
        *,
        status: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        playbook: str | None = None,
        parent_id: int | None = None,
        created_since: float | None = None,
        created_until: float | None = None,
        min_seconds: float | None = None,
        max_seconds: float | None = None,
        now: float | None = None,
        trigger: str | None = None,
    ) -> list[ExecutionRow]:
        """Return executions newest first (execution_id descending).

        Args:
            status: only executions with this status.
            limit: at most this many rows (>= 0).
            before_id: only executions with an id below this one (next page).
            playbook: only executions whose playbook path or file contains this text
                (case-insensitive for ASCII letters).
            parent_id: only sub-playbook executions of this execution.
            created_since: only executions created at or after this time (epoch s).
            created_until: only executions created before this time.
            min_seconds: only executions that lasted at least this long: from creation
                to their last update once ended, to `now` while not ended.
            max_seconds: only executions that lasted at most this long (as above).
            now: the time running executions' durations are measured to (default: the
                current time).
            trigger: only executions a trigger started: its kind ("schedule", "hook",
                "subscription"), or "kind:name" for one trigger.
        Returns:
            The rows, newest first.
        Raises:
            StoreError: negative limit, or the store failed.
        """
        ...

    def update_execution(
        self,
        execution_id: int,
        *,
        status: str,
        result: Any | Unset = UNSET,
        error: dict[str, Any] | None | Unset = UNSET,
        updated: float,
        secrets: Collection[str] = (),
    ) -> None:
        """Change an execution's status, and its result or error when given.

        Args:
            execution_id: the execution to change.
            status: the new status.
            result: the new result (any JSON value); `UNSET` keeps the stored one.
            error: the new error; None clears it; `UNSET` keeps the stored one.
            updated: Unix seconds.
            secrets: the execution's secret set: a result or error holding one is sealed.
        Raises:
            NotFoundError: no such execution.
            StoreError: a value is not JSON-serialisable, or the store failed.
        """
        ...

    # -- events ----------------------------------------------------------------------

    def append(
        self,
        events: Sequence[Event],
        *,
        commands: Sequence[CommandUpdate] = (),
        execution_updates: Sequence[ExecutionUpdate] = (),
        secrets: Mapping[int, Collection[str]] | None = None,
        notifications: Sequence[PendingNotification] = (),
    ) -> None:
        """Write a batch in one transaction: all of it becomes visible, or none of it.

        This is the hot path (group commit): the runtime hands over everything one engine
        step produced. Events are applied first, then command upserts, then execution
        updates, each in the given order.

        Args:
            events: events to add to the log; (execution_id, event_id) must be new.
            commands: command upserts (see `CommandUpdate`).
            execution_updates: execution row changes (see `ExecutionUpdate`).
            secrets: execution id -> its secret set. An event payload or error, or an
                execution result or error, holding one of its execution's values is
                stored sealed; `secrets.added` events always are. Reads unseal them.
            notifications: deliveries its transitions owe (`flowtide.notify`'s outbox).
        Raises:
            NotFoundError: an execution update names a missing execution.
            StoreError: a duplicate event, an unknown command status, a value that is not
                JSON-serialisable, or a store failure. Nothing of the batch is written.
        """
        ...

    def events(
        self,
        execution_id: int,
        *,
        after_event_id: int | None = None,
        limit: int | None = None,
        types: Collection[str] | None = None,
        steps: Collection[str] | None = None,
        newest: bool = False,
        before_event_id: int | None = None,
    ) -> list[Event]:
        """Return an execution's events in event_id order, sealed ones unsealed.

        Args:
            execution_id: whose log to read.
            after_event_id: only events with a greater event_id (resume a tail).
            limit: at most this many events (>= 0); None for all.
            types: only events of these types (None: all).
            steps: only events of these steps (None: all).
            newest: with `limit`, the newest `limit` events instead of the oldest
                (still returned in event_id order).
            before_event_id: only events with a smaller event_id (page back from the
                newest with `newest`).
        Returns:
            The events; empty for an unknown execution.
        Raises:
            StoreError: negative limit, or the store failed.
        """
        ...

    def event_times(
        self, execution_id: int, *, types: Collection[str], steps: Collection[str] | None = None
    ) -> list[tuple[str | None, str, str | None, float]]:
        """(step, type, status, time) of an execution's events of `types` (of `steps`), in
        event_id order: what a timeline counts, without reading payloads.

        Raises:
            StoreError: the store failed.
        """
        ...

    def event_span(self, execution_id: int) -> tuple[float, float] | None:
        """(first, last) event time of an execution; None when it has no events.

        Raises:
            StoreError: the store failed.
        """
        ...

    def count_events(self, execution_id: int) -> int:
        """Return how many events an execution has (0 for an unknown execution).

        Args:
            execution_id: whose log to count.
        Returns:
            The number of events.
        Raises:
            StoreError: the store failed.
        """
        ...

    # -- commands --------------------------------------------------------------------

    def pending_commands(self, execution_id: int) -> list[CommandRow]:
        """Return an execution's commands that are issued or claimed, by command_id.

        Args:
            execution_id: whose commands to read.
        Returns:
            The pending commands in command_id order.
        Raises:
            StoreError: the store failed.
        """
        ...

    def get_command(self, command_id: int) -> CommandRow:
        """Return one command.

        Args:
            command_id: the command to read.
        Returns:
            Its row.
        Raises:
            NotFoundError: no such command.
            StoreError: the store failed.
        """
        ...

    # -- catalog (cluster-wide) ------------------------------------------------------

    def register_playbook(
        self,
        path: str,
        text: str,
        *,
        source_file: str | None,
        created: float,
        version: int | None = None,
    ) -> int:
        """Add a playbook version to the catalog.

        With `version=None` the new version is the path's highest + 1, unless `text` is
        identical to the path's latest version: then that version is returned and nothing
        is added (re-registering an unchanged file is a no-op). With an explicit version,
        registering the same text again is a no-op and different text is an error.

        Args:
            path: catalog path (e.g. `examples/hello`).
            text: the playbook YAML.
            source_file: file it was read from, if any.
            created: Unix seconds.
            version: the version to register (>= 1), or None for the next one.
        Returns:
            The version that holds `text`.
        Raises:
            StoreError: the explicit version exists with other text, is below 1, or the
                store failed.
        """
        ...

    def get_playbook(self, path: str, version: int | None = None) -> CatalogRow:
        """Return one playbook version.

        Args:
            path: catalog path.
            version: the version; None for the latest.
        Returns:
            Its row.
        Raises:
            NotFoundError: no such path or version (the message names the path).
            StoreError: the store failed.
        """
        ...

    def list_playbooks(self) -> list[CatalogRow]:
        """Return the latest version of every path, ordered by path.

        Returns:
            One row per path; `versions` counts the path's versions.
        Raises:
            StoreError: the store failed.
        """
        ...

    def put_summary(self, execution_id: int, doc: dict[str, Any], *, format: int) -> None:
        """Keep what the UI shows of an ended execution at a glance (replacing any kept
        before): a document already masked, of shape `format`.

        Raises:
            StoreError: the store failed, or `doc` is not JSON.
        """
        ...

    def get_summary(self, execution_id: int) -> tuple[int, dict[str, Any]] | None:
        """(format, document) kept by `put_summary`, or None.

        Raises:
            StoreError: the store failed.
        """
        ...

    def catalog_entries(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """The latest version of every path starting with `prefix` (all when None or
        empty), without the playbook text: path, version, versions, source_file and
        created; ordered by path.

        Raises:
            StoreError: the store failed.
        """
        ...

    # -- credentials (cluster-wide; values arrive encrypted) -------------------------

    def put_credential(self, name: str, kind: str, ciphertext: bytes, *, updated: float) -> None:
        """Create or replace a credential (its `created` time survives a replace).

        Args:
            name: credential name.
            kind: credential type (postgres, http_bearer, ...).
            ciphertext: the encrypted body; the store never sees plaintext.
            updated: Unix seconds.
        Raises:
            StoreError: the store failed.
        """
        ...

    def get_credential(self, name: str) -> tuple[str, bytes]:
        """Return a credential's kind and ciphertext.

        Args:
            name: credential name.
        Returns:
            (kind, ciphertext).
        Raises:
            NotFoundError: no such credential.
            StoreError: the store failed.
        """
        ...

    def list_credentials(self) -> list[dict[str, Any]]:
        """Return every credential's name, kind, created and updated, ordered by name.

        Returns:
            Dicts with keys name, kind, created, updated (never the ciphertext).
        Raises:
            StoreError: the store failed.
        """
        ...

    def delete_credential(self, name: str) -> None:
        """Delete a credential.

        Args:
            name: credential name.
        Raises:
            NotFoundError: no such credential.
            StoreError: the store failed.
        """
        ...

    def reseal(self, reseal: Callable[[bytes], bytes]) -> int:
        """Replace every value sealed with the master key — credentials, the keychain
        where there is one, and the sealed JSON of events and executions — by
        `reseal(old token)` (a master key rotation), in one transaction per database.

        Returns:
            How many values were resealed.
        Raises:
            StoreError: the store failed (nothing changed).
            Exception: whatever `reseal` raises (nothing changed).
        """
        ...

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Release the store's resources. Idempotent; any other call afterwards fails.

        Raises:
            StoreError: the store failed while closing.
        """
        ...
