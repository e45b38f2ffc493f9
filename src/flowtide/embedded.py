"""`flowtide.run`: run a playbook embedded from Python, as `flowtide run --json` does."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowtide.playbook.model import Playbook


def run(
    playbook: str | Path | Playbook,
    *,
    workload: Mapping[str, Any] | None = None,
    home: str | Path = ".flowtide",
    db: str | Path | None = None,
) -> dict[str, Any]:
    """Run `playbook` (a file, or a loaded Playbook) to the end in this process.

    Args:
        playbook: path of a playbook file, or a `Playbook` from `flowtide.load_playbook`.
        workload: overrides of workload keys (mappings merge into mappings).
        home: state folder (event store, credentials key).
        db: the SQLite event store (default: HOME/flowtide.db).
    Returns:
        The `flowtide run --json` document: execution_id, status, result, steps, error.
    Raises:
        PlaybookError: the playbook is invalid (nothing ran).
        TemplateError: the workload does not render (nothing ran).
    """
    from flowtide.credentials import CredentialVault
    from flowtide.playbook.loader import load_playbook
    from flowtide.runtime.local import LocalRuntime
    from flowtide.runtime.report import execution_document
    from flowtide.store.sqlite import SQLiteStore

    loaded = playbook if isinstance(playbook, Playbook) else load_playbook(playbook)
    home_path = Path(home)
    store = SQLiteStore(Path(db) if db is not None else home_path / "flowtide.db")

    async def main() -> dict[str, Any]:
        async with LocalRuntime(
            store, credentials=CredentialVault(store, home_path), data_dir=home_path / "data"
        ) as runtime:
            state = await runtime.run(loaded, workload=dict(workload or {}))
            return execution_document(state)

    try:
        return asyncio.run(main())
    finally:
        store.close()
