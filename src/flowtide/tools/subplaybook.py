"""A `playbook` task: a sub-playbook. The runtime runs the child execution (the kind has
no runner of its own); this is how the task calls it (`call`, the kind's
`ToolSpec.call`, through the `ToolContext.run_playbook` the runtime sets) and what the
task returns once the child ended (`child_result`, for every runtime that runs
children).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext


def call(config: dict[str, Any], ctx: ToolContext) -> Any:
    """Run the sub-playbook at `config["path"]` with the task's `input` (or `payload`) as
    its workload; its result (`child_result`).

    Raises:
        ToolError: config_error (no sub-playbooks in this runtime, no `path`), or the
            child's failure.
    """
    if ctx.run_playbook is None:
        raise ToolError("sub-playbooks are not available in this runtime", kind="config_error")
    path = config.get("path")
    if not path:
        raise ToolError("playbook tool needs 'path'", kind="config_error")
    child_input = config.get("input") or config.get("payload") or {}
    return ctx.run_playbook(
        path=str(path),
        workload=dict(child_input),
        return_step=config.get("return_step"),
        parent_execution_id=ctx.execution_id,
        base_dir=ctx.base_dir,
    )


def child_result(
    path: str,
    child_id: int | str,
    status: str,
    error: Mapping[str, Any] | None,
    results: Mapping[str, Any],
    final: Any,
    return_step: str | None,
) -> Any:
    """What a `playbook` step returns once its child execution ended: the child's result,
    or `return_step`'s (`results` maps step names to results).

    Raises:
        ToolError: the child did not complete, or has no `return_step`.
    """
    if status != "completed":
        err = dict(error or {})
        raise ToolError(
            f"sub-playbook '{path}' (execution {child_id}) {status}: {err.get('message', '')}",
            kind="playbook_error",
            data={"execution_id": child_id, "error": err},
        )
    if return_step:
        if return_step not in results:
            raise ToolError(
                f"sub-playbook '{path}' has no step '{return_step}'", kind="config_error"
            )
        return results[return_step]
    return final
