"""How the step loop treats the process it runs in."""

from __future__ import annotations

import gc
import importlib
import logging
import re
import threading
import time

import torch

from spotray.worker import loop
from spotray.worker.attempt import WorkerEnv
from spotray.worker.loop import train
from tests.training.configs import make_config
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


def test_auto_snapshots_count_the_steps_their_copy_slowed_as_their_cost(dataset_url, tmp_path, monkeypatch, caplog):
    copying = threading.Event()

    class SlowCopy(FakeHolder):  # a copy that takes the CPUs from training: every step it overlaps is 0.2 s slower
        def put(self, path: str, data: bytes) -> None:
            copying.set()
            time.sleep(0.3)
            super().put(path, data)
            copying.clear()

    step = loop._StepRunner.__call__

    def slowed(runner, batch):
        time.sleep(0.2 if copying.is_set() else 0.03)
        return step(runner, batch)

    monkeypatch.setattr(loop._StepRunner, "__call__", slowed)
    caplog.set_level(logging.INFO, "spotray.worker.cadence")
    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "slow", "scaling.num_workers=1", "train.max_steps=100",
                      "checkpoint.every_steps=1000", "snapshot.every_steps=auto",
                      "fault_tolerance.expected_interruptions_per_hour=36000")  # the 2 % budget decides, not the rate
    holders: list[FakeHolder] = [SlowCopy(f"n{i}") for i in range(2)]
    train(cfg, WorkerEnv(0, 1, torch.device("cpu"), lambda _: None, snapshot_root=snapshot_location(holders)))
    costs = [float(c) for c in re.findall(r"a snapshot costs training ([\d.]+) s", caplog.text)]
    assert len(costs) >= 2, caplog.text  # the first from its blocking part alone, the next with the copy's steps
    assert costs[0] < 0.2 and costs[1] > 0.4, costs
