"""The survivors' ``TorchConfig``: its backend has replica groups of one worker each (a ``DeveloperAPI`` of Ray
Train's), so that Ray replaces a lost worker alone and leaves the others running, and it leaves the process group to
spotray, which forms one per generation."""

from __future__ import annotations

from ray.train.backend import Backend
from ray.train.torch import TorchConfig

from spotray.config import TrainConfig


def keeps_survivors(cfg: TrainConfig) -> bool:
    """Whether the survivors of a lost node go on in their own processes: where the run may shrink, over gloo (an
    NCCL collective with a lost peer hangs until its watchdog ends the process, so NCCL restarts instead), and in
    spotray's loop (a user's script cannot be entered again)."""
    scaling = cfg.scaling
    return scaling.fewest_workers < scaling.num_workers and scaling.backend == "gloo" and not cfg.script.path


class _SurvivorsBackend(Backend):
    has_replica_groups = True


class SurvivorsTorchConfig(TorchConfig):
    @property
    def backend_cls(self):
        return _SurvivorsBackend
