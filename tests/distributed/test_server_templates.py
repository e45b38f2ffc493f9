"""Templates the server evaluates (step `set`, arcs, the workload) see no process
environment: the server's own settings never reach an event (issue 14: a step
`set: {ctx.db: "{{ env.FLOWTIDE_DB }}"}` put the server's DSN into `step.exit`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from flowtide.engine import events as ev
from flowtide.kv import connect
from flowtide.loopstate import LoopState
from flowtide.playbook.loader import parse_playbook
from flowtide.server.coordinator import Coordinator
from flowtide.store.postgres import PostgresStore

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

# Steps without a tool finish on the server: their `set` and arcs render there.
LEAK = """\
workload:
  region: "{{ env.FT_REGION | default('none') }}"
workflow:
  - step: start
    set:
      ctx.db: "{{ env.FLOWTIDE_DB }}"
"""

ALLOWED = """\
workload:
  region: "{{ env.FT_REGION | default('none') }}"
workflow:
  - step: start
    set:
      ctx.db: "{{ env.FLOWTIDE_DB | default('hidden') }}"
      ctx.home: "{{ env.HOME | default('hidden') }}"
    next:
      arcs:
        - {step: done, when: "{{ env.FT_REGION == 'eu' }}"}
  - step: done
"""


def _execute(dsn: str, text: str) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        kv = await connect("memory://", "flowtide_state", ttl=60)
        store = await asyncio.to_thread(PostgresStore, dsn, max_size=4)
        try:
            coordinator = Coordinator(store, loopstate=LoopState(kv), local_kv=True)
            execution_id = await coordinator.execute(parse_playbook(text, "pb.yaml"))
            return [
                {"type": e.type, "step": e.step, "payload": e.payload, "error": e.error}
                for e in store.events(execution_id)
            ]
        finally:
            store.close()
            await kv.close()

    return asyncio.run(main())


def test_server_templates_cannot_read_the_servers_environment(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWTIDE_DB", pg_database)
    monkeypatch.setenv("FT_REGION", "eu")
    events = _execute(pg_database, LEAK)
    assert pg_database not in json.dumps(events)
    exit_ = next(e for e in events if e["type"] == ev.STEP_EXIT)
    assert exit_["error"]["missing"] == "FLOWTIDE_DB"
    assert "FLOWTIDE_* are never visible to templates" in exit_["error"]["message"]
    assert events[-1]["type"] == ev.PLAYBOOK_FAILED
    # Nothing listed in FLOWTIDE_TEMPLATE_ENV: the workload saw no FT_REGION either.
    initialized = next(e for e in events if e["type"] == ev.PLAYBOOK_INITIALIZED)
    assert initialized["payload"]["workload"] == {"region": "none"}


def test_the_allow_list_opens_named_variables_and_never_flowtide_ones(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWTIDE_DB", pg_database)
    monkeypatch.setenv("FT_REGION", "eu")
    monkeypatch.setenv("FLOWTIDE_TEMPLATE_ENV", "FT_*,FLOWTIDE_DB")
    events = _execute(pg_database, ALLOWED)
    assert pg_database not in json.dumps(events)
    exits = {e["step"]: e for e in events if e["type"] == ev.STEP_EXIT}
    assert exits["start"]["payload"]["set"] == {"db": "hidden", "home": "hidden"}
    # The arc on FT_REGION was taken: the listed variable is visible.
    assert exits["start"]["payload"]["next"] == ["done"]
    initialized = next(e for e in events if e["type"] == ev.PLAYBOOK_INITIALIZED)
    assert initialized["payload"]["workload"] == {"region": "eu"}
    assert events[-1]["type"] == ev.PLAYBOOK_COMPLETED
