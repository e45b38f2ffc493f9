"""Group commit of worker reports: reports of one execution that queue up behind its
step are taken by whichever of them gets the execution's lock first, in one transaction
(`flowtide.server.steps.Stepper`, which runs it); each is judged as if it came alone
after the ones before it, and one bad report does not fail the others."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flowtide import trace
from flowtide.engine import events as ev
from flowtide.engine.events import Event

if TYPE_CHECKING:
    from flowtide.server.statecache import StateCache
    from flowtide.server.steps import After, SubmitResult, Taker

__all__ = ["GroupCommit"]


@dataclass
class _Report:
    """One `submit_many` report waiting for the step that takes it."""

    events: list[Event]
    result: asyncio.Future[SubmitResult]
    #: The reporting worker, when it takes a next command in the slot it frees.
    taker: Taker | None = None


class GroupCommit:
    """The queue of worker reports in front of a `Stepper`'s transaction."""

    cache: StateCache

    def __init__(self) -> None:
        #: Reports waiting for their execution's lock, taken together by the first of
        #: them to get it.
        self._queued: dict[int, list[_Report]] = {}

    async def _step_locked(
        self,
        execution_id: int,
        parts: list[list[Event]],
        *,
        check_workers: bool = False,
        takers: list[Taker | None] | None = None,
    ) -> tuple[list[SubmitResult], After]:
        raise NotImplementedError  # the step transaction (Stepper)

    async def after(self, after: After) -> None:
        raise NotImplementedError  # what follows a commit (Stepper)

    async def submit_many(
        self,
        execution_id: int,
        reports: Sequence[Sequence[Event]],
        takers: Sequence[Taker | None] | None = None,
    ) -> list[SubmitResult | Exception]:
        """Worker reports of one execution, each judged as if it came alone after the ones
        before it; in the place of each, its result or the error it got.

        Group commit: reports that queue up behind a step of their execution are taken by
        whichever of them gets the lock first, in one transaction.
        """
        loop = asyncio.get_running_loop()
        takers = takers or [None] * len(reports)
        mine = [
            _Report(list(events), loop.create_future(), taker)
            for events, taker in zip(reports, takers, strict=True)
        ]
        self._queued.setdefault(execution_id, []).extend(mine)
        afters: list[After] = []
        async with self.cache.lock(execution_id):
            if not all(r.result.done() for r in mine):
                group = self._queued.pop(execution_id, [])
                # Cannot happen: a leader settles all it takes.
                group += [r for r in mine if not r.result.done() and r not in group]
                afters = await self._take_reports(execution_id, group)
        for after in afters:
            await self.after(after)
        out: list[SubmitResult | Exception] = []
        for r in mine:
            exc = r.result.exception()
            out.append(exc if isinstance(exc, Exception) else r.result.result())
        return out

    async def _take_reports(self, execution_id: int, group: list[_Report]) -> list[After]:
        """Advance `group` in one step and settle each report (the caller holds the lock
        and runs `after` on what this returns once it let go).

        When the step fails and there was more than one report, each is tried alone, so
        one bad report does not fail the others."""
        afters: list[After] = []
        if trace.enabled:
            trace.marks(_reported(group), "locked")
        try:
            try:
                results, after = await self._step_locked(
                    execution_id,
                    [r.events for r in group],
                    check_workers=True,
                    takers=[r.taker for r in group],
                )
                if trace.enabled:
                    trace.marks(_reported(group), "took")
            except Exception as exc:
                if len(group) == 1:
                    group[0].result.set_exception(exc)
                    return afters
                for r in group:
                    try:
                        results, after = await self._step_locked(
                            execution_id, [r.events], check_workers=True, takers=[r.taker]
                        )
                    except Exception as one:
                        r.result.set_exception(one)
                    else:
                        r.result.set_result(results[0])
                        afters.append(after)
                return afters
            for r, result in zip(group, results, strict=True):
                r.result.set_result(result)
            afters.append(after)
            return afters
        finally:
            # Cancelled midway: what is not settled goes back for its own caller to take.
            unsettled = [r for r in group if not r.result.done()]
            if unsettled:
                self._queued[execution_id] = unsettled + self._queued.get(execution_id, [])


def _reported(group: list[_Report]) -> list[int]:
    """The commands whose outcome the reports of `group` carry (for the trace)."""
    return [
        e.command_id
        for r in group
        for e in r.events
        if e.command_id is not None and e.type in (ev.COMMAND_COMPLETED, ev.COMMAND_FAILED)
    ]
