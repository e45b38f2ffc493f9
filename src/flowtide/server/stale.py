"""When a worker's report is stale: the rules, as pure functions over the command rows.

A worker reports on a command it claimed. By the time the report arrives its lease may
have expired and the command been issued again (to it or to another worker), or the
command may be closed (the execution ended, was cancelled or finalized). Such a report
is stale: none of its command's events are written, so a lost worker's late result never
overwrites the result of the command's later attempt.

A report of several parts (a worker's batch, group commit) is judged part by part, each
against the rows as the parts before it left them (`settle`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Final

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.store.base import CommandUpdate
from flowtide.store.pg.commands import Holder

__all__ = [
    "REPORTS",
    "WORKER_EVENTS",
    "Holder",
    "disjoint_events",
    "drop_stale",
    "reported_commands",
    "settle",
    "stale_commands",
]

#: The events a worker reports (each of one command); nothing else is taken from one.
WORKER_EVENTS: Final = frozenset(
    {
        ev.SECRETS_ADDED,
        ev.COMMAND_STARTED,
        ev.COMMAND_HEARTBEAT,
        ev.COMMAND_PROGRESS,
        ev.CALL_DONE,
        ev.CALL_ERROR,
        ev.COMMAND_COMPLETED,
        ev.COMMAND_FAILED,
    }
)
#: The events that end a command: one stale report each.
REPORTS: Final = (ev.COMMAND_COMPLETED, ev.COMMAND_FAILED)
#: Events whose payload `attempt` is the command's (call.done/call.error carry the tool
#: call's retry attempt instead).
_ATTEMPT_EVENTS: Final = frozenset(
    {ev.COMMAND_STARTED, ev.COMMAND_PROGRESS, ev.COMMAND_COMPLETED, ev.COMMAND_FAILED}
)
_NOBODY: Final = Holder(None, None, None)


def reported_commands(parts: Iterable[Iterable[Event]]) -> list[int]:
    """The commands the worker events of `parts` name, sorted (the rows to lock)."""
    return sorted(
        {
            e.command_id
            for part in parts
            for e in part
            if e.type in WORKER_EVENTS and e.command_id is not None
        }
    )


def stale_commands(current: Mapping[int, Holder], events: Iterable[Event]) -> set[int]:
    """The commands whose report in `events` is stale: the command is not claimed, or is
    claimed by another worker than the one reporting, or the report is of another
    attempt than the row's, or names another execution or step than the row's (a worker
    holding a command of one execution must not write events into another's, nor end
    another step of its own). `current`: the rows of the commands named (a command
    without a row is stale)."""
    stale: set[int] = set()
    for e in events:
        if e.type not in WORKER_EVENTS or e.command_id is None or e.command_id in stale:
            continue
        status, holder, attempt, execution_id, step = current.get(e.command_id, _NOBODY)
        # command.started and command.completed/failed: `attempt` is the CommandRef's
        reported = (
            ev.payload_of(e, ev.COMMAND_STARTED).get("attempt")
            if e.type in _ATTEMPT_EVENTS
            else None
        )
        if (
            status != "claimed"
            or (holder is not None and e.worker_id != holder)
            or (reported is not None and attempt is not None and reported != attempt)
            or (execution_id is not None and e.execution_id != execution_id)
            or (step is not None and e.step != step)
        ):
            stale.add(e.command_id)
    return stale


def drop_stale(current: Mapping[int, Holder], events: list[Event]) -> tuple[list[Event], int]:
    """`events` without the worker events of stale commands (see `stale_commands`), and
    how many reports (command.completed / command.failed) that dropped."""
    stale = stale_commands(current, events)
    if not stale:
        return events, 0
    count = sum(1 for e in events if e.command_id in stale and e.type in REPORTS)
    kept = [e for e in events if e.command_id not in stale or e.type not in WORKER_EVENTS]
    return kept, count


def settle(
    current: MutableMapping[int, Holder], rows: Iterable[CommandUpdate], terminal: bool
) -> None:
    """Bring `current` to what a part just wrote: the new status of each command row it
    changed, and (`terminal`: the execution ended) every open command closed with it."""
    for row in rows:
        held = current.get(row.command_id)
        if held is not None:
            current[row.command_id] = held._replace(status=row.status)
    if terminal:
        for command_id, held in list(current.items()):
            if held.status in ("issued", "claimed"):
                current[command_id] = held._replace(status="cancelled")


def disjoint_events(parts: Sequence[Iterable[Event]], seen: set[int]) -> list[Event] | None:
    """The new events (not in `seen`) of every part that names a command, when no two
    parts name the same command; None when two do. Then what one part does to the
    command rows cannot make another's report stale, except by ending the execution."""
    owner: dict[int, int] = {}
    out: list[Event] = []
    for i, part in enumerate(parts):
        for e in part:
            if e.command_id is None or e.event_id in seen:
                continue
            if owner.setdefault(e.command_id, i) != i:
                return None
            out.append(e)
    return out
