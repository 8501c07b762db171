"""How the step loop treats the process it runs in."""

from __future__ import annotations

import gc
import importlib
import threading
import time

import pytest
import torch

from spotray.accounts import goodput
from spotray.checkpoints.dcp import Checkpointer
from spotray.snapshots.store import Snapshots
from spotray.storage import resolve
from spotray.worker import cadence, loop
from spotray.worker.attempt import WorkerEnv
from spotray.worker.loop import train
from tests.training.configs import make_config
from tests.training.records_outage import first_loss_log_write_fails
from tests.training.snapshots.holders import FakeHolder, snapshot_location

COUNTS_FROZEN_OBJECTS = """
import gc

from spotray.tasks.gpt import GPTTask


class CountsFrozen(GPTTask):
    seen = []

    def loss(self, model, batch):
        CountsFrozen.seen.append(gc.get_freeze_count())
        return super().loss(model, batch)


def make_task(cfg):
    return CountsFrozen(cfg)
"""


def test_what_the_process_held_before_the_first_step_stays_out_of_full_collections_until_the_loop_ends(
        dataset_url, tmp_path, monkeypatch):
    (tmp_path / "counts_frozen.py").write_text(COUNTS_FROZEN_OBJECTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "gc", "scaling.num_workers=1", "train.max_steps=3",
                      "model.task=counts_frozen:make_task")
    train(cfg, WorkerEnv(0, 1, torch.device("cpu"), lambda _: None))
    seen = importlib.import_module("counts_frozen").CountsFrozen.seen
    assert len(seen) >= 3 and min(seen) > 10_000  # torch's modules alone are more objects than that
    assert gc.get_freeze_count() == 0


def test_auto_snapshots_count_the_steps_their_copy_slowed_as_their_cost(dataset_url, tmp_path, monkeypatch):
    copying = threading.Event()

    class SlowCopy(FakeHolder):  # a copy that takes the CPUs from training: every step it overlaps is 1 s slower
        def put(self, path: str, data: bytes) -> None:
            copying.set()
            time.sleep(0.3)
            super().put(path, data)
            copying.clear()

    step, take, taken = loop._StepRunner.__call__, cadence.SnapshotSlowdown.take, cadence.SnapshotInterval.taken

    def slowed(runner, batch):
        time.sleep(1.0 if copying.is_set() else 0.03)
        return step(runner, batch)

    extras: list[float] = []
    costs: list[float] = []

    def counted(slowdown: cadence.SnapshotSlowdown) -> tuple[float, bool]:
        extra, alone = take(slowdown)
        extras.append(extra)
        return extra, alone

    def recorded(interval: cadence.SnapshotInterval, step: int, cost_s: float, whole_s: float, step_s: float,
                 alone: bool = True) -> None:
        costs.append(cost_s)
        taken(interval, step, cost_s, whole_s, step_s, alone=alone)

    monkeypatch.setattr(loop._StepRunner, "__call__", slowed)
    monkeypatch.setattr(cadence.SnapshotSlowdown, "take", counted)
    monkeypatch.setattr(cadence.SnapshotInterval, "taken", recorded)
    monkeypatch.setattr(cadence, "SNAPSHOT_BUDGET", 1.0)  # short intervals however long a loaded machine blocks
    monkeypatch.setattr(cadence, "UNMEASURED_SNAPSHOT_STEPS", 10)  # the first too
    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "slow", "scaling.num_workers=1", "train.max_steps=60",
                      "checkpoint.every_steps=1000", "snapshot.every_steps=auto",
                      "fault_tolerance.expected_interruptions_per_hour=36000")  # Young–Daly's term stays short too
    holders: list[FakeHolder] = [SlowCopy(f"n{i}") for i in range(2)]
    train(cfg, WorkerEnv(0, 1, torch.device("cpu"), lambda _: None, snapshot_root=snapshot_location(holders)))
    slowed_most = max(range(len(extras)), key=extras.__getitem__)
    assert extras[0] == 0 and extras[slowed_most] > 0.9, extras  # the first snapshot has no copy before it to count
    assert costs[slowed_most] > extras[slowed_most], (costs, extras)


STEP_6_SNAPSHOT = "run/checkpoints/step_000000006/COMMITTED.json"


def test_a_kill_just_after_a_checkpoint_resumes_from_the_snapshot_of_its_step_bitwise(dataset_url, tmp_path,
                                                                                     monkeypatch):
    """A checkpoint every 6 steps, a snapshot every 4: step 6's state goes to memory too, so the attempt killed at
    step 7 is resumed from it by the next, reading nothing from storage."""
    straight = train(make_config(dataset_url, str(tmp_path / "straight"), "kill", "scaling.num_workers=1",
                                 "train.max_steps=8", "snapshot.every_steps=0"),
                     WorkerEnv(0, 1, torch.device("cpu"), lambda _: None))
    step = loop._StepRunner.__call__
    steps: list[int] = []

    def killed_at_7(runner, batch):
        steps.append(len(steps) + 1)
        if len(steps) == 7:
            deadline = time.time() + 60
            while STEP_6_SNAPSHOT not in holder.files and time.time() < deadline:  # its copy runs in the background
                time.sleep(0.05)
            raise RuntimeError("the node is gone")
        return step(runner, batch)

    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "kill", "scaling.num_workers=1", "train.max_steps=8",
                      "checkpoint.every_steps=6", "snapshot.every_steps=4")
    holder = FakeHolder("n0")
    env = WorkerEnv(0, 1, torch.device("cpu"), lambda _: None, snapshot_root=snapshot_location([holder]))
    monkeypatch.setattr(loop._StepRunner, "__call__", killed_at_7)
    with pytest.raises(RuntimeError, match="the node is gone"):
        train(cfg, env)
    monkeypatch.setattr(loop._StepRunner, "__call__", step)
    resumed = train(cfg, env)
    second = goodput.attempt_records(resolve(str(tmp_path / "ckpt")).child("kill", "attempts"))[1]
    assert second.status_of("snapshot_restore_s") > 0 and second.status_of("restore_s") == 0
    assert resumed["param_sha256"] == straight["param_sha256"]


def test_a_snapshot_goes_with_each_checkpoint_of_the_interval_but_not_with_a_failed_saves_retries(dataset_url, tmp_path,
                                                                                                 monkeypatch):
    """A checkpoint every 8 steps and a snapshot every 4; saves retried at steps 9 to 11 (in an outage they come a
    step or two apart) take no snapshot with them."""
    snapshot_steps: list[int] = []
    save = Snapshots.save

    def recorded(snapshots: Snapshots, step: int, *args, **kwargs):
        snapshot_steps.append(step)
        return save(snapshots, step, *args, **kwargs)

    monkeypatch.setattr(Snapshots, "save", recorded)
    monkeypatch.setattr(Checkpointer, "retry_due", lambda _, step: step in (9, 10, 11))
    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "retries", "scaling.num_workers=1", "train.max_steps=17",
                      "checkpoint.every_steps=8", "snapshot.every_steps=4")
    holders = snapshot_location([FakeHolder("n0")])
    train(cfg, WorkerEnv(0, 1, torch.device("cpu"), lambda _: None, snapshot_root=holders))
    assert snapshot_steps == [4, 8, 12, 16]


def test_a_checkpoint_commits_only_once_the_records_of_its_steps_are_in_storage(dataset_url, tmp_path, monkeypatch):
    """The loss log's first write fails, and the writer rests a minute: the checkpoint after it waits for the log
    instead of committing steps that a kill would leave with no record."""
    commits = first_loss_log_write_fails(monkeypatch)
    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "records", "scaling.num_workers=1", "train.max_steps=6",
                      "checkpoint.every_steps=3", "train.log_every=3")
    train(cfg, WorkerEnv(0, 1, torch.device("cpu"), lambda _: None))
    assert [step for step, _ in commits] == [3, 6]
    assert all(logged >= step for step, logged in commits), commits
