"""``spotray bench compile``: what ``train.compile``'s kept caches save a replacement worker. Per round, on a bare
process group (CPU; ``--gpu``: one GPU a rank, NCCL, bf16): an attempt compiling from nothing (an empty inductor
cache folder, no caches kept with the run) and the next attempt of the same run on a new node (another empty inductor
cache folder, the caches the first one kept); each timed from the attempt's start to the end of its first step. On
CPU inductor builds its C++ kernels again even from the caches, so the gain there is partial; on a GPU the caches
hold the compiled Triton kernels."""

from __future__ import annotations

import os
import statistics

from spotray import config
from spotray.accounts import goodput, ledger
from spotray.bench.common import bench_corpus, check_gpus, machine, scratch_dir
from spotray.drills.process_group import train_on_process_group
from spotray.worker.attempt import run_root

INDUCTOR_CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"


def run(preset: str = "small", rounds: int = 2, workers: int = 1, gpu: bool = False) -> dict:
    check_gpus(gpu, workers)
    with scratch_dir() as workdir:
        base = [f"data.path={bench_corpus(workdir)}", f"model.preset={preset}", f"train.seq_len={1024 if gpu else 128}",
                f"train.global_batch_size={4 * workers}", "train.max_steps=4", "train.compile=true",
                f"scaling.num_workers={workers}", "checkpoint.every_steps=100",
                *(["scaling.use_gpu=true", "train.dtype=bfloat16"] if gpu else [])]
        cold, replacement, from_cache = [], [], []
        before = os.environ.get(INDUCTOR_CACHE_DIR)
        try:
            for i in range(rounds):
                run = [*base, f"checkpoint.path={workdir}/ckpt-{i}", "run.name=compile"]
                first, _ = _first_step_s([*run, "train.stop_at_step=2"], f"{workdir}/inductor-{i}-first", attempt=0)
                cold.append(first)
                seconds, graphs = _first_step_s(run, f"{workdir}/inductor-{i}-new-node", attempt=1)
                replacement.append(seconds)
                from_cache.append(graphs)
        finally:
            if before is None:
                os.environ.pop(INDUCTOR_CACHE_DIR, None)
            else:
                os.environ[INDUCTOR_CACHE_DIR] = before
        return {"machine": machine(), "model": preset, "workers": workers, "gpu": gpu, "rounds": rounds,
                "cold_s": cold, "replacement_s": replacement, "graphs_from_cache": from_cache,
                "replacement_over_cold": round(min(replacement) / min(cold), 3),
                "replacement_over_cold_median": round(statistics.median(replacement) / statistics.median(cold), 3)}


def _first_step_s(overrides: list[str], inductor_dir: str, attempt: int) -> tuple[float, int]:
    """One attempt of the run, with ``inductor_dir`` as the node's inductor cache folder: seconds from its start to
    the end of its first step, and the graphs it took from the kept caches."""
    os.environ[INDUCTOR_CACHE_DIR] = inductor_dir  # the workers' environment is the bench's
    cfg = config.load(None, overrides)
    final = train_on_process_group(cfg.to_dict(), cfg.scaling.num_workers)
    attempts = ledger.attempts_root(run_root(cfg))
    status = goodput.read_status(attempts, ledger.read_attempts(attempts)[attempt].attempt_id) or {}
    return round(status["first_step_at"] - status["entered_at"], 2), final["graphs_from_compile_cache"]
