"""Each rank's memory figures, their gathering into the ledger, and the one line a rank that runs out of memory
leaves."""

from __future__ import annotations

import pytest
import torch

from spotray.accounts import goodput, ledger
from spotray.errors import OutOfMemory
from spotray.worker import memory
from spotray.worker.attempt import WorkerEnv, run_root
from spotray.worker.loop import train
from tests.training.configs import make_config

RUNS_OUT_AT_STEP_3 = """
import torch

from spotray.tasks.gpt import GPTTask


class RunsOut(GPTTask):
    calls = 0

    def loss(self, model, batch):
        RunsOut.calls += 1
        if RunsOut.calls == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().loss(model, batch)


def make_task(cfg):
    return RunsOut(cfg)
"""


def test_this_ranks_figures_are_positive_and_cuda_ones_absent_on_cpu():
    figures = memory.this_rank(torch.device("cpu"))
    rss, peak_rss = figures["rss_bytes"], figures["peak_rss_bytes"]
    assert rss is not None and peak_rss is not None
    assert 0 < rss <= peak_rss
    assert figures["cuda_allocated_peak_bytes"] is None and figures["cuda_reserved_peak_bytes"] is None
    assert memory.all_ranks(torch.device("cpu"))["cuda_reserved_peak_bytes"] is None  # without a process group


def test_the_peak_is_never_below_the_rss_read_with_it(monkeypatch):
    """Another thread may allocate between the two reads: the status must not show a peak below the RSS."""
    monkeypatch.setattr(memory, "_current_rss", lambda: 1 << 50)
    figures = memory.this_rank(torch.device("cpu"))
    assert figures["rss_bytes"] == figures["peak_rss_bytes"] == 1 << 50


def test_highest_names_the_rank_with_each_kinds_largest_figure():
    records = [{"rss_bytes": [5, 9], "peak_rss_bytes": [7, 9], "cuda_allocated_peak_bytes": None},
               {"rss_bytes": [11, 3], "peak_rss_bytes": [12, 9], "cuda_allocated_peak_bytes": None}]
    peaks = memory.highest(records)
    assert peaks is not None
    assert peaks["rss_bytes"] == {"max": 11, "rank": 0} and peaks["peak_rss_bytes"] == {"max": 12, "rank": 0}
    assert peaks["cuda_allocated_peak_bytes"] is None and memory.highest([]) is None


def test_a_rank_out_of_memory_ends_with_one_line_naming_it_and_its_figures(dataset_url, tmp_path, monkeypatch):
    (tmp_path / "runs_out.py").write_text(RUNS_OUT_AT_STEP_3)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = make_config(dataset_url, str(tmp_path / "ckpt"), "oom", "scaling.num_workers=1", "train.log_every=1",
                      "model.task=runs_out:make_task")
    with pytest.raises(OutOfMemory) as failed:
        train(cfg, WorkerEnv(0, 1, torch.device("cpu"), lambda _: None))
    line = str(failed.value)
    assert "\n" not in line and line.startswith("rank 0 ran out of memory (host RSS ") and "GiB" in line
    attempts = run_root(cfg).child("attempts")
    [attempt] = ledger.read_attempts(attempts)
    status = goodput.read_status(attempts, attempt.attempt_id)
    assert status is not None and status["error"].startswith("OutOfMemory: rank 0 ran out")
    intervals = ledger.read_intervals(attempts, attempt.attempt_id)
    assert sorted(intervals) == [1, 2] and intervals[2]["memory"]["rss_bytes"][0] > 0  # the steps before it
