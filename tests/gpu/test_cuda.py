"""On a CUDA machine: the training loop on NCCL with bf16 autocast (DDP and FSDP2, a resume in between), the
device's peak FLOP/s for MFU, and ``spotray train`` on GPU workers. Skipped without CUDA; ``pytest -m gpu`` runs
them all in one call."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.training.configs import make_config
from training import launch
from training.drills.cluster import free_port
from training.loop import WorkerEnv, train
from training.telemetry import peak_flops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
GPU = ("scaling.use_gpu=true", "train.dtype=bfloat16")


def _train_on_nccl(rank: int, world_size: int, port: int, cfg, out: dict) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            device_id=device)
    try:
        final = train(cfg, WorkerEnv(rank, world_size, device, lambda metrics: None))
        if rank == 0:
            out.update(final)
    finally:
        dist.destroy_process_group()


def nccl_run(cfg) -> dict:
    """``training.loop.train`` on one process per GPU, without Ray; rank 0's final metrics."""
    world_size = torch.cuda.device_count()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_train_on_nccl, args=(world_size, free_port(), cfg, out), nprocs=world_size)
        return dict(out)


def gpu_config(dataset_url: str, ckpt: str, name: str, *overrides: str):
    workers = torch.cuda.device_count()
    return make_config(dataset_url, ckpt, name, *GPU, f"scaling.num_workers={workers}",
                       f"train.global_batch_size={12 * workers}", *overrides)


def test_the_device_has_a_known_peak_for_mfu():
    assert peak_flops(None, torch.device("cuda", 0)), f"add {torch.cuda.get_device_name(0)} to PEAK_TFLOPS"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_bf16_training_on_nccl_learns_and_a_resume_lands_where_a_straight_run_does(parallel, dataset_url, tmp_path):
    straight = nccl_run(gpu_config(dataset_url, str(tmp_path / "a"), "straight", f"parallel={parallel}"))
    assert straight["final_step"] == 40 and math.isfinite(straight["final_loss"])
    assert straight["final_loss"] < math.log(256)  # below a uniform guess over the byte vocabulary
    nccl_run(gpu_config(dataset_url, str(tmp_path / "b"), "resumed", f"parallel={parallel}",
                        "train.stop_at_step=20"))
    resumed = nccl_run(gpu_config(dataset_url, str(tmp_path / "b"), "resumed", f"parallel={parallel}"))
    assert resumed["final_step"] == 40 and resumed["samples_consumed"] == straight["samples_consumed"]
    assert resumed["final_loss"] == pytest.approx(straight["final_loss"], rel=0.02)


def test_spotray_train_runs_on_gpu_workers_with_nccl(dataset_url, tmp_path):
    summary = launch.run(gpu_config(dataset_url, str(tmp_path), "ray-gpu"), worker_logs=False)
    assert summary["final_step"] == 40 and summary["tokens_per_s"] > 0
    assert len(summary["checkpoints"]) >= 1
