"""What follows a committed step (`Stepper.after`): who publishes its commands; and what
a step hands to the workers whose reports it takes (`Stepper._hand_over`)."""

from __future__ import annotations

import asyncio
from typing import Any

from flowtide.engine.events import Command
from flowtide.engine.state import ExecutionState
from flowtide.ids import Snowflake
from flowtide.playbook.loader import parse_playbook
from flowtide.runtime.advance import Advance
from flowtide.server.steps import After, Stepper, SubmitResult, Taker
from flowtide.store.pg.outbox import OutboxRow


def _stepper(published: list[list[OutboxRow]], pokes: list[int]) -> Stepper:
    stepper = Stepper(None, None, None, None, None)  # type: ignore[arg-type]
    stepper.publish = published.append
    stepper.on_outbox = lambda: pokes.append(1)
    return stepper


def _after(commands: list[Command], notices: list[OutboxRow]) -> After:
    return After(7, "default", [SubmitResult()], Advance(commands=commands), notices)


def _run(stepper: Stepper, after: After) -> None:
    asyncio.run(stepper.after(after))


def test_commands_claimed_with_the_step_set_off_no_relay_pass() -> None:
    """Every command of the step was handed to a reporting worker: nothing to publish,
    and no claim transaction of the relay looking for rows (it was one per step)."""
    published: list[list[OutboxRow]] = []
    pokes: list[int] = []
    _run(_stepper(published, pokes), _after([Command(1, 7, "work")], []))
    assert published == [] and pokes == []


def test_the_rows_left_are_published_by_this_process() -> None:
    published: list[list[OutboxRow]] = []
    pokes: list[int] = []
    row = OutboxRow(5, 7, 2, "flowtide.commands.default.0.7", "{}", 1)
    _run(_stepper(published, pokes), _after([Command(1, 7, "work"), Command(2, 7, "work")], [row]))
    assert published == [[row]] and pokes == []


def test_without_publishing_the_relay_is_woken() -> None:
    pokes: list[Any] = []
    stepper = Stepper(None, None, None, None, None)  # type: ignore[arg-type]
    stepper.on_outbox = lambda: pokes.append(1)
    _run(stepper, _after([Command(1, 7, "work")], []))
    assert pokes == [1]


# -- what a step hands to the reporting workers (`Stepper._hand_over`) ---------------------

PLAYBOOK = """
workflow:
  - step: work
    tool: {kind: noop}
"""


def _state() -> ExecutionState:
    return ExecutionState(parse_playbook(PLAYBOOK), 7)


def test_each_taker_of_the_pool_gets_the_next_command_in_order() -> None:
    stepper = Stepper(None, None, None, Snowflake(), None)  # type: ignore[arg-type]
    state = _state()
    before = state.event_count
    commands = [Command(c, 7, "work", attempt=2, issued_event_id=100 + c) for c in (1, 2)]
    results = [SubmitResult() for _ in range(4)]
    takers = [
        Taker("w-other-pool", "gpu"),  # another pool: nothing
        Taker("w1", "default"),
        None,  # did not ask
        Taker("w2", "default"),
    ]
    claims = stepper._hand_over(state, "default", takers, commands, results)
    assert results[0].handed is None and results[2].handed is None
    first, second = results[1].handed, results[3].handed
    assert first is not None and second is not None
    assert (first.item.command_id, first.item.event_id, first.taken.attempt) == (1, 101, 2)
    assert (second.item.command_id, second.item.event_id) == (2, 102)
    # One command.claimed per command handed, for its worker, after its issue event,
    # applied to the state (the step writes them with its events).
    assert [(e.type, e.command_id, e.worker_id, e.parent_event_id) for e in claims] == [
        ("command.claimed", 1, "w1", 101),
        ("command.claimed", 2, "w2", 102),
    ]
    assert all(e.status == "claimed" and e.payload == {"attempt": 2} for e in claims)
    assert state.event_count == before + 2


def test_more_takers_than_commands_leaves_the_rest_without() -> None:
    stepper = Stepper(None, None, None, Snowflake(), None)  # type: ignore[arg-type]
    results = [SubmitResult(), SubmitResult()]
    takers = [Taker("w1", "default"), Taker("w2", "default")]
    commands = [Command(1, 7, "work", issued_event_id=101)]
    claims = stepper._hand_over(_state(), "default", takers, commands, results)
    assert len(claims) == 1 and results[0].handed is not None and results[1].handed is None


class _LostConnection:
    def rollback(self) -> None:
        import psycopg

        raise psycopg.OperationalError("the connection is lost")


class _Pool:
    def __init__(self) -> None:
        self.returned: list[Any] = []

    def putconn(self, conn: Any) -> None:
        self.returned.append(conn)


def test_a_failed_step_on_a_dropped_connection_gives_it_back_quietly() -> None:
    """PostgreSQL restarted under a step (bench/faults.py, pg-restart-immediate): the
    rollback of its failed transaction fails too; the connection still goes back to the
    pool (which discards it) and the rollback's error does not replace the step's."""
    pool, conn = _Pool(), _LostConnection()
    Stepper._give_back(pool, conn)  # type: ignore[arg-type]
    assert pool.returned == [conn]
