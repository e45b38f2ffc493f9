"""The trigger part of the store port (`flowtide.triggers`): a trigger's definition, its
firings, and the firing an execution is created with. Adapters: `flowtide.store.sql.triggers`
(SQLite and PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

#: The kinds of triggers, each with the name its firing's key has in an execution's
#: `trigger` (a schedule's slot, a webhook's delivery id, a subscription's message).
TRIGGER_KEYS: Final = {"schedule": "slot", "hook": "delivery", "subscription": "message"}
#: What became of one firing: a run `started`, or the slot was `skipped` (a run of the
#: schedule still going, or outside the catchup window) or `buffered` (started when the
#: running one ends); a subscription's message was `batched` (one of a batch's messages:
#: the batch's run is its execution) or `failed` to start a run (`reason`; a redelivery
#: that starts one takes the record over).
FIRING_STATUSES: Final = frozenset({"started", "skipped", "buffered", "batched", "failed"})


@dataclass(frozen=True, slots=True)
class Firing:
    """One firing of a trigger, recorded with the execution it starts (or without one).

    `key` identifies it within the trigger (a slot's ISO time, a delivery id, a message's
    stream sequence): the store refuses a second firing of a key (`AlreadyFired`), so a
    slot, a delivery or a message starts exactly one run. `watermark`, for a schedule,
    moves its planning state forward in the same transaction.
    """

    trigger_id: int
    kind: str
    name: str
    key: str
    slot: float | None = None
    status: str = "started"
    reason: str | None = None
    watermark: float | None = None
    #: A subscription's batch: the key of each of its messages, recorded (status
    #: `batched`) with the batch's execution in the same transaction; one that fired
    #: before (alone or in another batch) refuses the whole batch (`AlreadyFired` naming
    #: it), so a message never starts two runs however batches are cut.
    members: tuple[str, ...] = ()

    def trigger_doc(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, TRIGGER_KEYS[self.kind]: self.key}


@dataclass(frozen=True, slots=True)
class FiringRow:
    """A recorded firing: its key, slot (schedules), status, the execution it started."""

    trigger_id: int
    key: str
    slot: float | None
    status: str
    execution_id: int | None
    time: float
    reason: str | None
    #: The status of the run it started (None: it started none).
    execution_status: str | None = None


@dataclass(slots=True)
class TriggerState:
    """A schedule's planning state: its watermark (None: never planned), its runs still
    going (oldest first), its buffered slots (key, slot; oldest first)."""

    watermark: float | None
    running: list[int]
    buffered: list[tuple[str, float]]


@dataclass(frozen=True, slots=True)
class TriggerRow:
    """One stored trigger: its kind and name, its id (the shard that fires it is
    `shard_for(trigger_id, n)`), its spec as stored (JSON), whether a secret is kept
    (never returned here: `Store.trigger_secret`), and its paused state."""

    kind: str
    name: str
    trigger_id: int
    spec: dict[str, Any]
    has_secret: bool
    paused: bool
    resumed: float | None
    created: float
    updated: float


class TriggerStore(Protocol):
    """Triggers: definitions (cluster part), firings and planning state (shard part)."""

    def put_trigger(
        self,
        kind: str,
        name: str,
        spec: dict[str, Any],
        *,
        trigger_id: int,
        now: float,
        paused: bool = False,
        secret: bytes | None = None,
    ) -> TriggerRow:
        """Store a trigger or replace the spec of the one of that kind and name (which
        keeps its id and creation time; `secret` None keeps the stored one)."""
        ...

    def get_trigger(self, kind: str, name: str) -> TriggerRow:
        """One trigger. Raises NotFoundError."""
        ...

    def list_triggers(self, kind: str | None = None) -> list[TriggerRow]:
        """Every trigger (of `kind`), by kind and name."""
        ...

    def set_trigger_paused(self, kind: str, name: str, paused: bool, *, now: float) -> TriggerRow:
        """Pause or resume; resuming sets `resumed` (slots before it never fire)."""
        ...

    def delete_trigger(self, kind: str, name: str) -> None:
        """Delete a trigger. Raises NotFoundError."""
        ...

    def trigger_secret(self, kind: str, name: str) -> bytes | None:
        """The sealed secret kept with a trigger; never shown."""
        ...

    def record_firings(self, firings: Sequence[Firing], *, now: float) -> int:
        """Record firings that start nothing (skipped, buffered), each at most once."""
        ...

    def move_watermark(self, trigger_id: int, watermark: float, *, now: float) -> None:
        """Move a schedule's planning state forward (never back)."""
        ...

    def trigger_watermark(self, trigger_id: int) -> float | None:
        """The latest slot a schedule's planner decided (None: never planned)."""
        ...

    def firings(
        self, trigger_id: int, *, limit: int = 50, status: str | None = None
    ) -> list[FiringRow]:
        """A trigger's latest firings, newest first."""
        ...

    def firing(self, trigger_id: int, key: str) -> FiringRow | None:
        """One firing by its key."""
        ...

    def trigger_running(self, trigger_id: int) -> list[int]:
        """The executions a trigger started that have not ended, oldest first."""
        ...

    def trigger_buffered(self, trigger_id: int) -> list[tuple[str, float]]:
        """A schedule's buffered slots (key, slot), oldest first."""
        ...

    def trigger_states(
        self, trigger_ids: Sequence[int], *, running: bool = True
    ) -> dict[int, TriggerState]:
        """The planning state of many triggers in one read (runs only when `running`)."""
        ...
