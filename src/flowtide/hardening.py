"""What a process holding secrets does so that the steps it runs cannot read them.

A worker's token, NATS password and client key sit in its environment and memory, and a
step's program (a python child, a shell command) runs as the same user unless the worker
is root. Linux lets any process of a user read another's `/proc/<pid>/environ`, `mem`
and attach with ptrace; a process marked not dumpable (`PR_SET_DUMPABLE` 0) is out of
their reach (its /proc files then belong to root). Its children are dumpable again once
they start another program (exec), so nothing is lost for them; core dumps of the
worker itself are off (root can still debug it).
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["keep_to_ourselves"]

_PR_SET_DUMPABLE = 4


def keep_to_ourselves() -> bool:
    """Mark this process not dumpable (Linux); whether it now is."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False
