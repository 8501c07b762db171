"""Training runs for tests: the loop on a bare gloo process group (seconds), summarised as ``spotray train`` does."""

from __future__ import annotations

from training import launch
from training.config import TrainConfig
from training.drills.process_group import train_on_process_group
from training.loop import run_root


def train_locally(cfg: TrainConfig) -> dict:
    """``scaling.num_workers`` CPU processes without Ray; the run's summary (per-step losses, audit)."""
    train_on_process_group(cfg.to_dict(), cfg.scaling.num_workers)
    return launch.summarize(cfg, len(launch.preflight(cfg).open_dataset()), run_root(cfg))
