"""Executions' states folded from a store for the UI of `flowtide ui`, cached and caught
up as their logs grow, so a page that polls a running 100,000-iteration loop reads the
new events only."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from flowtide.engine.state import FOLDED_TYPES, ExecutionState
from flowtide.playbook.loader import parse_playbook
from flowtide.store.base import ENDED_STATUSES, ExecutionRow, Store

__all__ = ["OVERLAP_MS", "FoldCache"]

#: How far back (ms of snowflake time) a catch-up reads again: an event a worker thread
#: made just before another one may be written just after it.
OVERLAP_MS: Final = 500
_ID_MS_SHIFT: Final = 22


def overlap_floor(event_id: int) -> int:
    """The lowest event id a read after `event_id` must look at again (`OVERLAP_MS`)."""
    return max(0, event_id - (OVERLAP_MS << _ID_MS_SHIFT))


@dataclass
class _Folded:
    playbook_text: str
    state: ExecutionState
    last_id: int = 0
    #: Ids applied within the overlap window (read again, not applied again).
    recent: set[int] = field(default_factory=set)
    exact: bool = False


class FoldCache:
    """Executions' states folded from the local store, caught up incrementally (thread-
    safe; its calls block on SQLite: run them in a thread).

    Only the events that change the fold are read (`FOLDED_TYPES`: a loop's
    `command.started`, `call.done` and `loop.item` are three of its five events per
    iteration). While an execution runs, each read applies the events after the last one
    seen, with
    an overlap of `OVERLAP_MS` of ids read again (and skipped when applied already):
    the embedded runtime writes a worker's events after it made their ids, so one can
    land behind a newer one. Once the execution has ended, its state is folded once
    more from the whole log in order, so what a finished run shows is exact."""

    def __init__(self, store: Store, size: int = 32) -> None:
        self.store = store
        self.size = size
        self._lock = threading.Lock()
        self._folded: OrderedDict[int, _Folded] = OrderedDict()

    def state(self, execution_id: int) -> tuple[ExecutionRow, ExecutionState]:
        row = self.store.get_execution(execution_id)
        with self._lock:
            entry = self._folded.get(execution_id)
            if entry is None or entry.playbook_text != row.playbook_text:
                entry = _Folded(
                    row.playbook_text,
                    ExecutionState(
                        parse_playbook(row.playbook_text, row.playbook_file), execution_id
                    ),
                )
            if not entry.exact:
                if row.status in ENDED_STATUSES:
                    entry = self._refold(entry, execution_id)
                else:
                    self._catch_up(entry, execution_id)
            self._folded[execution_id] = entry
            self._folded.move_to_end(execution_id)
            while len(self._folded) > self.size:
                self._folded.popitem(last=False)
            return row, entry.state

    def prewarm(self, count: int) -> None:
        """Fold the `count` newest executions, but not an ended one whose summary was
        kept (its page opens from that; a fold would only compete with it for the CPU).
        A store error is left to the requests."""
        try:
            for row in self.store.list_executions(limit=count):
                if row.status in ENDED_STATUSES and self.store.get_summary(row.execution_id):
                    continue
                self.state(row.execution_id)
        except Exception:  # noqa: BLE001 - the same error reaches the page that asks
            return

    def _catch_up(self, entry: _Folded, execution_id: int) -> None:
        horizon = overlap_floor(entry.last_id) if entry.last_id else None
        events = self.store.events(execution_id, after_event_id=horizon, types=FOLDED_TYPES)
        for event in events:
            if event.event_id in entry.recent:
                continue
            entry.state.apply(event)
            entry.recent.add(event.event_id)
            entry.last_id = max(entry.last_id, event.event_id)
        floor = overlap_floor(entry.last_id)
        entry.recent = {i for i in entry.recent if i > floor}

    def _refold(self, entry: _Folded, execution_id: int) -> _Folded:
        state = ExecutionState(entry.state.playbook, execution_id)
        events = self.store.events(execution_id, types=FOLDED_TYPES)
        for event in events:
            state.apply(event)
        last = events[-1].event_id if events else 0
        return _Folded(entry.playbook_text, state, last, exact=True)
