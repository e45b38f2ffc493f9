"""The log stream on the server's side (`flowtide.worker._logs` publishes to it): created
with the command stream, read for `GET /api/executions/{id}/logs` as the rings of an
execution's running commands.

Each command's subject keeps its newest `PER_COMMAND` messages (at most 32 KiB each)
for `MAX_AGE` seconds; the stream as a whole at most `MAX_BYTES`, oldest dropped first.
A read takes every message of the execution (an ordered consumer over its subjects) and
joins each command's contiguous run from the newest back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Set
from dataclasses import replace
from typing import Any, Final

from flowtide.logfiles import LiveLog
from flowtide.server.jetstream import StreamLayout, ensure_stream
from flowtide.wire import LOG_PREFIX, LOG_STREAM, log_filter

__all__ = ["ensure_log_stream", "own_rings", "read_rings"]

PER_COMMAND: Final = 64
MAX_AGE: Final = 3600.0
MAX_BYTES: Final = 256 * 1024 * 1024
MAX_MSG: Final = 40 * 1024
#: Messages one read takes at most, and bytes of them it keeps at most (a follower reads
#: every 0.2 s: an execution with thousands of running commands that print must not make
#: each read hold the stream's 256 MiB).
MAX_READ: Final = 20_000
MAX_READ_BYTES: Final = 16 * 1024 * 1024
#: Seconds a read is shared with the other readers of the same execution (its followers
#: read every 0.2 s: any number of them read the stream once per period, not once each).
SHARE_SECONDS: Final = 0.2

_shared: dict[tuple[int, str, int, frozenset[int]], tuple[float, asyncio.Future[Any]]] = {}


async def ensure_log_stream(js: Any, layout: StreamLayout | None = None) -> None:
    """Create the log stream, or bring it to `layout` (flowtide.server.jetstream)."""
    from nats.js.api import DiscardPolicy, RetentionPolicy, StreamConfig

    layout = layout or StreamLayout()
    config = StreamConfig(
        name=LOG_STREAM,
        subjects=[f"{LOG_PREFIX}.>"],
        retention=RetentionPolicy.LIMITS,
        max_msgs_per_subject=PER_COMMAND,
        max_age=MAX_AGE,
        max_msg_size=MAX_MSG,
        discard=DiscardPolicy.OLD,
    )
    await ensure_stream(js, layout.shape(config, layout.logs_max_bytes))


def own_rings(rings: dict[int, LiveLog], running: Mapping[int, Any]) -> dict[int, LiveLog]:
    """`rings` as the execution's commands say: the step and loop index of each running
    one (`running`: its open command records) from its record, not from what was
    published; the others not `open` (any worker of the pool may publish under any
    command id of it: a ring of no running command is shown only for a command whose
    events say it ended)."""
    out: dict[int, LiveLog] = {}
    for command_id, ring in rings.items():
        record = running.get(command_id)
        if record is None:
            out[command_id] = replace(ring, open=False)
        else:
            out[command_id] = replace(ring, step=record.step, loop_index=record.loop_index)
    return out


async def read_rings(
    js: Any, execution_id: int, skip: Set[int], *, pool: str
) -> dict[int, LiveLog]:
    """The rings of the execution's commands kept by the stream, but those in `skip`.
    `pool`: the execution's, whose workers alone run its commands (a worker of another
    pool may publish under its own pool's subjects for any execution id: those are not
    this execution's output). A read made less than `SHARE_SECONDS` ago (or in flight)
    for the same execution and `skip` is shared."""
    now = time.monotonic()
    for key, (at, _) in list(_shared.items()):
        if now - at > SHARE_SECONDS:
            del _shared[key]
    key = (id(asyncio.get_running_loop()), pool, execution_id, frozenset(skip))
    found = _shared.get(key)
    task: asyncio.Future[Any]
    if found is None:
        task = asyncio.ensure_future(_read(js, execution_id, pool, set(skip)))
        _shared[key] = (now, task)
    else:
        task = found[1]
    # A reader that goes away does not cancel the read the others wait for.
    return dict(await asyncio.shield(task))


async def _read(js: Any, execution_id: int, pool: str, skip: Set[int]) -> dict[int, LiveLog]:
    subject = log_filter(pool, execution_id)
    try:
        info = await js.stream_info(LOG_STREAM, subjects_filter=subject)
    except Exception:  # noqa: BLE001 - no stream (yet), NATS away: nothing live to show
        return {}
    count = sum((info.state.subjects or {}).values())
    if not count:
        return {}
    parts: dict[int, list[tuple[int, bytes, str, int | None]]] = {}
    kept = 0
    sub = await js.subscribe(subject, ordered_consumer=True)
    try:
        for _ in range(min(count, MAX_READ)):
            try:
                msg = await sub.next_msg(timeout=2.0)
            except TimeoutError:
                break
            headers = msg.headers or {}
            try:
                command_id = int(msg.subject.rsplit(".", 1)[1])
                if command_id in skip:
                    continue
                start = int(headers.get("Flowtide-Start", "0"))
                index = headers.get("Flowtide-Loop-Index")
                loop_index = int(index) if index is not None else None
            except ValueError:
                continue
            step = headers.get("Flowtide-Step", "")
            kept += len(msg.data)
            if kept > MAX_READ_BYTES:
                break  # the rest waits for the next read
            parts.setdefault(command_id, []).append((start, msg.data, step, loop_index))
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    out: dict[int, LiveLog] = {}
    for command_id, chunks in parts.items():
        chunks.sort(key=lambda c: c[0])
        # From the newest back while the chunks touch: what the stream still holds whole.
        run = [chunks[-1]]
        for chunk in reversed(chunks[:-1]):
            if chunk[0] + len(chunk[1]) != run[0][0]:
                break
            run.insert(0, chunk)
        first = run[0]
        out[command_id] = LiveLog(
            command_id=command_id,
            step=first[2],
            loop_index=first[3],
            start=first[0],
            data=b"".join(c[1] for c in run),
        )
    return out
