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

import json
from typing import Any

from flowtide.kv import KeyExistsError, KeyValue, KVError, encode_key_token

DEFAULT_BUCKET = "flowtide_state"
DEFAULT_TTL = 3600.0


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
            await self.kv.create(
                f"{loop_prefix(execution_id, step, instance)}.meta",
                json.dumps(meta, separators=(",", ":")).encode(),
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
            await self.kv.create(key, value.encode())
        except KeyExistsError:
            if command_id is None:
                return False
            try:
                entry = await self.kv.get(key)
            except KVError:
                return False
            return entry.value.decode(errors="replace").endswith(f":{command_id}")
        return True

    async def claim_done(self, execution_id: int, step: str, instance: int) -> bool:
        """Claim the loop's completion. True for exactly one caller."""
        try:
            await self.kv.create(f"{loop_prefix(execution_id, step, instance)}.done", b"1")
        except KeyExistsError:
            return False
        return True

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
