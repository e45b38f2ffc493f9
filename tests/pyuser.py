"""Who python child processes run as in tests, and the folders they can use.

When the tests run as root, steps run as `nobody` (flowtide's default), through an
interpreter `nobody` can start (`flowtide.tools.python_interpreter`: this one, or the
system's of the same version when this one lives under /root). Only where no such
interpreter exists do the tests choose root out loud (`PYTHON_USER`), as the dev stack
does; flowtide never falls back to root on its own. Files those steps read go in the
`open_dir` fixture (conftest), not in `tmp_path` (0700 under a root run); what they
write, in a folder made `writable`."""

from __future__ import annotations

from pathlib import Path

from flowtide.tools.python_pool import default_user_works

PYTHON_USER: str | None = None if default_user_works() else "root"


def writable(folder: Path) -> Path:
    """`folder`, made if needed, writable by any user: where a step running as another
    user writes what the test reads back."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)
    return folder
