"""flowtide.server.claims.judge: the verdict on each claim of a batch, from the command
rows the claim transaction locked. Pure logic, no database."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flowtide.errors import NotFoundError
from flowtide.server.claims import ClaimConflict, ClaimItem, Taken, WrongPool, judge
from flowtide.store.pg.commands import ClaimRow

EXECUTION = 7


def row(command_id: int = 1, **changes: Any) -> ClaimRow:
    base = ClaimRow(
        command_id=command_id,
        execution_id=EXECUTION,
        status="issued",
        worker_id=None,
        attempt=1,
        issued_event_id=100 + command_id,
        step="work",
        loop_instance=None,
        loop_index=None,
        pool="default",
        execution_status="running",
        cancel_requested=None,
    )
    return dataclasses.replace(base, **changes)


def item(command_id: int = 1, event_id: int | None = None) -> ClaimItem:
    return ClaimItem(EXECUTION, command_id, 100 + command_id if event_id is None else event_id)


def rows(*found: ClaimRow) -> dict[int, ClaimRow]:
    return {r.command_id: r for r in found}


def test_an_issued_command_is_given_to_the_worker() -> None:
    [got] = judge(rows(row(loop_instance=2, loop_index=5)), [item()], "w1", None)
    assert got == Taken("work", 1, 2, 5, "default", stopping=False)


def test_a_command_claimed_by_another_worker_conflicts_and_names_the_holder() -> None:
    [got] = judge(rows(row(status="claimed", worker_id="w2")), [item()], "w1", None)
    assert isinstance(got, ClaimConflict)
    assert got.holder == "w2"
    assert str(got) == "command 1 is claimed by w2"


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_a_closed_command_conflicts(status: str) -> None:
    [got] = judge(rows(row(status=status, worker_id="w2")), [item()], "w1", None)
    assert isinstance(got, ClaimConflict)
    assert str(got) == f"command 1 is {status}"


def test_the_same_worker_claiming_again_gets_a_new_lease_on_the_same_claim() -> None:
    # Its first claim went through, but the answer was lost.
    [got] = judge(rows(row(status="claimed", worker_id="w1")), [item()], "w1", None)
    assert isinstance(got, Taken)
    assert got.repeat


def test_a_notification_of_an_earlier_issue_conflicts() -> None:
    # The command was issued again (a new command.issued event): the old notification
    # must not hand out the new attempt.
    [got] = judge(rows(row(issued_event_id=555)), [item(event_id=101)], "w1", None)
    assert isinstance(got, ClaimConflict)
    assert "is not its latest issue" in str(got)
    # A row without a recorded issue takes any notification.
    [ok] = judge(rows(row(issued_event_id=None)), [item(event_id=9)], "w1", None)
    assert isinstance(ok, Taken)


def test_an_unknown_command_or_one_of_another_execution_is_not_found() -> None:
    missing, elsewhere = judge(
        rows(row(2, execution_id=EXECUTION + 1)), [item(1), item(2)], "w1", None
    )
    assert isinstance(missing, NotFoundError)
    assert isinstance(elsewhere, NotFoundError)


def test_a_worker_bound_to_a_pool_claims_only_that_pools_commands() -> None:
    found = rows(row(1, pool="gpu"), row(2, pool=None))
    gpu, default = judge(found, [item(1), item(2)], "w1", "cpu")
    assert isinstance(gpu, WrongPool)
    assert gpu.status == 403
    assert "'gpu'" in str(gpu)
    assert isinstance(default, WrongPool)  # a row without a pool is the default pool's
    ok, _ = judge(found, [item(1), item(2)], "w1", "gpu")
    assert isinstance(ok, Taken)
    assert ok.pool == "gpu"


def test_the_pool_is_checked_before_anything_else() -> None:
    [got] = judge(rows(row(pool="gpu", status="completed")), [item()], "w1", "cpu")
    assert isinstance(got, WrongPool)


def test_a_cancelled_or_cancelling_execution_is_told_to_the_worker() -> None:
    [cancelled] = judge(rows(row(execution_status="cancelled")), [item()], "w1", None)
    [cancelling] = judge(rows(row(cancel_requested=1.0)), [item()], "w1", None)
    [running] = judge(rows(row()), [item()], "w1", None)
    assert isinstance(cancelled, Taken) and cancelled.stopping
    assert isinstance(cancelling, Taken) and cancelling.stopping
    assert isinstance(running, Taken) and not running.stopping


def test_each_item_is_judged_after_the_ones_before_it() -> None:
    found = rows(row(1))
    first, again = judge(found, [item(1), item(1)], "w1", None)
    assert isinstance(first, Taken) and not first.repeat
    assert isinstance(again, Taken) and again.repeat
    # The rows given are left as they were.
    assert found[1].status == "issued"


def test_one_batch_mixes_verdicts_in_item_order() -> None:
    found = rows(row(1), row(2, status="claimed", worker_id="w2"), row(3, pool="gpu"))
    got = judge(found, [item(3), item(1), item(4), item(2)], "w1", "default")
    assert [type(g) for g in got] == [WrongPool, Taken, NotFoundError, ClaimConflict]
