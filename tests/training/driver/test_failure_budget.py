"""spotray's budgets inside Ray Train's controller: spot kills never spend ``max_failures`` (Ray would end a spot
run at its 4th kill), errors and unexplained endings do, and a kill's evidence that follows Ray's failure is waited
for only where it decides."""

from __future__ import annotations

import json
import pickle
import threading
import time

import pytest
from ray.train.v2._internal.execution.controller.state import RestartingState, RunningState
from ray.train.v2.api.exceptions import WorkerGroupError

from spotray import config
from spotray.accounts import endings, goodput, ledger
from spotray.driver import failure_budget
from spotray.driver.failure_budget import BudgetSpent, FailureBudget
from spotray.driver.launch import failure_config
from spotray.errors import ConfigError, Unrestorable
from spotray.storage import Location, StorageOptions, resolve

FAILED = RestartingState(WorkerGroupError("rank 1: Traceback ...\nFloatingPointError: loss is nan", {}))


def budget_for(tmp_path, *overrides: str) -> tuple[FailureBudget, Location]:
    cfg = config.load(None, ["data.path=/unused", *overrides])
    attempts = resolve(str(tmp_path / "attempts"))
    budget = FailureBudget(attempts.url, StorageOptions(), cfg.fault_tolerance, "r", time.time() - 1)
    budget.after_controller_start(None)
    return budget, attempts


def attempt_ends(attempts, kind: str | None) -> str:
    """A new attempt, ended as ``kind`` says (None: nothing on record yet, as for a kill before its evidence)."""
    attempt_id = f"{len(ledger.read_attempts(attempts)) + 1:03d}"
    ledger.write_attempt(attempts, ledger.AttemptInfo(attempt_id, 0, 2, 4))
    if kind == endings.ERROR:
        attempts.child(attempt_id, goodput.STATUS_FILE).write_text(json.dumps(
            {"error": "FloatingPointError: loss is nan", "entered_at": time.time(), "last_seen": time.time()}))
    elif kind is not None:
        endings.record(attempts, attempt_id, kind, "node n lost")
    return attempt_id


def test_ray_train_is_given_no_limits_of_its_own():
    assert (failure_config().max_failures, failure_config().max_preemption_failures) == (-1, -1)


def test_spot_kills_never_spend_the_failure_budget(tmp_path):
    budget, attempts = budget_for(tmp_path, "fault_tolerance.max_failures=0")
    for _ in range(5):  # Ray Train would have ended the run at the 1st (max_failures=0)
        attempt_ends(attempts, endings.KILL)
        budget.after_controller_state_update(RunningState(), FAILED)


def test_errors_and_unexplained_endings_spend_it_and_the_user_sees_the_last_error(tmp_path):
    budget, attempts = budget_for(tmp_path, "fault_tolerance.max_failures=2")
    attempt_ends(attempts, endings.ERROR)
    budget.after_controller_state_update(RunningState(), FAILED)
    attempt_ends(attempts, endings.NODE_LOST)  # a node that is not spot
    budget.after_controller_state_update(RunningState(), FAILED)
    with pytest.raises(BudgetSpent) as raised:  # the 3rd: a group that failed before its attempt recorded itself
        budget.after_controller_state_update(RunningState(), FAILED)
    assert str(raised.value) == "FloatingPointError: loss is nan"  # Ray Train ends the run with it


@pytest.mark.parametrize("error", [Unrestorable("no committed checkpoint under r could be read (steps 20, 10: "
                                                "trained on 49 samples)"),
                                   ConfigError("script.allow_world_size_change", "saved by 2 workers", "use 2")])
def test_a_failure_that_a_restart_repeats_ends_the_run_at_the_first(tmp_path, error):
    budget, attempts = budget_for(tmp_path, "fault_tolerance.max_failures=3")
    attempt_ends(attempts, endings.ERROR)
    with pytest.raises(BudgetSpent) as raised:
        budget.after_controller_state_update(RunningState(), RestartingState(WorkerGroupError("Traceback ...\n", {
            1: RuntimeError("a peer is gone"), 0: pickle.loads(pickle.dumps(error))})))
    assert str(raised.value) == str(error)


def test_spot_interruptions_spend_max_preemptions(tmp_path):
    budget, attempts = budget_for(tmp_path, "fault_tolerance.max_preemptions=1")
    attempt_ends(attempts, endings.NOTICE)
    budget.after_controller_state_update(RunningState(), FAILED)
    attempt_ends(attempts, endings.KILL)
    with pytest.raises(BudgetSpent, match=r"restarted 2 times after spot interruptions \(the last: it lost a "
                                              r"spot node\), over fault_tolerance.max_preemptions=1; raise it"):
        budget.after_controller_state_update(RunningState(), FAILED)


def test_a_start_again_after_ray_failed_to_replace_lost_workers_is_never_charged(tmp_path):
    """The node loss behind it is charged where its evidence is on record."""
    budget, attempts = budget_for(tmp_path, "fault_tolerance.max_failures=0", "fault_tolerance.max_preemptions=0")
    attempt_ends(attempts, endings.RESTARTED)
    attempt_ends(attempts, endings.RESIZE)
    assert failure_budget.charges(attempts, budget.since, 0) == failure_budget.Charges(0, 0, None)


def test_only_a_restart_is_charged(tmp_path):
    budget, attempts = budget_for(tmp_path, "fault_tolerance.max_failures=0")
    attempt_ends(attempts, endings.ERROR)
    budget.after_controller_state_update(FAILED, RunningState())  # the group runs again: nothing to charge


def test_a_kills_evidence_is_waited_for_where_it_decides(tmp_path, monkeypatch):
    budget, attempts = budget_for(tmp_path, "fault_tolerance.max_failures=0")
    monkeypatch.setattr(failure_budget, "KILL_EVIDENCE_WAIT_S", 30.0)
    attempt_id = attempt_ends(attempts, None)
    threading.Timer(1.5, endings.record, (attempts, attempt_id, endings.KILL, "node n (spot) lost")).start()
    started = time.monotonic()
    budget.after_controller_state_update(RunningState(), FAILED)  # a kill: the run goes on
    assert time.monotonic() - started >= 1.0

    monkeypatch.setattr(failure_budget, "KILL_EVIDENCE_WAIT_S", 0.0)
    attempt_ends(attempts, None)  # no evidence ever: unknown is not an interruption
    with pytest.raises(BudgetSpent, match="loss is nan"):
        budget.after_controller_state_update(RunningState(), FAILED)


def test_an_ending_that_cannot_decide_is_not_waited_for(tmp_path, monkeypatch):
    budget, attempts = budget_for(tmp_path)  # max_failures=3, max_preemptions=-1
    monkeypatch.setattr(failure_budget, "KILL_EVIDENCE_WAIT_S", 30.0)
    sleeps: list[float] = []
    monkeypatch.setattr(failure_budget.time, "sleep", sleeps.append)
    attempt_ends(attempts, None)
    budget.after_controller_state_update(RunningState(), FAILED)
    assert sleeps == []


def test_an_unreadable_ledger_charges_the_failure_budget(tmp_path):
    (tmp_path / "attempts").write_text("not a folder")
    budget, _ = budget_for(tmp_path, "fault_tolerance.max_failures=1")
    budget.after_controller_state_update(RunningState(), FAILED)
    with pytest.raises(BudgetSpent, match=r"^FloatingPointError: loss is nan \(and the run's ledger could not be "
                                          r"read: "):
        budget.after_controller_state_update(RunningState(), FAILED)
