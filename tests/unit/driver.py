"""A pure, single-threaded driver for the engine: the test plays the worker.

It mirrors `LocalRuntime._process` without I/O: apply an event, ask `decide` what follows,
process what follows depth first, collect the commands. Ids come from a counter and time
is fixed, so a run is a deterministic function of the playbook and the worker's answers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from flowtide.engine import events as ev
from flowtide.engine.decide import decide
from flowtide.engine.events import Command, Event
from flowtide.engine.state import ExecutionState
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.model import Playbook
from payloads import check_payloads

# A counting cycle: a step entered again (its result from the run before stays in the
# context until the new run reports), an arc back to the same step, ctx set by `set` and
# by an arc (tests of the context revision and of the UI's graph and summary).
CYCLE = """
workload: {limit: 3}
workflow:
  - step: start
    tool: {kind: noop}
    set: {ctx.i: 0}
    next: [tick]
  - step: tick
    tool: {kind: noop}
    set: {ctx.i: "{{ ctx.i + 1 }}"}
    next:
      arcs:
        - {step: done, when: "{{ ctx.i >= limit }}", set: {ctx.last: "{{ ctx.i }}"}}
        - {step: tick}
  - step: done
    tool: {kind: noop}
"""

EXECUTION_ID = 7
FIRST_ID = 1000
NOW = 1_700_000_000.0

# What the worker reports for one command: merged into the command.completed payload
# (status/result/action/jump_to/ctx); "type": "command.failed" and "error" are honoured.
Answer = dict[str, Any]
Respond = Callable[["Driver", Command], Answer]
Pick = Callable[[list[Command]], Command]


def first_issued(outstanding: list[Command]) -> Command:
    return outstanding[0]


def last_issued(outstanding: list[Command]) -> Command:
    return outstanding[-1]


class Driver:
    """Runs one execution of `playbook` against scripted worker answers."""

    def __init__(
        self,
        playbook: Playbook | str,
        *,
        respond: Respond | None = None,
        pick: Pick = first_issued,
        workload: dict[str, Any] | None = None,
    ) -> None:
        self.playbook = parse_playbook(playbook) if isinstance(playbook, str) else playbook
        self.respond = respond or (lambda driver, command: {"result": {"step": command.step}})
        self.pick = pick
        self.workload = dict(self.playbook.workload if workload is None else workload)
        self.state = ExecutionState(self.playbook, EXECUTION_ID)
        self.log: list[Event] = []
        self.outstanding: list[Command] = []
        self.issued: list[Command] = []
        self.max_outstanding: dict[str, int] = {}
        self._next_id = FIRST_ID

    # -- ids and events ----------------------------------------------------------------

    def new_id(self) -> int:
        value = self._next_id
        self._next_id += 1
        return value

    def initialized(self) -> Event:
        return Event(
            event_id=self.new_id(),
            execution_id=EXECUTION_ID,
            type=ev.PLAYBOOK_INITIALIZED,
            status="running",
            payload={
                "workload": self.workload,
                "playbook": {
                    "name": self.playbook.name,
                    "path": self.playbook.path,
                    "version": self.playbook.version,
                    "file": None,
                },
                "parent_execution_id": None,
                "parent_command_id": None,
            },
            time=NOW,
        )

    def completion(self, command: Command, answer: Answer | None = None) -> Event:
        """The event a worker posts when `command` has run (see LocalRuntime._outcome_events)."""
        answer = dict(answer or {})
        type_ = answer.pop("type", ev.COMMAND_COMPLETED)
        error = answer.pop("error", None)
        payload: dict[str, Any] = {"attempt": command.attempt}
        if command.loop_index is not None:
            payload["loop_instance"] = command.loop_instance
            payload["loop_index"] = command.loop_index
        payload.update({"status": "ok", "result": None, "action": "continue"})
        payload.update(answer)
        return Event(
            event_id=self.new_id(),
            execution_id=EXECUTION_ID,
            type=type_,
            step=command.step,
            status=payload["status"],
            payload=payload,
            error=error,
            parent_event_id=command.issued_event_id,
            command_id=command.command_id,
            worker_id="test-worker",
            time=NOW,
        )

    # -- the engine loop -----------------------------------------------------------------

    def post(self, event: Event) -> list[Event]:
        """Apply `event` and everything that follows from it, depth first. Returns the
        events recorded (the input first)."""
        pending = deque([event])
        recorded: list[Event] = []
        while pending:
            current = pending.popleft()
            # Ids in a replayed log were taken from the same counter: never reuse one.
            self._next_id = max(self._next_id, current.event_id + 1)
            self.state.apply(current)
            recorded.append(current)
            new_events, commands = decide(self.state, current, NOW, self.new_id)
            # What the engine writes is what its payload types say (tests/payloads.py).
            check_payloads(new_events)
            pending.extendleft(reversed(new_events))
            for command in commands:
                self.outstanding.append(command)
                self.issued.append(command)
            self._note_in_flight()
            if current.type in ev.TERMINAL_TYPES:
                self.outstanding.clear()
        self.log.extend(recorded)
        return recorded

    def _note_in_flight(self) -> None:
        counts: dict[str, int] = {}
        for command in self.outstanding:
            counts[command.step] = counts.get(command.step, 0) + 1
        for step, count in counts.items():
            self.max_outstanding[step] = max(self.max_outstanding.get(step, 0), count)

    def start(self) -> Driver:
        self.post(self.initialized())
        return self

    def answer(self, command: Command, answer: Answer | None = None) -> list[Event]:
        """Complete one outstanding command."""
        self.outstanding.remove(command)
        if answer is None:
            answer = self.respond(self, command)
        return self.post(self.completion(command, answer))

    def run(self, max_rounds: int = 10_000) -> Driver:
        """Start and answer commands (chosen by `pick`) until nothing is outstanding."""
        if not self.log:
            self.start()
        for _ in range(max_rounds):
            if not self.outstanding or self.state.terminal:
                return self
            self.answer(self.pick(self.outstanding))
        raise AssertionError("the execution did not settle")

    # -- helpers for assertions ----------------------------------------------------------

    def element(self, command: Command) -> Any:
        loop = self.state.loops[(command.step, command.loop_instance or 0)]
        return loop.collection[command.loop_index or 0]

    def types(self, step: str | None = None) -> list[str]:
        return [e.type for e in self.log if step is None or e.step == step]

    def count(self, type_: str, step: str | None = None) -> int:
        return sum(1 for e in self.log if e.type == type_ and (step is None or e.step == step))

    def entered(self) -> list[str]:
        return [e.step or "" for e in self.log if e.type == ev.STEP_ENTER]

    def terminal_event(self) -> Event:
        return next(e for e in reversed(self.log) if e.type in ev.TERMINAL_TYPES)


def replay(playbook: Playbook, recorded: Iterable[Event]) -> Driver:
    """Feed the log's inputs (initialization and worker reports) to a fresh engine.

    Everything else in the returned driver's log was decided anew, so comparing it with
    `recorded` shows whether the engine still takes the decisions it took then.
    """
    driver = Driver(playbook)
    for event in recorded:
        if event.type in (ev.PLAYBOOK_INITIALIZED, ev.COMMAND_COMPLETED, ev.COMMAND_FAILED):
            driver.post(event)
    return driver


def snapshot(state: ExecutionState) -> dict[str, Any]:
    """The observable part of a folded state, as plain JSON-able data."""
    return {
        "status": state.status,
        "error": state.error,
        "ctx": state.ctx,
        "last_finished": state.last_finished,
        "result": state.result(),
        "steps": {
            name: {
                "status": rec.status,
                "runs": rec.runs,
                "result": rec.result,
                "error": rec.error,
                "outcome": rec.outcome,
            }
            for name, rec in state.steps.items()
        },
        "loops": {
            f"{step}#{instance}": {
                "size": loop.size,
                "max_in_flight": loop.max_in_flight,
                "results": loop.results,
                "success": loop.success,
                "failed": loop.failed,
                "broken": loop.broken,
                "finished": loop.finished,
            }
            for (step, instance), loop in sorted(state.loops.items())
        },
        "open_commands": sorted(state.commands),
        "active": sorted(state.active),
        "waiting": sorted(state.waiting),
    }
