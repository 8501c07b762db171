"""``train.compile``'s caches kept with the run, so that a restarted or replacement worker loads the graphs and kernels
an earlier attempt compiled instead of compiling them from nothing (``torch.compiler.save_cache_artifacts`` /
``load_cache_artifacts``). They are valid only for the same torch (and so Triton), device type, parallelism and
world size, which name the folder; each rank keeps its own, since FSDP's shards may differ in shape between ranks.
A cache that cannot be read or loaded costs a compile, never the run."""

from __future__ import annotations

import logging
import re

import torch

from spotray.config import TrainConfig
from spotray.errors import StorageError
from spotray.storage import Location
from spotray.worker.attempt import WorkerEnv

log = logging.getLogger(__name__)

CACHE_DIR = "compile-cache"


def cache_key(cfg: TrainConfig, env: WorkerEnv) -> str:
    """What makes the artifacts valid, as a folder name."""
    key = f"torch-{torch.__version__}-{env.device.type}-{cfg.parallel}-{env.world_size}-ranks"
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)


class CompileCache:
    """This rank's artifacts under the run: loaded before the model compiles, kept after the attempt's first step
    where nothing was loaded (a loaded cache already holds what that step compiled)."""

    def __init__(self, run_root: Location, cfg: TrainConfig, env: WorkerEnv):
        self.location = run_root.child(CACHE_DIR, cache_key(cfg, env), f"rank-{env.rank}.bin")
        self.rank = env.rank
        self.loaded = self.kept = False

    def load(self) -> None:
        try:
            data = self.location.read_bytes() if self.location.exists() else None
        except StorageError as exc:
            log.warning("compile caches not read (%s); compiling from nothing", exc)
            return
        if data is None:
            return
        try:
            torch.compiler.load_cache_artifacts(data)
        except Exception as exc:  # noqa: BLE001 - a damaged or foreign cache costs a compile, never the run
            log.warning("compile caches at %s not loaded (%s: %s); compiling from nothing", self.location.url,
                        type(exc).__name__, exc)
            return
        self.loaded = True
        if self.rank == 0:
            log.info("compile caches loaded from %s (%.1f MB)", self.location.url, len(data) / 1e6)

    @staticmethod
    def graphs_from_cache() -> int:
        """Compiled graphs (each forward and backward) this process took from the caches rather than compiling:
        inductor's graph cache hits, which count under DDP too, where AOT autograd's own cache is bypassed."""
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["fxgraph_cache_hit"])

    def keep(self) -> None:
        """Once, after the attempt's first step has compiled its graphs."""
        if self.kept or self.loaded:
            return
        self.kept = True
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None:
            return
        data, _ = artifacts
        try:
            self.location.write_bytes(data)
        except StorageError as exc:
            log.warning("compile caches not kept (%s); a restart compiles from nothing", exc)
            return
        if self.rank == 0:
            log.info("compile caches kept in %s (%.1f MB)", self.location.url, len(data) / 1e6)


__all__ = ["CACHE_DIR", "CompileCache", "cache_key"]
