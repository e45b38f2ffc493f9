"""Starting an execution, for every runtime: the rendered workload, the execution row and
the first events, from a playbook and the caller's overrides.

The embedded runtime writes the row with `Store.create_execution` and hands the events to
its engine loop; the server inserts the row and takes the first engine step in one
transaction. Both get them from `start_execution`, so an execution starts the same way
wherever it runs. Pure: ids and the time are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowtide.engine import events as ev
from flowtide.engine.context import NO_ENV, execution_ids
from flowtide.engine.events import Event, InitializedPayload, SecretsAddedPayload
from flowtide.errors import PlaybookError
from flowtide.playbook.model import Playbook
from flowtide.playbook.template import render
from flowtide.storable import bad_text

__all__ = [
    "Start",
    "inherited_secrets_event",
    "initialized_event",
    "render_workload",
    "start_execution",
]


def _merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`overrides` over `base`, mapping into mapping (`--set a.b=1` keeps `a.c`)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def render_workload(
    playbook: Playbook,
    execution_id: int,
    overrides: Mapping[str, Any],
    env: Mapping[str, str] = NO_ENV,
) -> dict[str, Any]:
    """The workload with overrides applied and its own templates rendered (`env`: the
    environment variables its templates may read, see `visible_env`).

    Raises:
        TemplateError: a workload value refers to something that does not exist.
        PlaybookError: a value holds text that cannot be stored (NUL, a lone surrogate).
    """
    raw = _merge(playbook.workload, overrides)
    scope = {
        **raw,
        "workload": raw,
        "payload": dict(overrides),
        "input": dict(overrides),
        **execution_ids(execution_id),
        "env": env,
    }
    out: dict[str, Any] = {}
    for key, value in raw.items():
        out[key] = render(value, scope, field=f"workload.{key}")
    found = bad_text(out, "workload")
    if found is not None:
        where, what = found
        raise PlaybookError(
            f"holds {what}, which cannot be stored: a workload must be valid Unicode text"
            " without NUL",
            field=where,
        )
    return out


def initialized_event(
    playbook: Playbook,
    execution_id: int,
    workload: dict[str, Any],
    *,
    event_id: int,
    now: float,
    parent_execution_id: int | None = None,
    parent_command_id: int | None = None,
    pool: str | None = None,
    notify: Sequence[dict[str, Any]] = (),
    traceparent: str | None = None,
) -> Event:
    """The `playbook.initialized` event that starts an execution (with the workers'
    `pool` that runs its commands, when there is one: the server's executions; and the
    `notify` targets its trigger adds, when any)."""
    payload: InitializedPayload = {
        "workload": workload,
        "playbook": {
            "name": playbook.name,
            "path": playbook.path,
            "version": playbook.version,
            "file": playbook.file,
        },
        "parent_execution_id": parent_execution_id,
        "parent_command_id": parent_command_id,
    }
    if pool is not None:
        payload["pool"] = pool
    if notify:
        payload["notify"] = [dict(target) for target in notify]
    if traceparent is not None:
        payload["traceparent"] = traceparent
    return Event(
        event_id=event_id,
        execution_id=execution_id,
        type=ev.PLAYBOOK_INITIALIZED,
        status="running",
        payload=payload,
        time=now,
    )


def inherited_secrets_event(
    execution_id: int,
    secrets: frozenset[str],
    *,
    event_id: int,
    now: float,
    parent_execution_id: int,
) -> Event:
    """The `secrets.added` that gives a sub-playbook execution its parent's secret set
    (its workload comes from the parent's data): it goes before `playbook.initialized`,
    in the same batch."""
    payload: SecretsAddedPayload = {
        "values": sorted(secrets),
        "parent_execution_id": parent_execution_id,
    }
    return Event(
        event_id=event_id,
        execution_id=execution_id,
        type=ev.SECRETS_ADDED,
        status="ok",
        payload=payload,
        time=now,
    )


@dataclass(frozen=True, slots=True)
class Start:
    """A new execution: its row (`columns()`) and the events that start it, in order."""

    execution_id: int
    playbook: Playbook
    #: The workload as rendered (overrides applied).
    workload: dict[str, Any]
    catalog_version: int | None
    parent_execution_id: int | None
    parent_command_id: int | None
    created: float
    #: The parent's secret set (a sub-playbook's workload comes from the parent's data).
    secrets: frozenset[str]
    events: list[Event]

    def columns(self) -> dict[str, Any]:
        """The execution row: keyword arguments of `Store.create_execution` (and of the
        SQL stores' `execution_insert`), after the execution id."""
        return {
            "playbook_path": self.playbook.path,
            "playbook_version": self.catalog_version,
            "playbook_file": self.playbook.file,
            "playbook_text": self.playbook.text,
            "workload": self.workload,
            "parent_execution_id": self.parent_execution_id,
            "parent_command_id": self.parent_command_id,
            "created": self.created,
            "secrets": self.secrets,
            "deadline": self.created + t if (t := self.playbook.timeout) else None,
            "sla": self.created + s if (s := self.playbook.sla) else None,
        }


def start_execution(
    playbook: Playbook,
    overrides: Mapping[str, Any],
    *,
    next_id: Callable[[], int],
    now: float,
    env: Mapping[str, str] = NO_ENV,
    catalog_version: int | None = None,
    parent_execution_id: int | None = None,
    parent_command_id: int | None = None,
    inherited: frozenset[str] = frozenset(),
    pool: str | None = None,
    execution_id: int | None = None,
    notify: Sequence[dict[str, Any]] = (),
    traceparent: str | None = None,
) -> Start:
    """A new execution of `playbook` with the workload `overrides`: ids from `next_id`
    (the execution's first, unless `execution_id` is given: a sharded server picks one
    its own shard owns), `inherited` the parent's secret set, `pool` the workers'
    pool that runs its commands (recorded in `playbook.initialized`; none embedded),
    `traceparent` the W3C trace context it starts under (recorded there too).

    Raises:
        TemplateError: the workload does not render.
    """
    if execution_id is None:
        execution_id = next_id()
    workload = render_workload(playbook, execution_id, overrides, env)
    first = initialized_event(
        playbook,
        execution_id,
        workload,
        event_id=next_id(),
        now=now,
        parent_execution_id=parent_execution_id,
        parent_command_id=parent_command_id,
        pool=pool,
        notify=notify,
        traceparent=traceparent,
    )
    events = [first]
    if inherited and parent_execution_id is not None:
        given = inherited_secrets_event(
            execution_id,
            inherited,
            event_id=next_id(),
            now=now,
            parent_execution_id=parent_execution_id,
        )
        events = [given, first]
    return Start(
        execution_id,
        playbook,
        workload,
        catalog_version,
        parent_execution_id,
        parent_command_id,
        now,
        inherited,
        events,
    )
