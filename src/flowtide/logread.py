"""Reading an execution's logs (`flowtide logs`, `GET /api/executions/{id}/logs`): the
output of its ended commands from their events (`stdout` of call.done / call.error), and
of its running ones from their rings (`flowtide.logs`), followed until the execution
ends when asked. Each piece is masked with the execution's secret set.

A piece says which command it is of, at what byte `offset` of that command's output its
text starts, and `dropped`: bytes that are no longer kept before it (the ring keeps the
newest `RING_BYTES` of a command that writes faster than it is read).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Set
from typing import Any, Final

from typing_extensions import TypedDict

from flowtide.engine import events as ev
from flowtide.logfiles import LiveLog
from flowtide.redaction import mask_text
from flowtide.store.base import ENDED_STATUSES, Store

__all__ = ["LogPiece", "POLL", "read_logs"]

#: Seconds between two looks at the rings and the log while following.
POLL: Final = 0.2
#: Statuses after which nothing more is written: ended, or no process runs it any more
#: (`interrupted`, as an embedded store's readers tell it; a resume is another follow).
_NOT_FOLLOWED: Final = ENDED_STATUSES | {"interrupted"}
#: Events read from the store at once.
_BATCH: Final = 2000
_TYPES: Final = (ev.CALL_DONE, ev.CALL_ERROR, ev.COMMAND_COMPLETED, ev.COMMAND_FAILED)


class LogPiece(TypedDict):
    """Output of one command, in the order it was written."""

    command_id: str
    step: str
    loop_index: int | None
    #: Where `text` starts in the command's whole output (bytes, UTF-8).
    offset: int
    #: Bytes before `text` that are no longer kept (0: nothing missed).
    dropped: int
    text: str
    #: The command still runs (the text comes from its ring, not its events).
    running: bool


class _Command:
    __slots__ = ("step", "loop_index", "parts", "sent", "ended")

    def __init__(self, step: str, loop_index: int | None) -> None:
        self.step = step
        self.loop_index = loop_index
        self.parts: list[str] = []
        self.sent = 0
        self.ended = False


async def read_logs(
    store: Store,
    execution_id: int,
    *,
    live: Callable[[Set[int]], Awaitable[dict[int, LiveLog]]],
    status: Callable[[], Awaitable[str]],
    secrets: Callable[[], Awaitable[frozenset[str]]],
    step: str | None = None,
    follow: bool = False,
    poll: float = POLL,
    idle: float | None = None,
) -> AsyncIterator[LogPiece | None]:
    """The execution's output so far, command by command (ended ones first, in the order
    they ended, then the running ones); with `follow`, then what is written, until the
    execution has ended. `live`: the rings of its commands but the ones it is given
    (those already read to their end); `status`: its status (`interrupted` when no
    process runs it any more: its log is then read to its end, not followed); `secrets`: its secret set. `step`: only that step's commands."""
    commands: dict[int, _Command] = {}
    finished: set[int] = set()
    after: int | None = None
    steps = [step] if step is not None else None
    quiet_since = time.monotonic()
    while True:
        ended_before = (await status()) in _NOT_FOLLOWED
        # The events first, then the rings: a command seen ended had flushed its ring.
        while True:
            batch = await asyncio.to_thread(
                store.events,
                execution_id,
                after_event_id=after,
                limit=_BATCH,
                types=_TYPES,
                steps=steps,
            )
            for e in batch:
                after = e.event_id
                if e.command_id is None or e.command_id in finished:
                    continue
                payload = ev.payload_fields(e)
                index = payload.get("loop_index")
                command = commands.get(e.command_id)
                if command is None:
                    command = commands[e.command_id] = _Command(e.step or "", None)
                if isinstance(index, int):
                    command.loop_index = index
                if e.type in (ev.CALL_DONE, ev.CALL_ERROR):
                    out = payload.get("stdout")
                    if isinstance(out, str) and out and not command.ended:
                        command.parts.append(out if out.endswith("\n") else out + "\n")
                else:
                    command.ended = True
                    if not command.parts:
                        command.parts = _program_output(payload.get("result"))
            if len(batch) < _BATCH:
                break
        rings = await live(finished)
        mask = await secrets()
        for command_id, command in list(commands.items()):
            if not command.ended:
                continue
            ring = rings.get(command_id)
            data = "".join(command.parts).encode("utf-8", "replace")
            # The ring, unless the events say more (a worker's last chunk may reach the
            # stream after its report): the events keep the start, the ring the end.
            if ring is not None and ring.end >= len(data):
                piece = _from_ring(command_id, ring, command, mask, running=False)
            else:
                piece = _piece(command_id, command, 0, data, mask, running=False)
            if piece is not None:
                quiet_since = time.monotonic()
                yield piece
            del commands[command_id]
            finished.add(command_id)
        for command_id, ring in rings.items():
            if command_id in finished or not ring.open:
                continue
            if step is not None and ring.step != step:
                continue
            command = commands.get(command_id)
            if command is None:
                command = commands[command_id] = _Command(ring.step, ring.loop_index)
            piece = _from_ring(command_id, ring, command, mask, running=True)
            if piece is not None:
                quiet_since = time.monotonic()
                yield piece
        if not follow or ended_before:
            return
        if idle is not None and time.monotonic() - quiet_since >= idle:
            quiet_since = time.monotonic()
            yield None
        await asyncio.sleep(poll)


def _program_output(result: Any) -> list[str]:
    """What a shell or script step's programs wrote, from its result (their output is
    not `stdout` of the call: it is the result)."""
    data = result.get("data") if isinstance(result, dict) else None
    if not isinstance(data, dict):
        return []
    parts = [data.get(name) for name in ("stdout", "stderr", "output")]
    return [p if p.endswith("\n") else p + "\n" for p in parts if isinstance(p, str) and p]


def _from_ring(
    command_id: int, ring: LiveLog, command: _Command, mask: frozenset[str], *, running: bool
) -> LogPiece | None:
    return _piece(command_id, command, ring.start, ring.data, mask, running=running)


def _piece(
    command_id: int,
    command: _Command,
    start: int,
    data: bytes,
    mask: frozenset[str],
    *,
    running: bool,
) -> LogPiece | None:
    """The part of `data` (output from byte `start`) not sent yet, as a piece."""
    end = start + len(data)
    if end <= command.sent:
        return None
    dropped = max(0, start - command.sent)
    offset = max(command.sent, start)
    chunk = data[offset - start :]
    command.sent = end
    text = chunk.decode("utf-8", "replace")
    return {
        "command_id": str(command_id),
        "step": command.step,
        "loop_index": command.loop_index,
        "offset": offset,
        "dropped": dropped,
        "text": mask_text(text, mask) if mask else text,
        "running": running,
    }
