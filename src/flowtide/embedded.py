"""`flowtide.run`: run a playbook embedded from Python, as `flowtide run --json` does.

`run_to_end` is the embedded lifecycle both use: a `LocalRuntime` over an open store,
with the credential vault and the spark data folder of the state folder, one execution
started (or resumed) and waited for, the runtime closed whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowtide.home import find_home
from flowtide.playbook.model import Playbook

if TYPE_CHECKING:
    from flowtide.engine.state import ExecutionState
    from flowtide.runtime.local import Listener, LocalRuntime
    from flowtide.store.base import Store


async def run_to_end(
    store: Store,
    home: Path,
    start: Callable[[LocalRuntime], Awaitable[int]],
    *,
    kv: Any = None,
    listener: Listener | None = None,
    watch: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None,
) -> ExecutionState:
    """Start one execution on an embedded runtime over `store` and wait for its end.

    Args:
        store: the event store; the caller opens and closes it.
        home: state folder: the credential vault's master key, spark results in home/data.
        start: starts the execution on the runtime (`runtime.start(...)`, or
            `runtime.resume(id)`) and returns its id.
        kv: the loop-state KV, opened by the caller (default: the runtime's own memory://).
        listener: sees every batch of events the runtime applies.
        watch: called with the execution id once it started; the wait runs inside the
            context it returns (a live display).
    Returns:
        The execution's final state.
    """
    from flowtide.credentials import CredentialVault
    from flowtide.documents.summary import keep_summary
    from flowtide.runlock import run_locks_for
    from flowtide.runtime.local import LocalRuntime

    async with LocalRuntime(
        store,
        kv=kv,
        credentials=CredentialVault(store, home),
        listener=listener,
        data_dir=home / "data",
        locks=run_locks_for(store, home),
        # What the UI shows of the run at a glance, kept as it ends.
        on_finished=partial(keep_summary, store),
    ) as runtime:
        execution_id = await start(runtime)
        with watch(execution_id) if watch is not None else contextlib.nullcontext():
            return await runtime.wait(execution_id)


def run(
    playbook: str | Path | Playbook,
    *,
    workload: Mapping[str, Any] | None = None,
    home: str | Path | None = None,
    db: str | Path | None = None,
) -> dict[str, Any]:
    """Run `playbook` (a file, or a loaded Playbook) to the end in this process.

    Args:
        playbook: path of a playbook file, or a `Playbook` from `flowtide.load_playbook`.
        workload: overrides of workload keys (mappings merge into mappings).
        home: state folder (event store, credentials key); default FLOWTIDE_HOME, else
            the nearest .flowtide folder from the working directory up, else
            ~/.local/share/flowtide (flowtide.home).
        db: the SQLite event store (default: HOME/flowtide.db).
    Returns:
        The `flowtide run --json` document: execution_id, status, result, steps, error.
    Raises:
        PlaybookError: the playbook is invalid (nothing ran).
        TemplateError: the workload does not render (nothing ran).
    """
    from flowtide.documents.execution import intact
    from flowtide.playbook.loader import load_playbook
    from flowtide.store.sqlite import SQLiteStore

    loaded = playbook if isinstance(playbook, Playbook) else load_playbook(playbook)
    home_path = find_home(home)
    store = SQLiteStore(Path(db) if db is not None else home_path / "flowtide.db")

    async def start(runtime: LocalRuntime) -> int:
        return await runtime.start(loaded, workload=dict(workload or {}))

    try:
        return dict(intact(asyncio.run(run_to_end(store, home_path, start))))
    finally:
        store.close()
