"""An example subscription source: `source: lines` starts a run for each line of a text
file (`config: {path: FILE}`), including lines appended while it listens.

A source is a factory `(spec, credentials) -> Source` named in the entry point group
`flowtide.sources`. Its deliveries carry a key that is the same every time a message is
delivered: here `<path>:<line number>`, so a listener that starts again reads the file
from the top and every line that started a run before starts nothing (flowtide records
each key once, with the run). A file has nothing to acknowledge: ack, nak and term are
left as they are.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from flowtide.errors import TriggerError
from flowtide.triggers.source import Delivery

__all__ = ["LinesSource"]


class LinesSource:
    """Each line of `config.path` is a message: `data` the line, `seq` its number."""

    def __init__(self, spec: Any, credentials: Any) -> None:
        path = spec.config.get("path")
        if not isinstance(path, str) or not path:
            raise TriggerError(
                "source lines needs config.path (a text file)",
                name=spec.name,
                field="config",
                kind="subscription",
            )
        self.path = Path(path)
        self.read = 0

    async def open(self) -> None:
        if not self.path.is_file():
            raise TriggerError(f"no file {str(self.path)!r}", field="config", kind="subscription")

    async def fetch(self, limit: int, timeout: float) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            lines = self.path.read_text(encoding="utf-8").splitlines()
            fresh = lines[self.read : self.read + limit]
            if fresh or loop.time() >= deadline:
                break
            await asyncio.sleep(min(0.1, max(deadline - loop.time(), 0)))
        out = []
        for offset, line in enumerate(fresh):
            number = self.read + offset + 1
            out.append(
                Delivery(
                    key=f"{self.path}:{number}",
                    message={"data": line, "subject": str(self.path), "seq": number, "id": None},
                )
            )
        self.read += len(fresh)
        return out

    async def close(self) -> None:
        return None
