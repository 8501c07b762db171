"""How the step loop treats the process it runs in."""

from __future__ import annotations

import gc
import importlib

import torch

from spotray.worker.attempt import WorkerEnv
from spotray.worker.loop import train
from tests.training.configs import make_config

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
