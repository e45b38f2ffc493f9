"""Removing what executions left on disk once they are old: `flowtide prune`.

An execution's files live under the data folder (`<home>/data`): datasets of spark steps
and results stored by reference, `<data>/<execution_id>/...` and
`<data>/results/<tier>/<execution_id>/...` (`flowtide.artifacts`). They are never needed
again once the execution ended long ago, and nothing else removes them. `prune` removes
those of executions that **ended** (completed, failed or cancelled) before a cutoff,
judged by the store's record of the execution. Folders of executions the store does not
know (another `--db`, a worker's home) and of executions still running or resumable are
kept and counted. The event log is not touched: `status` and `events` still work, and a
pruned result reads as gone.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowtide.errors import FlowtideError, NotFoundError

__all__ = ["Pruned", "execution_folders", "folder_size", "parse_age", "prune"]

ENDED = frozenset({"completed", "failed", "cancelled"})
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """Seconds in `30d`, `12h`, `90m`, `45s`, `2w`.

    Raises:
        FlowtideError: anything else.
    """
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if not found:
        raise FlowtideError(f"age {text!r}: expected a number and a unit: 30d, 12h, 90m, 45s, 2w")
    return float(found.group(1)) * _UNITS[found.group(2)]


@dataclass
class Pruned:
    """What a prune removed (or, dry, would remove), and what it kept."""

    executions: list[int] = field(default_factory=list)
    folders: int = 0
    bytes: int = 0
    kept_running: int = 0
    kept_unknown: int = 0
    kept_recent: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "executions": [str(e) for e in self.executions],
            "folders": self.folders,
            "bytes": self.bytes,
            "kept": {
                "running": self.kept_running,
                "unknown": self.kept_unknown,
                "recent": self.kept_recent,
            },
        }


def execution_folders(data: Path) -> Iterator[tuple[int, Path]]:
    """(execution id, folder) of every execution's folder under `data`."""
    candidates = [data, data / "logs"]
    results = data / "results"
    if results.is_dir():
        candidates += [tier for tier in results.iterdir() if tier.is_dir()]
    for parent in candidates:
        for folder in parent.iterdir() if parent.is_dir() else ():
            if folder.is_dir() and not folder.is_symlink() and folder.name.isdigit():
                yield int(folder.name), folder


def folder_size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def prune(store: Any, data: Path, *, older_than: float, now: float, dry_run: bool) -> Pruned:
    """Remove the folders under `data` of executions that ended `older_than` seconds
    before `now` (see the module); with `dry_run`, only say what would go."""
    out = Pruned()
    verdicts: dict[int, str] = {}
    for execution_id, folder in sorted(execution_folders(data)):
        verdict = verdicts.get(execution_id)
        if verdict is None:
            try:
                row = store.get_execution(execution_id)
            except NotFoundError:
                verdict = "unknown"
            else:
                if row.status not in ENDED:
                    verdict = "running"
                elif row.updated > now - older_than:
                    verdict = "recent"
                else:
                    verdict = "prune"
            verdicts[execution_id] = verdict
            if verdict == "running":
                out.kept_running += 1
            elif verdict == "unknown":
                out.kept_unknown += 1
            elif verdict == "recent":
                out.kept_recent += 1
            else:
                out.executions.append(execution_id)
        if verdict != "prune":
            continue
        out.folders += 1
        out.bytes += folder_size(folder)
        if not dry_run:
            shutil.rmtree(folder)
    return out
