"""Python steps on a worker: set up before it takes any command."""

from __future__ import annotations

import asyncio
import logging
import os

from flowtide.tools.python_pool import Isolation

__all__ = ["start_python"]

log = logging.getLogger("flowtide.worker")


async def start_python(python: Isolation, worker_id: str) -> None:
    """Set up python steps (and warn when this process runs as root).

    Raises:
        ToolError: a python child process cannot start (as the chosen user): the
            worker must not take commands it would fail, or run as root unasked.
    """
    from flowtide.tools.registry import get_tool

    tool = get_tool("python")
    tool.configure(python)
    await asyncio.to_thread(tool.warm)
    if os.geteuid() == 0:
        if python.mode != "process":
            who = "as root, in the worker process"
        else:
            who = f"as user {tool.pool().user}, in child processes"
        log.warning(
            "flowtide worker %s runs as root: run it as an unprivileged user. Python"
            " steps run %s (--python-user, --python-isolation).",
            worker_id,
            who,
        )
