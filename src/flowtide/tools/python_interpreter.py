"""Which interpreter runs python steps in child processes.

As root, children run as another user (`nobody` by default). A Python installed under
`/root` (pyenv, a venv made from it) is one that user cannot start, and running the
children as root instead would hand every step the worker's files and secrets. So when
this interpreter is out of the other users' reach, an interpreter of the same version
that they can run (the distribution's `/usr/bin/python3.X`) runs the children; they
still import this process's packages (its `sys.path` goes to them first: the venv's
site-packages are readable where the project lives, and entries they cannot read are
skipped by the import system). Extension modules built for `3.X` load in any `3.X`.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
import sysconfig
from pathlib import Path

__all__ = ["child_executable", "child_pythonpath", "reachable_by_others"]

_CANDIDATES = ("/usr/bin", "/usr/local/bin")


def reachable_by_others(path: str | os.PathLike[str], *, execute: bool = False) -> bool:
    """Whether a user with no rights of owner or group can read `path` (and run it, with
    `execute`): every folder on the way searchable, the file readable."""
    try:
        real = Path(os.path.realpath(path))
        for folder in real.parents:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(real).st_mode
    except OSError:
        return False
    need = stat.S_IROTH | (stat.S_IXOTH if execute else 0)
    if stat.S_ISDIR(mode):
        need = stat.S_IROTH | stat.S_IXOTH
    return mode & need == need


def _usable(executable: str, stdlib: str) -> bool:
    return reachable_by_others(executable, execute=True) and reachable_by_others(stdlib)


@functools.cache
def child_executable() -> str:
    """This interpreter, unless this process is root and other users cannot run it (or
    read its standard library): then `python3.X` of the same version from /usr/bin or
    /usr/local/bin when one is there and reachable, else this one (the caller finds out
    that its children cannot start, and says so)."""
    if os.geteuid() != 0:
        return sys.executable
    if _usable(sys.executable, sysconfig.get_path("stdlib")):
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for folder in _CANDIDATES:
        candidate = os.path.join(folder, version)
        stdlib = os.path.join(os.path.dirname(folder), "lib", version)
        if os.path.exists(candidate) and _usable(candidate, stdlib):
            return candidate
    return sys.executable


def child_pythonpath() -> str | None:
    """The PYTHONPATH a program run with `child_executable()` needs to import this
    process's packages (the `script` tool's scripts): None when that interpreter is this
    one (it has them); else the entries of this process's `sys.path` other users can
    read, in order (this interpreter's own standard library, out of their reach, is
    left out: the other interpreter has its own)."""
    if child_executable() == sys.executable:
        return None
    entries = [entry for entry in sys.path if entry and reachable_by_others(entry)]
    return os.pathsep.join(dict.fromkeys(entries))
