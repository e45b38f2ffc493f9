"""`kind: noop` — does nothing; returns its `result:` field (or None)."""

from __future__ import annotations

from typing import Any

from flowtide.tools.base import ToolContext


class NoopTool:
    kind = "noop"

    def run(self, config: dict[str, Any], ctx: ToolContext) -> Any:
        return config.get("result")
