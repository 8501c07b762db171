"""What the GPU tests share: configs over every visible GPU, loss-curve checks, and where results go."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from spotray.config import TrainConfig
from tests.training.configs import make_config

GPU = ("scaling.use_gpu=true", "train.dtype=bfloat16")


def gpu_config(dataset_url: str, ckpt: str, name: str, *overrides: str) -> TrainConfig:
    """``make_config``'s tiny run (bf16 unless overridden) with one worker per visible GPU, 12 samples each."""
    workers = torch.cuda.device_count()
    return make_config(dataset_url, ckpt, name, *GPU, f"scaling.num_workers={workers}",
                       f"train.global_batch_size={12 * workers}", *overrides)


def losses(summary: dict) -> dict[int, float]:
    return {int(k): v for k, v in summary["losses"].items()}


def assert_learns(summary: dict, steps: int = 40) -> None:
    """Every step's loss finite, and the last 5 well below the first 5 (about 5.3 -> 2.6 on CPU)."""
    curve = losses(summary)
    assert summary["final_step"] == steps and sorted(curve) == list(range(1, steps + 1))
    assert all(math.isfinite(v) for v in curve.values()), curve
    first, last = (sum(curve[s] for s in window) / 5 for window in (range(1, 6), range(steps - 4, steps + 1)))
    assert last < first - 1.0, f"no learning: first 5 steps {first:.3f}, last 5 {last:.3f}"


def results_dir() -> Path:
    """``$SPOTRAY_GPU_RESULTS`` (default ``gpu-results/``): JSON results to copy into BENCHMARKS.md."""
    path = Path(os.environ.get("SPOTRAY_GPU_RESULTS", "gpu-results"))
    path.mkdir(parents=True, exist_ok=True)
    return path
