"""When a failed checkpoint save is tried again, and when the run gives up: no storage involved."""

import pytest

from spotray.checkpoints.save_retries import MAX_FINAL_WAIT_S, SaveFailureBudget


def next_try_after(budget: SaveFailureBudget, step: int) -> int:
    return next(s for s in range(step, step + 1000) if budget.retry_due(s)) - step


def test_the_retry_gap_doubles_with_each_failure_in_a_row_up_to_its_cap():
    budget = SaveFailureBudget(budget_s=900, max_gap=5)
    gaps = []
    for step in (10, 11, 13, 17, 22, 27):
        budget.saving()
        budget.failed(step, now=0.0)
        gaps.append(next_try_after(budget, step))
    assert gaps == [1, 2, 4, 5, 5, 5]


def test_a_success_starts_the_gap_and_the_clock_over_but_keeps_the_count():
    budget = SaveFailureBudget(budget_s=900, max_gap=50)
    for step, now in ((10, 100.0), (11, 160.0), (13, 220.0)):
        budget.failed(step, now)
    assert budget.seconds_failing(300.0) == 200.0
    assert budget.succeeded() == 3
    assert not budget.retry_due(10_000) and budget.seconds_failing(400.0) == 0.0
    budget.failed(20, now=500.0)
    assert next_try_after(budget, 20) == 1 and budget.seconds_failing(530.0) == 30.0
    assert budget.failed_saves == 4


def test_a_save_under_way_is_no_longer_due():
    budget = SaveFailureBudget(budget_s=900, max_gap=50)
    budget.failed(10, now=0.0)
    assert budget.retry_due(11)
    budget.saving()
    assert not budget.retry_due(11)


@pytest.mark.parametrize(("budget_s", "failing_for", "exhausted"),
                         [(900, 899.9, False), (900, 900, True), (0, 0, True)])
def test_the_budget_is_used_up_once_saves_have_failed_that_long(budget_s, failing_for, exhausted):
    assert SaveFailureBudget(budget_s, max_gap=50).exhausted(failing_for) is exhausted


def test_the_final_commit_waits_longer_after_each_failure_up_to_a_cap():
    budget = SaveFailureBudget(budget_s=900, max_gap=50)
    waits = []
    for step in range(8):
        budget.failed(step, now=0.0)
        waits.append(budget.final_wait_s())
    assert waits == [2, 4, 8, 16, MAX_FINAL_WAIT_S, MAX_FINAL_WAIT_S, MAX_FINAL_WAIT_S, MAX_FINAL_WAIT_S]
