"""Training runs for tests: the loop on a bare gloo process group (seconds), summarised as ``spotray train`` does."""

from __future__ import annotations

from spotray import launch
from spotray.config import TrainConfig
from spotray.drills.process_group import train_on_process_group
from spotray.loop import run_root


def train_locally(cfg: TrainConfig) -> dict:
    """``scaling.num_workers`` CPU processes without Ray; the run's summary (per-step losses, audit)."""
    train_on_process_group(cfg.to_dict(), cfg.scaling.num_workers)
    return launch.summarize(cfg, len(launch.preflight(cfg).open_dataset()), run_root(cfg))
