"""What a trigger starts: the playbook it names (a catalog path and optional version, or
a file on the machine that fires it) and the workload it passes, rendered with what the
firing knows (`{{ schedule.time }}`, `{{ hook.body }}`, ...).

Not pure: `load_target` reads the catalog or a file (blocking: run it in a thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from flowtide.errors import TriggerError

if TYPE_CHECKING:
    from flowtide.playbook.model import Playbook
    from flowtide.store.base import Store
    from flowtide.store.triggers import Firing

__all__ = ["TriggeredRun", "load_target", "playbook_ref", "ref_text", "render_workload"]


class TriggeredRun(NamedTuple):
    """A run a trigger starts, as the read port's `start_many` takes it (a burst of
    schedules firing together is created in few transactions)."""

    playbook: Playbook
    workload: dict[str, Any]
    catalog_version: int | None = None
    firing: Firing | None = None
    notify: Sequence[dict[str, Any]] = ()
    pool: str = "default"


def playbook_ref(
    text: str, *, version: int | None = None, local: bool, base: Path | None = None
) -> dict[str, Any]:
    """The stored form of a trigger's playbook as a user names it.

    A name that is an existing file (or ends in .yaml/.yml) on a local store is kept as
    that file's absolute path (`{"file": ...}`), read again at each firing; anything else
    is a catalog path (`{"path": ..., "version": ...}`), the only kind a server takes (a
    file on the CLI's machine means nothing to it).

    Raises:
        TriggerError: an empty name, a version given with a file, or a file named for a
            server.
    """
    if not text or not text.strip():
        raise TriggerError("name a playbook: a catalog path or a file", field="playbook")
    # For a server, the name alone decides: probing its file system would tell an API
    # caller which files exist there.
    looks_like_file = text.endswith((".yaml", ".yml")) or (
        local and _is_file((base or Path.cwd()).joinpath(text))
    )
    if looks_like_file:
        if not local:
            raise TriggerError(
                f"{text!r} is a file: a server runs catalog playbooks; register it first "
                "(`flowtide catalog register FILE --server URL`) and name its path",
                field="playbook",
            )
        if version is not None:
            raise TriggerError("a version names a catalog playbook, not a file", field="version")
        try:
            path = (base or Path.cwd()).joinpath(text).resolve()
        except (OSError, ValueError):
            raise TriggerError(f"no playbook file {text!r}", field="playbook") from None
        if not _is_file(path):
            raise TriggerError(f"no playbook file {str(path)!r}", field="playbook")
        return {"file": str(path)}
    return {"path": text, "version": version}


def _is_file(path: Path) -> bool:
    """Whether `path` is a file; False for a name no file can have (too long, a NUL)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def ref_text(ref: dict[str, Any]) -> str:
    """How lists show a playbook reference: `reports/nightly`, `reports/nightly@3`, a file."""
    if "file" in ref:
        return str(ref["file"])
    version = ref.get("version")
    return f"{ref.get('path')}@{version}" if version else str(ref.get("path"))


def load_target(store: Store, ref: dict[str, Any]) -> tuple[Playbook, int | None]:
    """The playbook a trigger starts now and its catalog version (None for a file).

    Raises:
        NotFoundError: no such catalog path or version.
        PlaybookError: the file is missing or the text is not a valid playbook.
    """
    from flowtide.playbook.loader import load_playbook

    if "file" in ref:
        return load_playbook(ref["file"]), None
    row = store.get_playbook(str(ref["path"]), ref.get("version"))
    return _parsed(row.text, row.source_file), row.version


@lru_cache(maxsize=64)
def _parsed(text: str, source_file: str | None) -> Playbook:
    """A catalog text parsed once: a schedule firing every second (or a thousand firing
    at one instant) reads its playbook's row each time, never parses it again."""
    from flowtide.playbook.loader import parse_playbook

    return parse_playbook(text, source_file)


def render_workload(workload: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """A trigger's workload with its templates rendered over `context` (what the firing
    knows: `schedule`, `hook`, `message`...), in the playbooks' sandbox.

    Raises:
        TemplateError: a template that does not render (names the field).
    """
    from flowtide.playbook.template import render

    rendered = render(workload, context, field="workload")
    return dict(rendered)
