"""A playbook's `timeout:` and `sla:` as the events that record them passing
(`execution.deadline_missed`; the engine fails a run past its timeout), and the timers an
embedded runtime arms for them. A server finds them with one indexed scan instead
(`server.deadlines`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from flowtide.engine import events as ev
from flowtide.engine.events import DeadlineMissedPayload, Event
from flowtide.engine.state import ExecutionState
from flowtide.playbook.model import Playbook

__all__ = ["arm_deadlines", "deadline_event"]


def deadline_event(
    execution_id: int, kind: str, deadline: float, limit: float, *, event_id: int, now: float
) -> Event:
    """The event that records the `kind` deadline (timeout or sla) passing at `now`."""
    missed: DeadlineMissedPayload = {
        "kind": kind,
        "deadline": deadline,
        "limit": limit,
        "elapsed": now - (deadline - limit),
    }
    return Event(
        event_id=event_id,
        execution_id=execution_id,
        type=ev.EXECUTION_DEADLINE_MISSED,
        status="failed" if kind == "timeout" else "running",
        payload=missed,
        time=now,
    )


def arm_deadlines(
    execution_id: int,
    playbook: Playbook,
    created: float,
    state_of: Callable[[int], ExecutionState | None],
    new_id: Callable[[], int],
    post: Callable[[list[Event]], Coroutine[Any, Any, None]],
) -> list[asyncio.TimerHandle]:
    """Timers that `post` the event of the playbook's `timeout:` and `sla:` when they pass
    (at once for one already past: a resumed run), unless the run has ended or recorded
    it before (`state_of`). In the running loop."""
    loop = asyncio.get_running_loop()

    def passed(kind: str, deadline: float, limit: float) -> None:
        state = state_of(execution_id)
        if state is None or state.terminal or kind in state.deadlines_missed:
            return
        event = deadline_event(
            execution_id, kind, deadline, limit, event_id=new_id(), now=time.time()
        )
        loop.create_task(post([event]))

    timers = []
    for kind, limit in (("timeout", playbook.timeout), ("sla", playbook.sla)):
        if limit:
            deadline = created + limit
            delay = max(0.0, deadline - time.time())
            timers.append(loop.call_later(delay, passed, kind, deadline, limit))
    return timers
