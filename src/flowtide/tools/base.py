"""The tool port: what every tool kind implements, and what it is given.

A tool receives its task configuration with every template already rendered, and a
`ToolContext`. It returns a JSON-serialisable result or raises `flowtide.errors.ToolError`
(never a driver's exception). Blocking tools run on a worker thread; a tool may also be
async (`async def run`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flowtide.errors import CredentialError, ToolError
from flowtide.redaction import mask_text, warn_weak_credential


class CredentialResolver(Protocol):
    def resolve(self, alias: str) -> dict[str, Any]:
        """Return the decrypted body of credential `alias`.

        Raises:
            flowtide.errors.CredentialError: no such alias or it cannot be decrypted.
        """
        ...


@dataclass
class ToolContext:
    execution_id: int
    step: str
    task: str | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    credentials: CredentialResolver | None = None
    # Values (passwords, DSNs) the tool touched. The runtime adds them to the execution's
    # secret set: what is stored holding one is sealed, what is shown is masked; results
    # themselves stay intact for the steps that read them.
    secrets: set[str] = field(default_factory=set)
    # The full render context (workload, step results, ctx, iter, execution_id), exposed
    # to python code as `context`.
    render_context: Mapping[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    stdout: list[str] = field(default_factory=list)
    # Set by the runtime: runs a sub-playbook (kind: playbook) and returns its result.
    run_playbook: Any = None
    # Set by the runtime: returns True once the execution is being cancelled.
    cancelled: Any = None
    # The playbook's `executor:` block (runtime hints such as `executor.spark`).
    executor: Mapping[str, Any] = field(default_factory=dict)
    # Where tools keep an execution's datasets (`<data_dir>/<execution_id>/<step>/`).
    data_dir: Path | None = None
    loop_index: int | None = None
    attempt: int = 1
    # Facts about the call (spark job ids, rows written...) that the runtime records in
    # the call.done / call.error event; never results, never secrets.
    call_meta: dict[str, Any] = field(default_factory=dict)
    # Set by the runtime: the command's live log (`flowtide.logs.CommandLog`): tools
    # write what the step prints to it as it is printed (besides `stdout`).
    log: Any = None

    def resolve_credential(self, alias: str) -> dict[str, Any]:
        """The body of credential `alias`, as a tool error when it cannot be had.

        Raises:
            ToolError: kind "credential" (no store, unknown alias, not a mapping).
        """
        if self.credentials is None:
            raise ToolError(
                f"credential '{alias}' cannot be resolved: no credential store is configured",
                kind="credential",
            )
        try:
            body = self.credentials.resolve(alias)
        except CredentialError as exc:
            raise ToolError(str(exc), kind="credential") from None
        if not isinstance(body, Mapping):
            raise ToolError(f"credential '{alias}' is not a mapping", kind="credential")
        warn_weak_credential(alias, body)
        return dict(body)

    def add_secret(self, value: Any) -> None:
        if isinstance(value, str) and len(value) >= 3:
            self.secrets.add(value)
            if self.log is not None:
                self.log.add_secrets([value])


class Tool(Protocol):
    kind: str

    def run(self, config: dict[str, Any], ctx: ToolContext) -> Any:
        """Run one task.

        Args:
            config: the task's fields, templates rendered (`kind`, `name` included).
            ctx: execution, step and credential access.
        Returns:
            A JSON-serialisable result.
        Raises:
            flowtide.errors.ToolError: the call failed; `kind`/`retryable` drive policies.
        """
        ...


def redact(text: str, secrets: set[str]) -> str:
    """`text` with each secret masked as `***` (for a tool's error message built from a
    driver's, which may quote a connection string). A short or common secret is masked only
    as a whole word (`flowtide.redaction`): `demo` never turns `demographics` into
    `***graphics` in a message a policy reads. Results are never masked."""
    return mask_text(text, secrets) if secrets else text


def _config_error(message: str) -> ToolError:
    return ToolError(message, kind="config_error")


def number_field(
    config: Mapping[str, Any],
    name: str,
    *,
    what: str = "a number",
    invalid: Callable[[str], ToolError] = _config_error,
) -> float | None:
    """Field `name` of a task as a number; None when it is unset or empty.

    Raises:
        ToolError: `invalid(message)` (a config_error by default): not a number.
    """
    raw = config.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise invalid(f"`{name}`: expected {what}, got {raw!r}") from None


def positive_field(
    config: Mapping[str, Any], name: str, *, what: str = "a number", default: float | None = None
) -> float | None:
    """Field `name` as a positive number; `default` when it is unset.

    Raises:
        ToolError: config_error, not a number or not positive.
    """
    value = number_field(config, name, what=what)
    if value is None:
        return default
    if value <= 0:
        raise _config_error(f"`{name}` must be positive, got {config.get(name)!r}")
    return value


def seconds(
    config: Mapping[str, Any],
    ctx: ToolContext,
    *names: str,
    default: float | None,
    invalid: Callable[[str], ToolError] = _config_error,
) -> float | None:
    """The smallest positive number of seconds among the fields `names` and the task's
    `timeout` (`ctx.timeout`); `default` when none is set (zero or less: not set)."""
    values = [number_field(config, name, what="seconds", invalid=invalid) for name in names]
    values.append(ctx.timeout)
    positive = [value for value in values if value is not None and value > 0]
    return min(positive) if positive else default
