"""What follows a committed step (`Stepper.after`): who publishes its commands."""

from __future__ import annotations

import asyncio
from typing import Any

from flowtide.engine.events import Command
from flowtide.runtime.advance import Advance
from flowtide.server.steps import After, Stepper, SubmitResult
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
