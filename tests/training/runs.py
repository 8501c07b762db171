"""Training runs for tests: the loop on a bare gloo process group (seconds), summarised as ``spotray train`` does."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from spotray.config import TrainConfig
from spotray.drills.process_group import train_on_process_group
from spotray.driver import launch
from spotray.worker.attempt import run_root


def train_locally(cfg: TrainConfig) -> dict:
    """``scaling.num_workers`` CPU processes without Ray; the run's summary (per-step losses, audit)."""
    train_on_process_group(cfg.to_dict(), cfg.scaling.num_workers)
    task = launch.preflight(cfg)
    assert task is not None, "a script run has no task"
    return launch.summarize(cfg, len(task.open_dataset()), run_root(cfg))


def cli_env(**extra: str) -> dict[str, str]:
    """The shell of someone who installed spotray: its scripts on PATH, and a local Ray rather than any cluster
    (unless ``extra`` names one in ``RAY_ADDRESS``)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", **extra}
