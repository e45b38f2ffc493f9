"""How many iterations of a loop one command carries (a chunk), decided when the loop
issues its next command.

A chunk's iterations run one after another in one worker slot and count as one against
the loop's `max_in_flight`, so a chunk must never hold work that would have run in
parallel: it is at most the loop's remaining iterations shared out over its slots. Within
that, it holds about `TARGET_MS` of tool time, judged from the loop's iterations so far
(`LoopRecord.busy_ms / calls`): one iteration while none has reported, one at a time while
they are slow (an iteration of a second is a chunk of one), hundreds when they take a
fraction of a millisecond. A playbook fixes the size with `loop.spec.batch` (1: one
command per iteration).

Only a runtime whose states say `batching` runs chunks (the distributed server's, and
the embedded runtime's unless it is built with `batching=False`); the decision is recorded in the `command.issued` event (`loop_count`), so a replay never
decides it again.
"""

from __future__ import annotations

import math

from flowtide.engine.state import ExecutionState, LoopRecord
from flowtide.playbook.model import Step

__all__ = ["MAX_CHUNK", "TARGET_MS", "chunk_size"]

#: About this much tool time (ms) per chunk: long enough that a command's fixed costs
#: (claim, report, a transaction) are shared by many fast iterations, short enough that
#: its worker reports the iterations well inside a lease.
TARGET_MS = 200.0
#: Never more iterations than this in one command (its claim reply holds their elements).
MAX_CHUNK = 1_000
#: Iterations reported faster than this (ms) count as this fast.
_FLOOR_MS = 0.01


def chunk_size(state: ExecutionState, step: Step, loop: LoopRecord, next_index: int) -> int:
    """The iterations the loop's next command carries, from `next_index` on (>= 1)."""
    remaining = loop.size - next_index
    if not state.batching or remaining <= 1 or loop.cursor or step.loop is None:
        return 1
    fixed = step.loop.batch
    if fixed is not None:
        return max(1, min(fixed, remaining, MAX_CHUNK))
    if loop.calls == 0:
        return 1  # nothing known yet: the first iterations go one by one
    per_call = max(loop.busy_ms / loop.calls, _FLOOR_MS)
    fits = int(TARGET_MS / per_call)
    share = math.ceil(remaining / max(loop.max_in_flight, 1))
    return max(1, min(fits, share, MAX_CHUNK))
