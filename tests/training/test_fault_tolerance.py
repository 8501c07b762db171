"""The fault-tolerance settings reach Ray Train, and a notice too short for a save is reported, not obeyed."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from tests.training.configs import make_config
from training import goodput, ledger
from training.checkpoint import Checkpointer, checkpoints_root, list_committed
from training.launch import failure_config
from training.loop import WorkerEnv, _survive_preemption
from training.storage import resolve
from training.telemetry import RankZeroTelemetry


@pytest.mark.parametrize(("failures", "preemptions"), [(0, -1), (-1, 0), (3, 7)])
def test_failures_and_preemptions_have_separate_budgets(failures, preemptions):
    cfg = make_config("/data", "/ckpt", "ft", f"fault_tolerance.max_failures={failures}",
                      f"fault_tolerance.max_preemptions={preemptions}")
    ray_config = failure_config(cfg)
    assert (ray_config.max_failures, ray_config.max_preemption_failures) == (failures, preemptions)


def test_spot_default_is_infinite_preemptions_and_a_few_real_failures():
    ray_config = failure_config(make_config("/data", "/ckpt", "ft"))
    assert ray_config.max_preemption_failures == -1 and ray_config.max_failures == 3


class Box:
    def state_dict(self) -> dict:
        return {"t": torch.ones(4)}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_a_deadline_too_short_for_a_save_is_logged_and_recorded_and_training_goes_on(tmp_path, caplog):
    root = resolve(str(tmp_path / "run"))
    checkpointer = Checkpointer(root, keep_last=3, async_save=False, rank=0, world_size=1)
    checkpointer.last_save_s = 10.0  # the last save took 10 s; the notice leaves 2
    attempts, info, writer = root.child("attempts"), ledger.AttemptInfo("a1", 0, 1, 4), ledger.RecordWriter()
    ledger.write_attempt(attempts, info)
    telemetry = RankZeroTelemetry(attempts_root=attempts, attempt=info, entered_at=time.time(), max_steps=100,
                                  tokens_per_step=512, flops_per_token=1e6, peak=None, run_name="ft", writer=writer)
    reports: list[dict] = []
    env = WorkerEnv(0, 1, torch.device("cpu"), reports.append)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        _survive_preemption(time.time() + 2.0, 7, checkpointer, {"box": Box()}, env, telemetry)
    assert time.monotonic() - started < 2.0, "it must not wait for the node to go"
    writer.close(timeout_s=10)
    assert "too short for a checkpoint" in caplog.text
    notice = goodput.read_status(attempts, "a1")["notice"]
    assert notice["step"] == 7 and notice["committed"] is False
    assert list_committed(checkpoints_root(root)) == [] and reports == []
