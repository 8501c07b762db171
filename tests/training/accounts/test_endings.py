"""Why each attempt ended, from hand-made ledgers: only the evidence decides, only spot endings are interruptions,
and the time between a stop (or a finish) and a rerun is not the run's."""

from __future__ import annotations

import json

import pytest

from spotray.accounts import endings, goodput
from spotray.storage import resolve
from tests.training.ledgers import write_attempt

STATUS = {"entered_at": 1010.0, "first_step_at": 1016.0, "last_seen": 1110.0, "step": 50}


@pytest.fixture
def root(tmp_path):
    attempts = resolve(str(tmp_path / "attempts"))
    attempts.child("run.json").write_text(json.dumps({"started_at": 1000.0}))
    return attempts


def recorded_kind(root, attempt_id: str) -> str | None:
    recorded = endings.read(root, attempt_id)
    return recorded["kind"] if recorded else None


def two_attempts(root, gap_s: float = 40.0) -> None:
    """a trains 1-50 and ends; b resumes from 50 ``gap_s`` later and trains to 60."""
    write_attempt(root, "a", 0, 50, STATUS)
    entered = STATUS["last_seen"] + gap_s
    write_attempt(root, "b", 50, 60, {"entered_at": entered, "first_step_at": entered + 5,
                                      "last_seen": entered + 15, "step": 60})


@pytest.mark.parametrize(("status", "finished", "recorded", "kind"), [
    ({"notice": {"step": 5, "at": 1.0, "committed": True}, "error": "x"}, True, {"kind": "stopped", "reason": "r"},
     "notice"),
    ({"error": "FloatingPointError: loss is nan"}, True, None, "error"),
    ({}, True, {"kind": "driver_lost", "reason": "r"}, "finished"),
    ({}, False, {"kind": "kill", "reason": "node n2 lost"}, "kill"),
    (None, False, None, "unknown"),
])
def test_the_attempts_own_records_come_first_then_the_drivers_then_unknown(status, finished, recorded, kind):
    ending = endings.of_attempt(status, finished, recorded)
    assert ending.kind == kind
    assert ending.spot == (kind in ("notice", "kill"))


@pytest.mark.parametrize(("capacity_type", "reason", "kind"), [
    ("spot", "UNEXPECTED_TERMINATION", "kill"), (None, "AUTOSCALER_DRAIN_PREEMPTED", "kill"),
    ("on-demand", "UNEXPECTED_TERMINATION", "node_lost"), (None, "UNEXPECTED_TERMINATION", "node_lost")])
def test_a_lost_node_is_a_spot_interruption_only_where_it_was_spot(capacity_type, reason, kind):
    assert endings.node_loss(capacity_type, reason) == kind


def test_without_evidence_an_ending_is_unknown_and_no_interruption(root):
    two_attempts(root)
    account = goodput.account(root)
    assert [e.kind for e in account.events] == ["unknown"] and account.interruptions == []
    assert account.seconds["waiting"] == 40.0  # a restart for an unknown reason: the run waited


def test_a_stop_then_a_rerun_is_a_pause_not_waiting_nor_an_interruption(root):
    two_attempts(root, gap_s=86_400.0)  # rerun a day later
    endings.record(root, "a", endings.STOPPED, "Ctrl-C")
    account = goodput.account(root)
    (stop,) = account.events
    assert (stop.kind, stop.reason, stop.spot, stop.recovery_s) == ("stopped", "Ctrl-C", False, None)
    assert account.paused_s == 86_400.0 and account.seconds["waiting"] == 0.0
    assert account.total_s == pytest.approx(110.0 + 15.0)  # a's 110 s since the start, then b's 15 s
    assert account.to_dict()["interruptions"] == 0


def test_a_finished_run_extended_by_a_rerun_is_a_pause(root):
    two_attempts(root, gap_s=600.0)
    root.child("a", "final.json").write_text(json.dumps({"final_step": 50}))
    account = goodput.account(root)
    assert [e.kind for e in account.events] == ["finished"] and account.paused_s == 600.0
    assert account.events[0].lost_steps_at_most == 0  # a finish wrote every record


def test_the_first_record_of_an_ending_wins(root):
    write_attempt(root, "a", 0, 50, STATUS)
    endings.record(root, "a", endings.KILL, "node n2 (spot) lost")
    endings.record(root, "a", endings.STOPPED, "Ctrl-C")  # the driver stopped after the node had gone
    assert recorded_kind(root, "a") == "kill"


@pytest.mark.parametrize(("later", "kind"), [(endings.KILL, "kill"), (endings.NODE_LOST, "node_lost"),
                                            (endings.STOPPED, "restarted")])
def test_a_node_loss_reported_after_a_start_again_replaces_it_as_the_attempts_ending(root, later, kind):
    """Ray Train may fail replacing lost workers before Ray says their node is dead."""
    write_attempt(root, "a", 0, 50, STATUS)
    endings.record(root, "a", endings.RESTARTED, endings.DESCRIPTIONS[endings.RESTARTED])
    endings.record(root, "a", later, "node n2 lost")
    assert recorded_kind(root, "a") == kind


def test_a_driver_that_never_recorded_its_end_was_lost_with_its_last_attempt(root):
    write_attempt(root, "a", 0, 50, STATUS)
    endings.driver_started(root, "a", {})  # the first driver that records itself: a ledger from before has no record
    assert recorded_kind(root, "a") is None
    endings.driver_started(root, "a", {})  # a rerun, and the first driver never ended
    assert recorded_kind(root, "a") == endings.DRIVER_LOST


def test_a_driver_that_ended_leaves_its_attempt_as_it_recorded_it(root):
    write_attempt(root, "a", 0, 50, STATUS)
    endings.driver_started(root, "a", {})
    endings.driver_ended(root, "a", endings.STOPPED, "SIGTERM")
    endings.driver_started(root, "a", {})
    assert recorded_kind(root, "a") == endings.STOPPED

