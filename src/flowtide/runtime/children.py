"""Sub-playbooks of the embedded runtime: a `playbook` step's child found (the catalog
first, then files near the parent) and run in the same `LocalRuntime`, its parent
waiting in its worker thread (`LocalRuntime` inherits `ChildPlaybooks`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowtide import tracing
from flowtide.errors import FlowtideError, NotFoundError, TemplateError, ToolError
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook
from flowtide.runtime.playbooks import playbook_file
from flowtide.tools.subplaybook import child_result

if TYPE_CHECKING:
    from flowtide.engine.state import ExecutionState
    from flowtide.store.base import Store

__all__ = ["ChildPlaybooks"]


class ChildPlaybooks:
    """The sub-playbook methods of `LocalRuntime` (which provides what is declared here)."""

    if TYPE_CHECKING:
        store: Store
        _loop: asyncio.AbstractEventLoop | None
        _executions: dict[int, Any]

        async def start(
            self,
            playbook: Playbook,
            *,
            workload: Mapping[str, Any] | None = ...,
            catalog_version: int | None = ...,
            parent_execution_id: int | None = ...,
            traceparent: str | None = ...,
        ) -> int: ...
        async def wait(self, execution_id: int, timeout: float | None = None) -> ExecutionState: ...
        async def cancel(self, execution_id: int, reason: str = ...) -> None: ...

    def resolve_playbook(
        self, path: str, base_dir: Path | None = None, version: int | None = None
    ) -> tuple[Playbook, int | None]:
        """Find a playbook by catalog path: the catalog first, then files near the parent.

        Raises:
            NotFoundError: no catalog entry and no file with that metadata.path.
        """
        try:
            row = self.store.get_playbook(path, version)
            return parse_playbook(row.text, row.source_file), row.version
        except NotFoundError:
            pass
        found = playbook_file(path, base_dir)
        if found is not None:
            return found, None
        raise NotFoundError(
            f"no playbook with path '{path}' in the catalog"
            + (f" or under {base_dir}" if base_dir else "")
            + "; register it with `flowtide catalog register FILE`"
        )

    def _run_child_blocking(
        self,
        *,
        path: str,
        workload: dict[str, Any],
        return_step: str | None,
        parent_execution_id: int,
        base_dir: Path,
    ) -> Any:
        assert self._loop is not None
        # The command running in this thread is the child's parent span.
        under = tracing.current()
        future = asyncio.run_coroutine_threadsafe(
            self._run_child(path, workload, return_step, parent_execution_id, base_dir, under),
            self._loop,
        )
        return future.result()

    async def _run_child(
        self,
        path: str,
        workload: dict[str, Any],
        return_step: str | None,
        parent_execution_id: int,
        base_dir: Path,
        traceparent: str | None = None,
    ) -> Any:
        try:
            playbook, version = self.resolve_playbook(path, base_dir)
        except NotFoundError as exc:
            raise ToolError(str(exc), kind="not_found") from exc
        parent = self._executions.get(parent_execution_id)
        if parent is not None and parent.cancelled.is_set():
            raise ToolError(
                f"sub-playbook '{path}': parent execution {parent_execution_id} is cancelled",
                kind="cancelled",
            )
        try:
            child_id = await self.start(
                playbook,
                workload=workload,
                catalog_version=version,
                parent_execution_id=parent_execution_id,
                traceparent=traceparent,
            )
        except (TemplateError, FlowtideError) as exc:
            raise ToolError(f"sub-playbook '{path}': {exc}", kind="playbook_error") from exc
        if parent is not None and parent.cancelled.is_set():
            # The parent was cancelled while this child was being started.
            await self.cancel(child_id, f"parent execution {parent_execution_id} cancelled")
        state = await self.wait(child_id)
        return child_result(
            path,
            child_id,
            state.status,
            state.error,
            {name: rec.result for name, rec in state.steps.items()},
            state.result(),
            return_step,
        )
