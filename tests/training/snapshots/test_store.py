"""Snapshots kept with the checkpoints' commit rule: the newest one newer than every checkpoint is restored where it
reads back whole; a part lost with both its nodes, or damaged, sends the restore to storage with one line."""

from __future__ import annotations

import logging

import pytest
import torch

from spotray.accounts.ledger import RecordsUnwritten
from spotray.snapshots.store import Snapshots
from tests.training.checkpoints.test_dcp import Box
from tests.training.snapshots.holders import FakeHolder, snapshot_location


@pytest.fixture
def holders() -> list[FakeHolder]:
    return [FakeHolder(f"n{i}") for i in range(3)]


def snapshots_on(holders: list[FakeHolder]) -> Snapshots:
    return Snapshots(snapshot_location(holders), rank=0, world_size=1, attempt_id="a1")


def take(holders: list[FakeHolder], *steps: int) -> None:
    snapshots = snapshots_on(holders)
    for step in steps:
        snapshots.save(step, {"box": Box(float(step))})
    snapshots.close()
    assert snapshots.off is None


def test_the_newest_is_kept_and_restored_unless_a_checkpoint_is_newer(holders, caplog):
    with caplog.at_level(logging.INFO, logger="spotray"):
        take(holders, 10, 20)
    assert "retention: deleting snapshot step 10 (keep_last=1)" in caplog.messages  # not called a checkpoint
    snapshots = snapshots_on(holders)
    assert [c.step for c in snapshots.committed()] == [20]  # the older one is gone once the newer committed
    assert snapshots.as_new_as(21) is None
    newest = snapshots.as_new_as(20)  # a checkpoint of the same step: the snapshot holds it, and reads no storage
    box = Box(-1.0)
    assert newest is not None and snapshots.restore(newest, {"box": box}, per_rank_keys=())
    assert torch.equal(box.tensor, torch.full((64, 64), 20.0))


def test_a_node_lost_leaves_the_rings_copy(holders):
    take(holders, 10)
    holders[0].gone = True  # the writer's node; its next one holds the shard too
    snapshots = snapshots_on(holders)
    box, newest = Box(-1.0), snapshots.as_new_as(0)
    assert newest is not None and snapshots.restore(newest, {"box": box}, per_rank_keys=())
    assert torch.equal(box.tensor, torch.full((64, 64), 10.0))


def test_a_snapshot_cut_short_by_a_kill_is_passed_over_without_a_warning(holders, caplog):
    take(holders, 10)
    for holder in holders[:2]:  # the copy of step 20 was under way, its commit marker not yet written
        holder.files["run/checkpoints/step_000000020/__0_0.distcp"] = b"part of a shard"
    with caplog.at_level(logging.WARNING):
        newest = snapshots_on(holders).as_new_as(0)
    assert newest is not None and newest.step == 10
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # a kill mid-copy is no news


@pytest.mark.parametrize("lose", ["both copies", "damage"])
def test_a_snapshot_that_does_not_read_back_whole_sends_the_restore_to_storage_in_one_line(holders, caplog, lose):
    take(holders, 10)
    shard = "run/checkpoints/step_000000010/__0_0.distcp"
    if lose == "both copies":
        holders[0].gone = holders[1].gone = True
    else:
        for holder in holders[:2]:
            holder.files[shard] = holder.files[shard][:-1] + b"x"
    snapshots = snapshots_on(holders)
    newest = snapshots.as_new_as(0)
    assert newest is not None
    with caplog.at_level(logging.WARNING):
        assert not snapshots.restore(newest, {"box": Box(-1.0)}, per_rank_keys=())
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line.startswith("the snapshot of step 10 cannot be restored (") and line.endswith(
        "): restoring from storage instead"), line
    assert snapshots.as_new_as(0) is None  # dropped


def test_a_node_without_room_is_left_out_of_the_ring_with_one_warning_and_the_others_hold_two_copies(caplog):
    holders = [FakeHolder("n0", cap=1000), FakeHolder("n1"), FakeHolder("n2")]
    snapshots = snapshots_on(holders)  # this rank's node is n0
    with caplog.at_level(logging.WARNING):
        snapshots.save(10, {"box": Box(1.0)})
        snapshots.save(20, {"box": Box(2.0)})
        snapshots.close()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line.startswith("node n0 has no room for the snapshot of step 10 (") and "no room" in line, line
    assert line.endswith("it holds no snapshots from now on; its ranks' parts go to the next nodes")
    assert snapshots.off is None and holders[0].files == {}
    shard = "run/checkpoints/step_000000020/__0_0.distcp"
    assert shard in holders[1].files and shard in holders[2].files
    holders[1].gone = True  # either copy is enough
    newest, box = snapshots_on(holders).as_new_as(0), Box(-1.0)
    assert newest is not None and newest.step == 20 and snapshots_on(holders).restore(newest, {"box": box}, ())
    assert torch.equal(box.tensor, torch.full((64, 64), 2.0))


def test_a_storage_outage_skips_snapshots_with_one_warning_and_they_go_on_once_it_ends(holders, caplog):
    """A snapshot writes once the records of its steps are in storage; while they cannot be, it is skipped."""
    snapshots, out = snapshots_on(holders), {10, 20, 40}  # the steps whose records storage cannot take
    step = 0

    def records_first():
        storage_out = step in out  # as the save of ``step`` starts

        def written() -> None:
            if storage_out:
                raise RecordsUnwritten("the ledger's records of its steps could not be written to storage")
        return written

    snapshots.records_first = records_first
    with caplog.at_level(logging.WARNING):
        for step in (10, 20, 30, 40, 50):
            snapshots.save(step, {"box": Box(float(step))})
        snapshots.close()
    assert snapshots.off is None
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [line.split(" is skipped")[0] for line in skipped] == ["the snapshot of step 10", "the snapshot of step 40"]
    assert skipped[0].endswith("snapshots go on, each skipped until storage is back")
    assert snapshots_on(holders).as_new_as(50) is not None


@pytest.mark.parametrize("fault", ["no other node has room", "a holder is gone"])
def test_a_snapshot_that_fails_otherwise_turns_them_off_for_the_attempt_with_one_warning(caplog, fault):
    if fault == "a holder is gone":
        holders = [FakeHolder("n0"), FakeHolder("n1")]
        holders[1].gone = True
    else:
        holders = [FakeHolder("n0", cap=1000)]
    snapshots = snapshots_on(holders)
    with caplog.at_level(logging.WARNING):
        snapshots.save(10, {"box": Box(1.0)})
        snapshots.save(20, {"box": Box(2.0)})
        snapshots.close()
    assert snapshots.off is not None and snapshots.off.startswith("the snapshot of step 10 failed (")
    assert ("no room" if fault == "no other node has room" else "gone") in snapshots.off
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line.endswith("snapshots are off for this attempt; checkpoints go on")
    assert snapshots_on(holders).as_new_as(0) is None
