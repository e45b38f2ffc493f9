"""One engine step over a batch of events, shared by the embedded runtime and the server.

`Advancer.advance` applies a batch of incoming events (worker reports, cancellations, a
first `playbook.initialized`) to the execution states they belong to, asks the engine what
follows, and returns everything that must be written in one transaction: the events, the
command rows and the execution row changes, plus the commands to hand to workers once the
transaction committed. Worker reports of loop iterations and loop completion claims are
filtered through the loop state in the KV (per-iteration `create`), so a duplicate
delivery never counts twice, whichever process receives it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from flowtide.engine import events as ev
from flowtide.engine.decide import decide
from flowtide.engine.events import Command, Event, payload_of
from flowtide.engine.state import ExecutionState, secret_values
from flowtide.loopstate import LoopState
from flowtide.redaction import remember
from flowtide.store.base import CommandUpdate, ExecutionUpdate

__all__ = ["Advance", "Advancer"]

_FILTERED = frozenset({ev.COMMAND_COMPLETED, ev.COMMAND_FAILED, ev.LOOP_DONE, ev.LOOP_STARTED})
_REPORTS = (ev.COMMAND_COMPLETED, ev.COMMAND_FAILED)


@dataclass
class Advance:
    """What one batch produced; write `recorded`/`command_rows`/`execution_rows` together."""

    recorded: list[Event] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    command_rows: list[CommandUpdate] = field(default_factory=list)
    execution_rows: list[ExecutionUpdate] = field(default_factory=list)
    #: Executions that became terminal in this batch.
    finished: list[int] = field(default_factory=list)
    #: Worker reports dropped as late or duplicate (their command was already closed).
    dropped: int = 0


class Advancer:
    """Applies batches to execution states (held by the caller) and decides what follows."""

    def __init__(
        self, loopstate: LoopState | None, next_id: Callable[[], int], *, local_kv: bool
    ) -> None:
        self.loopstate = loopstate
        self.next_id = next_id
        # An in-process KV answers without a round trip: recording one iteration at a
        # time is cheaper than gathering (a task per write).
        self.local_kv = local_kv

    async def advance(
        self,
        states: Mapping[int, ExecutionState],
        batch: list[Event],
        now: float,
        *,
        recorded: dict[int, bool] | None = None,
    ) -> Advance:
        """Apply `batch` in order (depth first: what an event causes is applied before the
        next input event). Events of executions missing from `states` are ignored.

        `recorded`: verdicts of `record_iterations` taken beforehand for this batch and
        others (the caller advances several batches in one transaction); without it the
        batch's iteration results are recorded here."""
        out = Advance()
        prerecorded = (
            recorded if recorded is not None else await self.record_iterations(states, batch)
        )
        pending = deque(batch)
        while pending:
            event = pending.popleft()
            state = states.get(event.execution_id)
            if state is None:
                continue
            if event.type == ev.SECRETS_ADDED:
                added = secret_values(event) - state.secrets
                if not added:
                    continue  # nothing new (every command that uses a credential says so)
                remember(added)
                state.apply(event)
                out.recorded.append(event)
                continue
            if event.type in _FILTERED and not await self._accept(state, event, prerecorded):
                if event.type in _REPORTS:
                    out.dropped += 1
                continue
            record = state.commands.get(event.command_id or -1) if event.type in _REPORTS else None
            was_terminal = state.terminal
            state.apply(event)
            if record is not None and record.command_id not in state.commands:
                # The report closed its command (a chunk's: its last iteration, or one
                # that broke or failed the loop).
                out.command_rows.append(
                    CommandUpdate(
                        command_id=record.command_id,
                        execution_id=state.execution_id,
                        step=record.step,
                        status="completed" if event.type == ev.COMMAND_COMPLETED else "failed",
                        time=now,
                        worker_id=event.worker_id,
                    )
                )
            out.recorded.append(event)
            new_events, new_commands = decide(state, event, now, self.next_id)
            pending.extendleft(reversed(new_events))
            for command in new_commands:
                out.commands.append(command)
                out.command_rows.append(
                    CommandUpdate.from_command(command, status="issued", time=now)
                )
            if event.type == ev.PLAYBOOK_INITIALIZED:
                out.execution_rows.append(ExecutionUpdate(state.execution_id, "running", now))
            if state.terminal and not was_terminal:
                out.execution_rows.append(
                    ExecutionUpdate(
                        state.execution_id,
                        state.status,
                        now,
                        result=state.result(),
                        error=state.error,
                    )
                )
                out.finished.append(state.execution_id)
        return out

    async def record_iterations(
        self, states: Mapping[int, ExecutionState], batch: list[Event]
    ) -> dict[int, bool]:
        """Record every loop iteration result of `batch` in the KV at once.

        Each record is a round trip to a remote KV; one after another they would bound a
        loop's rate by its latency. The writes are independent `create`s, so they go out
        together and the verdicts (event_id -> counted) are read afterwards. Late or
        duplicate reports are left to `_accept`.
        """
        if self.loopstate is None or self.local_kv:
            return {}
        # Per loop: (event id, (index, status, command id)) of each iteration reported.
        loops: dict[tuple[int, str, int], list[tuple[int, tuple[int, str, int | None]]]] = {}
        claimed: set[tuple[int, int]] = set()
        for event in batch:
            if event.type not in _REPORTS:
                continue
            state = states.get(event.execution_id)
            if state is None or event.command_id is None:
                continue
            record = state.commands.get(event.command_id)
            payload = payload_of(event, ev.COMMAND_COMPLETED)
            index = record.iteration(payload) if record is not None else None
            if record is None or index is None or (event.command_id, index) in claimed:
                continue  # _accept drops it (or records it, for a second report)
            claimed.add((event.command_id, index))
            key = (event.execution_id, record.step, record.loop_instance or 0)
            status = payload.get("status", "ok")
            loops.setdefault(key, []).append((event.event_id, (index, status, event.command_id)))
        if not loops:
            return {}
        groups = list(loops.items())
        verdicts = await asyncio.gather(
            *(
                self.loopstate.record_many(eid, step, instance, [r for _, r in items])
                for (eid, step, instance), items in groups
            )
        )
        out: dict[int, bool] = {}
        for (_, items), got in zip(groups, verdicts, strict=True):
            for (event_id, _), counted in zip(items, got, strict=True):
                out[event_id] = bool(counted)
        return out

    async def _accept(self, state: ExecutionState, event: Event, recorded: dict[int, bool]) -> bool:
        """Filter worker reports and completion claims through the loop state in the KV."""
        if event.type in _REPORTS:
            record = state.commands.get(event.command_id or -1)
            if record is None:
                return False  # late or duplicate report
            if event.event_id in recorded:
                return recorded[event.event_id]
            reported = payload_of(event, ev.COMMAND_COMPLETED)
            index = record.iteration(reported)
            if record.pending is not None and index is None:
                return False  # not an iteration of the chunk still to report
            if index is not None and self.loopstate is not None:
                return await self.loopstate.record(
                    state.execution_id,
                    record.step,
                    record.loop_instance or 0,
                    index,
                    reported.get("status", "ok"),
                    event.command_id,
                )
        elif event.type == ev.LOOP_DONE and self.loopstate is not None:
            instance = payload_of(event, ev.LOOP_DONE).get("instance", 0)
            claimed = await self.loopstate.claim_done(
                state.execution_id, event.step or "", instance
            )
            if claimed:
                await self.loopstate.drop_loop(state.execution_id, event.step or "", instance)
            return claimed
        elif event.type == ev.LOOP_STARTED and self.loopstate is not None:
            payload = payload_of(event, ev.LOOP_STARTED)
            await self.loopstate.start(
                state.execution_id,
                event.step or "",
                payload["instance"],
                {
                    "size": payload["size"],
                    "iterator": payload["iterator"],
                    "mode": payload["mode"],
                    "max_in_flight": payload["max_in_flight"],
                },
            )
        return True
