"""Loop state in the KV bucket (DESIGN.md "Loop state").

    exec.<eid>.loop.<step>.<instance>.meta      collection size, iterator, mode, max_in_flight
    exec.<eid>.loop.<step>.<instance>.r.<index> one key per finished iteration, written with create
    exec.<eid>.loop.<step>.<instance>.done      create claims completion exactly once

`create` makes a duplicate delivery of an iteration result count once, whichever
process sees it; `done` makes the loop's continuation fire once. Keys of a loop are
removed when it finishes and every `exec.<eid>.>` key when the execution ends; the
bucket TTL is the backstop for executions that never end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Final, TypeVar

from flowtide.kv import (
    CREATE_MANY_MAX,
    CreateManyError,
    KeyExistsError,
    KeyNotFoundError,
    KeyValue,
    KVError,
    KVUnavailableError,
    encode_key_token,
)

DEFAULT_BUCKET = "flowtide_state"
DEFAULT_TTL = 3600.0
#: Seconds a loop-state write is repeated while the KV is unavailable (a JetStream
#: leader election takes 4-10 s after a node dies).
UNAVAILABLE_BUDGET: Final = 30.0
#: Seconds a key a `create` found existing is read again while a replica says it is not
#: there (`_existing`).
STALE_READ_BUDGET: Final = 2.0

log = logging.getLogger("flowtide.loopstate")
T = TypeVar("T")


def _unavailable(exc: BaseException) -> bool:
    if isinstance(exc, KVUnavailableError):
        return True
    return isinstance(exc, CreateManyError) and all(
        isinstance(e, KVUnavailableError) for e in exc.errors.values()
    )


async def retrying(call: Callable[[], Awaitable[T]], budget: float = UNAVAILABLE_BUDGET) -> T:
    """`await call()`, again while the KV is unavailable (`KVUnavailableError`, or a
    `create_many` whose every failure is one), at most `budget` seconds; then, and for
    any other error, raised."""
    deadline = time.monotonic() + budget
    pause = 0.1
    while True:
        try:
            return await call()
        except KVError as exc:
            if not _unavailable(exc) or time.monotonic() + pause > deadline:
                raise
            log.info("loop state: %s; trying again", exc)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


def loop_prefix(execution_id: int, step: str, instance: int) -> str:
    return f"exec.{execution_id}.loop.{encode_key_token(step)}.{instance}"


class LoopState:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def start(
        self, execution_id: int, step: str, instance: int, meta: dict[str, Any]
    ) -> None:
        """Record the loop's shape once (a second start of the same instance is a no-op)."""
        try:
            await retrying(
                lambda: self.kv.create(
                    f"{loop_prefix(execution_id, step, instance)}.meta",
                    json.dumps(meta, separators=(",", ":")).encode(),
                )
            )
        except KeyExistsError:
            pass

    async def record(
        self,
        execution_id: int,
        step: str,
        instance: int,
        index: int,
        status: str,
        command_id: int | None = None,
    ) -> bool:
        """Record iteration `index` as finished. False when it was already recorded.

        With `command_id`, the record names the command that finished the iteration, and
        a second record for the same command counts again: the KV is written before the
        event log commits, so a process that died (or a transaction that rolled back) in
        between leaves a record the log never got, and the command — issued again with
        the same id — must be able to finish the iteration. Another command's record
        still makes this one a duplicate.
        """
        key = f"{loop_prefix(execution_id, step, instance)}.r.{index}"
        value = status if command_id is None else f"{status}:{command_id}"
        try:
            await retrying(lambda: self.kv.create(key, value.encode()))
        except KeyExistsError:
            if command_id is None:
                return False
            stored = await self._existing(key)
            return stored is not None and stored.endswith(f":{command_id}".encode())
        return True

    async def record_many(
        self,
        execution_id: int,
        step: str,
        instance: int,
        records: Sequence[tuple[int, str, int | None]],
    ) -> list[bool]:
        """`record` for many iterations of one loop: per (index, status, command_id), in
        order, what `record` would return had it been called for each in turn.

        One `create_many` per 1,000 records. The records of existing keys that name a
        command are read back with one `get_last_many` per call, so a command's own
        earlier record counts again as in `record` (an index given twice counts for the
        second item only when both name the same command).

        Raises:
            KVError: as `record`, when the KV fails; records of earlier chunks may have
                been written (a retry of the same commands counts them again).
        """
        out: list[bool] = []
        prefix = loop_prefix(execution_id, step, instance)
        for start in range(0, len(records), CREATE_MANY_MAX):
            chunk = records[start : start + CREATE_MANY_MAX]
            keys = [f"{prefix}.r.{index}" for index, _, _ in chunk]
            values = [
                (status if command_id is None else f"{status}:{command_id}").encode()
                for _, status, command_id in chunk
            ]
            pairs = list(zip(keys, values, strict=True))
            revisions = await retrying(partial(self.kv.create_many, pairs))
            # Existing keys whose item names a command: counted if that command wrote them.
            check = [
                i
                for i, (rev, (_, _, command_id)) in enumerate(zip(revisions, chunk, strict=True))
                if rev is None and command_id is not None
            ]
            stored: dict[str, bytes] = {}
            if check:
                wanted = list(dict.fromkeys(keys[i] for i in check))
                try:
                    found = await retrying(partial(self.kv.get_last_many, wanted))
                except KVError:
                    found = {}
                stored = {key: entry.value for key, entry in found.items()}
                for key in wanted:
                    if key not in stored:  # read from a replica behind: ask again
                        again = await self._existing(key)
                        if again is not None:
                            stored[key] = again
            for i, (rev, (_, _, command_id)) in enumerate(zip(revisions, chunk, strict=True)):
                if rev is not None:
                    out.append(True)
                elif command_id is None or keys[i] not in stored:
                    out.append(False)
                else:
                    value = stored[keys[i]].decode(errors="replace")
                    out.append(value.endswith(f":{command_id}"))
        return out

    async def claim_done(self, execution_id: int, step: str, instance: int) -> bool:
        """Claim the loop's completion. True for exactly one caller (and for that caller
        when its claim was written by an attempt whose answer was lost: the claim holds a
        token of this call)."""
        key = f"{loop_prefix(execution_id, step, instance)}.done"
        token = secrets.token_hex(8).encode()
        try:
            await retrying(lambda: self.kv.create(key, token))
        except KeyExistsError:
            return await self._existing(key) == token
        return True

    async def _existing(self, key: str) -> bytes | None:
        """The value of `key`, which a `create` just found: None when it cannot be read.
        On a replicated bucket a read may be answered by a replica that has not applied
        the write yet (JetStream lets each replica answer a Direct Get), so not found is
        asked again for up to `STALE_READ_BUDGET` seconds."""
        deadline = time.monotonic() + STALE_READ_BUDGET
        while True:
            try:
                return (await retrying(lambda: self.kv.get(key))).value
            except KeyNotFoundError:
                if time.monotonic() >= deadline:
                    return None
            except KVError:
                return None
            await asyncio.sleep(0.05)

    async def finished_count(self, execution_id: int, step: str, instance: int) -> int:
        return len(await self.kv.keys(f"{loop_prefix(execution_id, step, instance)}.r.*"))

    async def drop_loop(self, execution_id: int, step: str, instance: int) -> None:
        """Drop a finished loop's per-iteration keys. `done` stays until the execution's
        cleanup, so a late duplicate cannot claim completion a second time."""
        prefix = loop_prefix(execution_id, step, instance)
        await self._purge([f"{prefix}.r.*", f"{prefix}.meta"])

    async def cleanup(self, execution_id: int) -> None:
        """Remove every key of the execution."""
        await self._purge([f"exec.{execution_id}.>"])

    async def _purge(self, filters: list[str]) -> None:
        # One subject-filtered purge per pattern, whatever the loop's size: a 100,000-
        # iteration loop must not cost 100,000 round trips to the KV at its end.
        try:
            await self.kv.purge_all(filters)
        except KVError:
            pass  # the bucket TTL removes what a failed cleanup leaves
