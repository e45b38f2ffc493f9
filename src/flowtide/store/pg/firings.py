"""Trigger firings that start runs, recorded for a whole batch in a few statements (a
burst of schedules firing at one instant: `Coordinator.execute_many`).

Same rules as the store's `record_firing`, one statement each for all of the batch: a
buffered, skipped or failed row of the key is taken over, a new key is inserted, and a
key that started a run before (or earlier in the same batch) is refused with
`AlreadyFired`. Firings with `members` (a subscription's batch) or not `started` are not
for this path (`record_firing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

from flowtide.errors import AlreadyFired

if TYPE_CHECKING:
    import psycopg

    from flowtide.store.triggers import Firing

__all__ = ["Started", "record_started"]

_TAKE_OVER: Final = """
UPDATE trigger_firing f
   SET status = 'started', execution_id = v.execution_id, time = v.time, reason = NULL
  FROM unnest(%s::bigint[], %s::text[], %s::bigint[], %s::float8[])
       AS v(trigger_id, key, execution_id, time)
 WHERE f.trigger_id = v.trigger_id AND f.key = v.key
   AND f.status IN ('buffered', 'skipped', 'failed')
RETURNING f.trigger_id, f.key
"""

_INSERT: Final = """
INSERT INTO trigger_firing (trigger_id, key, slot, status, execution_id, time, reason)
SELECT v.trigger_id, v.key, v.slot, 'started', v.execution_id, v.time, NULL
  FROM unnest(%s::bigint[], %s::text[], %s::float8[], %s::bigint[], %s::float8[])
       AS v(trigger_id, key, slot, execution_id, time)
ON CONFLICT (trigger_id, key) DO NOTHING
RETURNING trigger_id, key
"""

_FIRED_BEFORE: Final = """
SELECT f.trigger_id, f.key, f.execution_id
  FROM trigger_firing f
  JOIN unnest(%s::bigint[], %s::text[]) AS v(trigger_id, key)
    ON f.trigger_id = v.trigger_id AND f.key = v.key
"""

_MOVE_WATERMARKS: Final = """
INSERT INTO trigger_state (trigger_id, watermark, updated)
SELECT v.trigger_id, v.watermark, %s
  FROM unnest(%s::bigint[], %s::float8[]) AS v(trigger_id, watermark)
ON CONFLICT (trigger_id) DO UPDATE SET
  watermark = GREATEST(trigger_state.watermark, excluded.watermark),
  updated = excluded.updated
"""


class Started(NamedTuple):
    """A firing that starts `execution_id`, created at `time`."""

    firing: Firing
    execution_id: int
    time: float


def record_started(conn: psycopg.Connection, batch: Sequence[Started]) -> list[AlreadyFired | None]:
    """Record the batch's firings in the caller's transaction; in the place of each,
    None (recorded: its run may be created) or AlreadyFired (its key started a run
    before, or earlier in this batch: its run must not be created)."""
    outcome: list[AlreadyFired | None] = [None] * len(batch)
    first: dict[tuple[int, str], int] = {}
    todo: list[int] = []  # the first occurrence of each key, in order
    for index, item in enumerate(batch):
        key = (item.firing.trigger_id, item.firing.key)
        if key in first:
            earlier = batch[first[key]]
            outcome[index] = AlreadyFired(key[0], key[1], earlier.execution_id)
        else:
            first[key] = index
            todo.append(index)
    if not todo:
        return outcome
    items = [batch[i] for i in todo]
    ids = [i.firing.trigger_id for i in items]
    keys = [i.firing.key for i in items]
    runs = [i.execution_id for i in items]
    times = [i.time for i in items]
    taken = {
        (int(t), str(k)) for t, k in conn.execute(_TAKE_OVER, (ids, keys, runs, times)).fetchall()
    }
    rest = [i for i in todo if (batch[i].firing.trigger_id, batch[i].firing.key) not in taken]
    inserted: set[tuple[int, str]] = set()
    if rest:
        fresh = [batch[i] for i in rest]
        rows = conn.execute(
            _INSERT,
            (
                [i.firing.trigger_id for i in fresh],
                [i.firing.key for i in fresh],
                [i.firing.slot for i in fresh],
                [i.execution_id for i in fresh],
                [i.time for i in fresh],
            ),
        ).fetchall()
        inserted = {(int(t), str(k)) for t, k in rows}
    refused = [i for i in rest if (batch[i].firing.trigger_id, batch[i].firing.key) not in inserted]
    if refused:
        found = {
            (int(t), str(k)): None if e is None else int(e)
            for t, k, e in conn.execute(
                _FIRED_BEFORE,
                (
                    [batch[i].firing.trigger_id for i in refused],
                    [batch[i].firing.key for i in refused],
                ),
            ).fetchall()
        }
        for i in refused:
            key = (batch[i].firing.trigger_id, batch[i].firing.key)
            outcome[i] = AlreadyFired(key[0], key[1], found.get(key))
    # A duplicate in the batch names the run its first occurrence started, if it did.
    firsts = set(todo)
    for index, item in enumerate(batch):
        failed = outcome[index]
        if failed is not None and index not in firsts:
            refusal = outcome[first[(item.firing.trigger_id, item.firing.key)]]
            if refusal is not None:
                outcome[index] = refusal
    marks: dict[int, float] = {}
    for index, item in enumerate(batch):
        mark = item.firing.watermark
        if outcome[index] is None and mark is not None:
            marks[item.firing.trigger_id] = max(mark, marks.get(item.firing.trigger_id, mark))
    if marks:
        conn.execute(_MOVE_WATERMARKS, (max(times), list(marks), list(marks.values())))
    return outcome
