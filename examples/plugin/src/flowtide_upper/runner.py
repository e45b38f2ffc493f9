"""The runner of `kind: upper`: imported when a task of the kind first runs."""

from __future__ import annotations

from typing import Any

from flowtide import ToolContext, ToolError


class UpperTool:
    """One instance per process, shared by every task of the kind (keep it thread-safe)."""

    kind = "upper"

    def run(self, config: dict[str, Any], ctx: ToolContext) -> Any:
        """`config`: the task's fields, templates rendered. Returns a JSON-ready result;
        a problem is a ToolError (its `kind` is what policies match on)."""
        text = config.get("text")
        if not isinstance(text, str):
            # A template may render to anything: checked here, not by the loader.
            raise ToolError(
                f"upper 'text' must be a string, not {type(text).__name__}",
                kind="config_error",
            )
        case = str(config.get("case") or "upper").lower()
        changed = {"upper": text.upper, "lower": text.lower, "title": text.title}[case]()
        out = " ".join([changed] * int(config.get("repeat") or 1))
        return {"text": out, "length": len(out)}
