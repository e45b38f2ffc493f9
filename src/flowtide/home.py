"""Where flowtide keeps its state when no command says: the home.

    find_home(None)   # FLOWTIDE_HOME, else the nearest .flowtide folder from the working
                      # directory up, else the user's own (~/.local/share/flowtide)

A project keeps its runs beside it by holding a `.flowtide` folder (every command run in
it or below it finds that one); without one, every command of a user shares one home, so
`flowtide list` and `flowtide ui` show the same runs from whatever folder they start in.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["PROJECT_HOME", "choose", "find_home", "private_dir", "user_home"]

# The folder name a project's home has.
PROJECT_HOME = ".flowtide"

# The command line's --home, for every part of this process that looks for the home
# (the dev stack's token and certificates for a --server, a vault, the runtime's data).
_chosen: Path | None = None


def choose(home: str | Path | None) -> None:
    """Make `home` (a command's --home) this process's home; None forgets it."""
    global _chosen
    _chosen = Path(home) if home is not None and str(home) != "" else None


def user_home() -> Path:
    """The user's own home: $XDG_DATA_HOME/flowtide, else ~/.local/share/flowtide."""
    data = os.environ.get("XDG_DATA_HOME", "").strip()
    base = Path(data) if data and Path(data).is_absolute() else Path.home() / ".local" / "share"
    return base / "flowtide"


def find_home(explicit: str | Path | None = None, cwd: Path | None = None) -> Path:
    """`explicit` when given, else the command's --home (`choose`), else FLOWTIDE_HOME,
    else the nearest `.flowtide` folder in `cwd` (the working directory) or above it
    that is this user's own (owned, not a link, writable by nobody else), else
    `user_home()`."""
    if explicit is not None and str(explicit) != "":
        return Path(explicit)
    if _chosen is not None:
        return _chosen
    return discovered_home(cwd)


def discovered_home(cwd: Path | None = None) -> Path:
    """The home a command run in `cwd` without --home finds: FLOWTIDE_HOME, else the
    nearest `.flowtide` of this user's in `cwd` or above, else `user_home()`."""
    env = os.environ.get("FLOWTIDE_HOME", "").strip()
    if env:
        return Path(env)
    here = (cwd or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        candidate = folder / PROJECT_HOME
        if _yours(candidate):
            return candidate
    return user_home()


def _yours(folder: Path) -> bool:
    """A folder (not a link to one) that this user owns and nobody else may write: a
    `.flowtide` another user planted above the working directory (in /tmp, say) would
    otherwise hold this user's runs, credentials and master key."""
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def private_dir(path: Path) -> Path:
    """Make `path` and each missing folder above it with mode 0700 (`mkdir(parents=True,
    mode=...)` gives the parents the umask's 0755): a home, its database and its command
    logs are this user's alone. Folders that exist are left as they are."""
    missing: list[Path] = []
    folder = path
    while not folder.is_dir():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            if not folder.is_dir():
                raise
    return path
