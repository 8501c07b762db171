"""The checkpoint interval (Young–Daly's formula, its bounds, ``every_steps: auto`` following measured saves) and the
preemption checks' cadence, and when a shrunk run grows back."""

import logging
import math
import time

import pytest

from spotray.drills.process_group import run_on_process_group
from spotray.worker.cadence import (
    CHECK_EVERY_S,
    UNMEASURED_EVERY_STEPS,
    UNMEASURED_SNAPSHOT_STEPS,
    CheckpointInterval,
    GrowBack,
    PreemptionChecks,
    SnapshotInterval,
    SnapshotSlowdown,
    interval_steps,
    snapshot_cost_s,
    young_daly_s,
)
from tests.training.configs import make_config


def test_young_daly_is_the_root_of_twice_the_save_time_the_mean_time_between_interruptions():
    assert young_daly_s(10, 3600) == pytest.approx(math.sqrt(72_000))  # 268 s: a 10 s save, one interruption/h
    assert young_daly_s(0, 3600) == 0
    assert young_daly_s(40, 3600) == pytest.approx(2 * young_daly_s(10, 3600))  # 4x the save: 2x the interval


@pytest.mark.parametrize(("save", "mtbi"), [(-1, 3600), (1, 0), (1, -5)])
def test_young_daly_refuses_a_negative_save_or_a_non_positive_mtbi(save, mtbi):
    with pytest.raises(ValueError):
        young_daly_s(save, mtbi)


def test_the_interval_in_steps_scales_with_the_interruption_rate_and_stays_in_its_bounds():
    assert interval_steps(10, 10, 1.0, 1.0, 10_000) == 268
    assert interval_steps(10, 10, 1.0, 4.0, 10_000) == 134  # 4x the interruptions: half the interval
    assert interval_steps(0.0001, 0.0001, 5.0, 1.0, 10_000) == 1  # at least one step
    assert interval_steps(600, 600, 0.01, 1.0, 500) == 500  # at most the run
    assert interval_steps(0.001, 30, 1.0, 60.0, 10_000) == 30  # an async save must finish before the next


GROW_AFTER_S = 30.0


def test_a_run_grows_back_once_the_whole_group_has_fit_at_every_look_for_the_settling_time():
    now, room = [0.0], [True]
    agreed = []
    def agree(value: bool) -> bool:
        agreed.append(value)
        return value

    grow = GrowBack(lambda: room[0], agree, rank=0, after_s=GROW_AFTER_S, clock=lambda: now[0])

    def look(at: float, fits: bool) -> bool:
        now[0], room[0] = at, fits
        return grow.due()

    assert not look(0.0, True) and not look(GROW_AFTER_S - 1, True)
    assert not look(GROW_AFTER_S + 1, False)  # the node went again: the wait starts over
    assert not look(GROW_AFTER_S + 2, True) and not look(2 * GROW_AFTER_S, True)
    assert look(2 * GROW_AFTER_S + 2, True)
    assert agreed == [False, False, False, False, False, True]  # every look is a collective, whatever rank 0 saw
    follower = GrowBack(lambda: pytest.fail("only rank 0 looks"), lambda value: True, rank=1, after_s=GROW_AFTER_S)
    assert follower.due()  # rank 0's answer


def test_a_fixed_interval_checkpoints_at_its_multiples_and_ignores_measurements():
    interval = CheckpointInterval(25, 1.0, 1000, start_step=30)
    assert [s for s in range(31, 101) if interval.due(s)] == [50, 75, 100]
    interval.checkpointed(50, 100.0, 100.0, 0.001)
    assert interval.steps == 25


NO_CHECKPOINTS = 10**9  # a checkpoint interval no snapshot interval comes near


def test_snapshots_under_auto_follow_young_daly_keep_their_blocking_time_under_two_percent_and_never_overlap(caplog):
    caplog.set_level(logging.INFO, "spotray.worker.cadence")
    interval = SnapshotInterval("auto", 36.0, start_step=100)  # one interruption every 100 s
    due = [s for s in range(101, 160) if interval.due(s, at_checkpoint_interval=False, checkpoint_every=NO_CHECKPOINTS)]
    assert due == list(range(100 + UNMEASURED_SNAPSHOT_STEPS, 160))
    interval.taken(150, cost_s=0.02, whole_s=0.05, step_s=0.1)  # Young–Daly: sqrt(2 x 0.02 x 100) = 2 s
    assert interval.steps == 20
    assert not interval.due(169, False, NO_CHECKPOINTS) and interval.due(170, False, NO_CHECKPOINTS)
    assert "snapshot interval: every 20 steps (was 50)" in caplog.text  # said when it changes, as a checkpoint's is
    caplog.clear()
    interval.taken(170, cost_s=0.02, whole_s=0.05, step_s=0.1)
    assert caplog.text == ""
    interval.taken(170, cost_s=0.0001, whole_s=0.001, step_s=0.1)  # 0.0001 / 0.02 = 0.005 s: Young–Daly wins
    assert interval.steps == 2  # sqrt(2 x 0.0001 x 100) = 0.14 s
    frequent = SnapshotInterval("auto", 3600.0, start_step=0)  # Young-Daly would snapshot every 0.45 s
    frequent.taken(10, cost_s=0.1, whole_s=0.2, step_s=1.0)
    assert frequent.steps == 5  # 0.1 / 0.02: the 2 % budget
    frequent.taken(15, cost_s=0.001, whole_s=9.0, step_s=1.0)
    assert frequent.steps == 9  # the upload takes 9 steps
    fixed = SnapshotInterval(4, 36.0, start_step=0)
    fixed.taken(4, cost_s=1.0, whole_s=1.0, step_s=0.001)
    assert [s for s in range(1, 13) if fixed.due(s, False, NO_CHECKPOINTS)] == [4, 8, 12]


def snapshot_steps(interval: SnapshotInterval, checkpoint_every: int, steps: int) -> list[int]:
    """The steps an attempt snapshots at, checkpointing at the multiples of ``checkpoint_every``, each snapshot a
    measured cost that keeps the interval."""
    taken = []
    for step in range(1, steps + 1):
        if interval.due(step, step % checkpoint_every == 0, checkpoint_every):
            taken.append(step)
            interval.taken(step, cost_s=0.88, whole_s=0.1, step_s=1.0)
    return taken


def test_a_checkpoints_step_is_kept_in_memory_too_where_the_snapshot_interval_fits_in_the_checkpoints():
    auto = SnapshotInterval("auto", 0.0, start_step=0)
    auto.taken(0, cost_s=0.88, whole_s=0.1, step_s=1.0)
    assert auto.steps == 44  # 0.88 s / 2 % of a 1 s step
    # Two snapshots to each checkpoint interval of 105 steps (105 // 44), the second with the checkpoint: no more
    # than 44 steps apart allow, and none between a checkpoint and the next snapshot closer than the interval.
    assert snapshot_steps(auto, 105, 315) == [53, 105, 158, 210, 263, 315]
    assert snapshot_steps(SnapshotInterval("auto", 0.0, start_step=0), 30, 300) == []  # every 30: none fit the budget
    assert snapshot_steps(SnapshotInterval(10, 0.0, start_step=0), 25, 50) == [10, 20, 25, 30, 40, 50]
    assert snapshot_steps(SnapshotInterval(40, 0.0, start_step=0), 25, 80) == [40, 80]  # longer: at its multiples
    assert snapshot_steps(SnapshotInterval(50, 0.0, start_step=0), 25, 100) == [50, 100]  # checkpoint steps among them


def test_a_snapshots_copy_costs_what_the_steps_it_overlaps_take_beyond_the_steps_that_overlap_no_write():
    slowdown = SnapshotSlowdown()
    slowdown.step(2.0, snapshot_copying=True, checkpoint_writing=False)  # no quiet step to measure against yet
    for seconds in (1.0, 1.2, 0.8):
        slowdown.step(seconds, snapshot_copying=False, checkpoint_writing=False)
    slowdown.step(5.0, snapshot_copying=False, checkpoint_writing=True)  # a checkpoint's write: counted nowhere
    slowdown.step(2.2, snapshot_copying=True, checkpoint_writing=False)
    slowdown.step(1.5, snapshot_copying=True, checkpoint_writing=False)
    assert slowdown.take() == (pytest.approx(1.2 + 0.5), True)
    assert slowdown.take() == (0.0, True)
    slowdown.step(2.2, snapshot_copying=True, checkpoint_writing=False)
    slowdown.step(3.0, snapshot_copying=True, checkpoint_writing=True)  # the two writes' cost cannot be told apart
    assert slowdown.take() == (pytest.approx(1.2 + 2.0), False)  # an upper bound
    slowdown.step(1.1, snapshot_copying=True, checkpoint_writing=False)
    assert slowdown.take() == (pytest.approx(0.1), True)


def test_a_cost_timed_beside_a_checkpoints_write_sets_the_interval_only_until_a_copy_is_timed_alone():
    interval = SnapshotInterval("auto", 0.0, start_step=0)
    interval.taken(50, cost_s=1.0, whole_s=0.1, step_s=1.0, alone=False)  # assumed: the first copy costs a step
    assert interval.steps == 50
    interval.taken(100, cost_s=2.0, whole_s=0.1, step_s=1.0, alone=False)  # beside a checkpoint's write
    assert interval.steps == 100
    interval.taken(150, cost_s=0.5, whole_s=0.1, step_s=1.0)
    assert interval.steps == 25
    interval.taken(175, cost_s=3.0, whole_s=0.1, step_s=1.0, alone=False)
    assert interval.steps == 25 and interval.last_step == 175


def test_until_a_copy_is_timed_it_counts_as_a_step_so_the_first_snapshot_waits_until_a_step_fits_the_budget():
    assert UNMEASURED_SNAPSHOT_STEPS == 50  # a step in 50: 2 %
    assert snapshot_cost_s(0.03, 0.0, 0.97, copy_timed=False) == pytest.approx(1.0)  # the attempt's first
    assert snapshot_cost_s(0.03, 0.93, 0.97, copy_timed=True) == pytest.approx(0.96)
    assert snapshot_cost_s(0.03, 0.0, 0.97, copy_timed=True) == pytest.approx(0.03)  # a copy that slowed no step
    interval = SnapshotInterval("auto", 1.0, start_step=0)  # the figures of a 2-core node's first snapshot
    interval.taken(50, snapshot_cost_s(0.031, 0.0, 0.955, copy_timed=False), whole_s=0.031, step_s=0.955)
    assert interval.steps == math.ceil(young_daly_s(0.986, 3600) / 0.955) == 89  # 16 from the blocking part alone


def test_an_attempts_first_untimed_snapshot_waits_its_steps_even_at_a_checkpoints_step():
    """Resumed at step 100 with checkpoints every 60: the checkpoint at 120 comes 20 steps in, too soon for a copy
    assumed to cost a step; the one at 180 is 80 steps in. Once one is taken, each checkpoint's step has one."""
    interval = SnapshotInterval("auto", 0.0, start_step=100)
    assert not interval.due(120, True, 60) and interval.due(180, True, 60)
    interval.taken(180, cost_s=1.0, whole_s=0.1, step_s=1.0, alone=False)
    assert interval.due(240, True, 60)
    assert SnapshotInterval(10, 0.0, start_step=100).due(120, True, 60)  # a fixed interval: the user's choice


def test_auto_starts_from_a_safe_default_and_follows_each_measured_save(caplog):
    caplog.set_level(logging.INFO, "spotray.worker.cadence")
    interval = CheckpointInterval("auto", 1.0, 10_000, start_step=120)  # resumed at step 120
    assert "until this attempt has timed a save" in caplog.text
    assert not interval.due(120 + UNMEASURED_EVERY_STEPS - 1) and interval.due(120 + UNMEASURED_EVERY_STEPS)
    interval.checkpointed(170, 10, 10, 1.0)
    assert interval.steps == 268 and not interval.due(170 + 267) and interval.due(170 + 268)
    assert "every 268 steps (was 50)" in caplog.text
    caplog.clear()
    interval.checkpointed(438, 10, 10, 1.0)
    assert caplog.text == ""  # logged only when it changes
    interval.checkpointed(706, 40, 40, 1.0)  # saves got 4x slower
    assert interval.steps == 537 and "every 537 steps (was 268)" in caplog.text


def _train_with_saves_slower_from(rank: int, world_size: int, config: dict, slow_from: int, extra_s: float) -> list:
    """A rank of the drill below: rank 1's saves get ``extra_s`` slower from step ``slow_from``; returns each
    checkpoint's step and the interval chosen after it."""
    from spotray.checkpoints.dcp import Checkpointer
    from spotray.drills.process_group import train_worker

    save, checkpointed, seen = Checkpointer.save, CheckpointInterval.checkpointed, []

    def slower_save(self, step, state, **options):
        if rank == 1 and step >= slow_from:
            time.sleep(extra_s)
        return save(self, step, state, **options)

    def record(self, step, *measured):
        checkpointed(self, step, *measured)
        seen.append((step, self.steps))

    Checkpointer.save = slower_save  # type: ignore[method-assign, assignment]  # patched in this rank's process
    CheckpointInterval.checkpointed = record  # type: ignore[method-assign]  # patched in this rank's process
    train_worker(rank, world_size, config)
    return seen


# Timing-sensitive on a loaded machine; the slowest rank's agreement it relies on is checked in make test by the
# preemption checks' process-group test below, and the interval's arithmetic by the unit tests above.
@pytest.mark.serial  # measures step and save times
@pytest.mark.e2e
def test_the_auto_interval_lengthens_on_every_rank_when_one_ranks_saves_get_slower(dataset_url, tmp_path):
    cfg = make_config(dataset_url, str(tmp_path), "auto", "train.max_steps=150", "checkpoint.every_steps=auto",
                      "fault_tolerance.expected_interruptions_per_hour=20000")
    seen = run_on_process_group(_train_with_saves_slower_from, (cfg.to_dict(), 90, 1.0), 2)
    steps = [step for step, _ in seen]
    assert steps[0] == UNMEASURED_EVERY_STEPS  # nothing measured before the first save
    assert all(later - earlier == interval for (earlier, interval), later in zip(seen, steps[1:], strict=False))
    fast = [interval for step, interval in seen if step < 90]
    slow = [interval for step, interval in seen if step >= 90]  # chosen after a slower save (maybe the run's last)
    assert fast and slow and min(slow) > 2 * max(fast), seen


def test_fixed_preemption_checks_ask_at_multiples_and_auto_ones_about_once_a_second():
    fixed = PreemptionChecks(4)
    assert [s for s in range(1, 14) if fixed.due(s)] == [4, 8, 12]
    fixed.checked(4, 0.001)
    assert fixed.steps == 4
    auto = PreemptionChecks("auto")
    assert auto.due(31)  # nothing timed yet: the first step asks
    auto.checked(31, 2.0)  # a step longer than CHECK_EVERY_S: every step
    assert auto.due(32)
    auto.checked(32, CHECK_EVERY_S / 40)
    assert not auto.due(32 + 39) and auto.due(32 + 40)


def _train_recording_preemption_checks(rank: int, world_size: int, config: dict, step_sleep_s: float) -> list:
    """A rank of the drill below, each step ``step_sleep_s`` longer; returns the steps at which each rank asked."""
    import torch.distributed as dist

    from spotray.drills.process_group import train_worker
    from spotray.worker.loop import _StepRunner

    step, checked, asked = _StepRunner.__call__, PreemptionChecks.checked, []

    def slow_step(self, batch):
        time.sleep(step_sleep_s)
        return step(self, batch)

    def record(self, at_step, step_s):
        asked.append(at_step)
        checked(self, at_step, step_s)

    _StepRunner.__call__ = slow_step  # type: ignore[method-assign]  # patched in this rank's process
    PreemptionChecks.checked = record  # type: ignore[method-assign]  # patched in this rank's process
    train_worker(rank, world_size, config)
    every_rank = [None] * world_size
    dist.all_gather_object(every_rank, asked)
    return every_rank


@pytest.mark.serial  # measures step and save times
@pytest.mark.e2e
def test_auto_preemption_checks_ask_at_the_same_steps_on_every_rank_about_once_a_second(dataset_url, tmp_path):
    cfg = make_config(dataset_url, str(tmp_path), "checks", "train.max_steps=150", "checkpoint.every_steps=1000",
                      "fault_tolerance.preemption_check_every_steps=auto")
    asked, on_rank_1 = run_on_process_group(_train_recording_preemption_checks, (cfg.to_dict(), 0.04), 2)
    assert asked == on_rank_1  # a check is a barrier: ranks asking at different steps would hang
    assert asked[0] == 1
    gaps = [b - a for a, b in zip(asked[2:], asked[3:], strict=False)]  # once steps are timed
    assert gaps and all(3 <= gap <= CHECK_EVERY_S / 0.04 for gap in gaps), asked


def _train_shrunk_with_slow_async_saves(rank: int, world_size: int, config: dict) -> dict:
    """A rank of the drill below: rank 1's background writes lag, so rank 0's save reaches its next collective
    while rank 1's main thread is already asking whether to grow."""
    from spotray.checkpoints.dcp import _CommittingWriter
    from spotray.drills.process_group import train_worker

    write = _CommittingWriter.write_data

    def lagging(self, plan, planner):
        if rank == 1:
            time.sleep(0.5)
        return write(self, plan, planner)

    _CommittingWriter.write_data = lagging  # type: ignore[method-assign]  # patched in this rank's process
    return train_worker(rank, world_size, config)


@pytest.mark.e2e
def test_a_shrunk_run_asks_whether_to_grow_while_an_async_save_runs_its_collectives(dataset_url, tmp_path):
    cfg = make_config(dataset_url, str(tmp_path), "grow-async", "train.max_steps=20", "checkpoint.every_steps=5",
                      "checkpoint.async=true", "scaling.num_workers=3", "scaling.min_workers=1")
    final = run_on_process_group(_train_shrunk_with_slow_async_saves, (cfg.to_dict(),), 2, timeout_s=120)
    assert final["final_step"] == 20 and final["failed_saves"] == 0
