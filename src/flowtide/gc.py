"""`flowtide gc`: executions that ended long ago removed from the store, with their
events, commands, summaries, notification deliveries and files (the data folder's
datasets and stored results) — what grows forever otherwise. A run still open, and a
parent whose child is open, are never touched; trigger firings stay (they keep a slot,
delivery or message from starting a run again). See `flowtide.store.retention`.

Batched (`BATCH` executions per transaction), so a large collection never holds the
store for long; then the space is given back (`Store.reclaim`: SQLite rewrites the file).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowtide.prune import execution_folders, folder_size
from flowtide.store.base import ENDED_STATUSES, Store

__all__ = ["BATCH", "GarbageCollected", "collect_garbage"]

BATCH = 500


@dataclass
class GarbageCollected:
    """What a collection removed (or, dry, would remove)."""

    executions: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    folders: int = 0
    bytes: int = 0
    store_bytes_before: int | None = None
    store_bytes_after: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "executions": self.executions,
            "rows": self.rows,
            "folders": self.folders,
            "bytes": self.bytes,
            "store_bytes_before": self.store_bytes_before,
            "store_bytes_after": self.store_bytes_after,
        }


def collect_garbage(
    store: Store,
    data: Path | None,
    *,
    before: float,
    statuses: Sequence[str] = tuple(sorted(ENDED_STATUSES)),
    dry_run: bool = False,
    size: Callable[[], int | None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> GarbageCollected:
    """Remove the executions of `statuses` that ended before `before` (Unix seconds)
    and their files under `data`; `size` measures the store (before and after);
    `progress` is told the running count after each batch."""
    out = GarbageCollected(store_bytes_before=size() if size else None)
    folders = _folders_by_execution(data)
    if dry_run:
        ids = store.collectable(before=before, statuses=statuses, limit=10**9)
        _count(out, store.collect(ids, dry_run=True).rows, len(ids))
        _files(out, folders, ids, remove=False)
    else:
        while True:
            ids = store.collectable(before=before, statuses=statuses, limit=BATCH)
            if not ids:
                break
            # Files first: a crash between the two leaves rows whose files are gone (a
            # result that reads as pruned), never files nobody knows.
            _files(out, folders, ids, remove=True)
            done = store.collect(ids)
            _count(out, done.rows, done.executions)
            if progress is not None:
                progress(out.executions)
        if out.executions:
            store.reclaim()
    out.store_bytes_after = size() if size else None
    return out


def _count(out: GarbageCollected, rows: dict[str, int], executions: int) -> None:
    out.executions += executions
    for table, n in rows.items():
        out.rows[table] = out.rows.get(table, 0) + n


def _folders_by_execution(data: Path | None) -> dict[int, list[Path]]:
    found: dict[int, list[Path]] = {}
    if data is not None and data.is_dir():
        for execution_id, folder in execution_folders(data):
            found.setdefault(execution_id, []).append(folder)
    return found


def _files(
    out: GarbageCollected, folders: dict[int, list[Path]], ids: Sequence[int], *, remove: bool
) -> None:
    for execution_id in ids:
        for folder in folders.get(execution_id, ()):
            out.folders += 1
            out.bytes += folder_size(folder)
            if remove:
                shutil.rmtree(folder, ignore_errors=True)
