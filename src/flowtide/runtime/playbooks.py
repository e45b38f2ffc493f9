"""A sub-playbook (or a notify target's playbook) the embedded runtime finds on disk
when the catalog has none: the file the path names, or one near the parent's file."""

from __future__ import annotations

from pathlib import Path

from flowtide.errors import PlaybookError
from flowtide.playbook.loader import load_playbook
from flowtide.playbook.model import Playbook

__all__ = ["playbook_file"]


def playbook_file(path: str, base_dir: Path | None) -> Playbook | None:
    """The playbook whose `metadata.path` (or file name) is `path`: the file `path`
    names, then files under `base_dir` (the leaf's name first); None if none is."""
    candidates: list[Path] = []
    direct = Path(path)
    for suffix in ("", ".yaml", ".yml"):
        p = Path(str(direct) + suffix)
        if p.is_file():
            candidates.append(p)
    if base_dir is not None:
        leaf = path.rstrip("/").rsplit("/", 1)[-1]
        for suffix in (".yaml", ".yml"):
            p = base_dir / f"{leaf}{suffix}"
            if p.is_file():
                candidates.append(p)
        candidates.extend(sorted(base_dir.rglob("*.y*ml"))[:500])
    seen: set[Path] = set()
    for candidate in candidates:
        if candidate in seen:
            continue
        seen.add(candidate)
        try:
            playbook = load_playbook(candidate)
        except PlaybookError:
            continue
        if playbook.path == path or candidate == direct or str(candidate) == path:
            return playbook
    return None
