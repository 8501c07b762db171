"""On a CUDA machine, the built-in GPT: the loop on NCCL with bf16 autocast (DDP and FSDP2, a resume in between),
the device's peak FLOP/s for MFU, and ``spotray train`` through Ray on every visible GPU: DDP against FSDP2, an
exact resume, bf16 with ``torch.compile``. Skipped without CUDA; ``make gpu-test`` (``pytest -m gpu tests/gpu``)
runs them all in one call, with the Hugging Face model and the throughput bench beside them."""

from __future__ import annotations

import math

import pytest
import torch

from spotray.drills.process_group import train_on_process_group
from spotray.driver import launch
from spotray.worker.telemetry import peak_flops
from tests.gpu.configs import assert_learns, gpu_config, losses

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
FP32 = "train.dtype=float32"
# DDP against FSDP2 in float32: the same sums in another order (2e-4 on CPU, see tests/training/worker/test_resume.py),
# with headroom for the GPU's own reduction orders.
FP32_TOL = 1e-3
# bf16 (autocast for DDP, bf16 parameters for FSDP2) against float32, on the mean loss of the last 5 steps (~2.6).
BF16_TOL = 0.1


def nccl_run(cfg) -> dict:
    """``training.loop.train`` on one process per GPU, without Ray; rank 0's final metrics."""
    return train_on_process_group(cfg.to_dict(), torch.cuda.device_count())


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


@pytest.fixture(scope="module")
def straight(dataset_url, tmp_path_factory) -> dict:
    """40 float32 steps of ``spotray train`` through Ray, one NCCL worker per GPU, for each parallelism."""
    root = str(tmp_path_factory.mktemp("straight"))
    return {parallel: launch.run(gpu_config(dataset_url, root, parallel, f"parallel={parallel}", FP32),
                                 worker_logs=False) for parallel in ("ddp", "fsdp")}


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_spotray_train_learns_on_every_gpu_with_nccl(parallel, straight):
    summary = straight[parallel]
    assert_learns(summary)
    assert summary["samples_consumed"] == 40 * 12 * torch.cuda.device_count()
    assert summary["tokens_per_s"] > 0 and len(summary["checkpoints"]) == 4


def test_ddp_and_fsdp_losses_match_on_gpu(straight):
    ddp, fsdp = losses(straight["ddp"]), losses(straight["fsdp"])
    worst = max(abs(ddp[step] - fsdp[step]) for step in ddp)
    assert worst <= FP32_TOL, f"largest per-step loss difference {worst:.2e} > {FP32_TOL:.0e}"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_stop_at_20_and_resume_on_gpu_is_bitwise_identical(parallel, straight, dataset_url, tmp_path):
    def config(*more: str):
        return gpu_config(dataset_url, str(tmp_path), "resumed", f"parallel={parallel}", FP32, *more)

    reference = straight[parallel]
    first = launch.run(config("train.stop_at_step=20"), worker_logs=False)
    assert first["final_step"] == 20
    assert losses(first) == {step: losses(reference)[step] for step in range(1, 21)}, \
        "two identical GPU runs differ before any resume: a nondeterministic kernel, not the resume"
    resumed = launch.run(config(), worker_logs=False)
    assert resumed["final_step"] == 40
    assert losses(resumed) == losses(reference)  # exact, not approximately
    assert resumed["param_sha256"] == reference["param_sha256"]
    assert resumed["samples_consumed"] == reference["samples_consumed"]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_bf16_with_torch_compile_learns_the_float32_curve(parallel, straight, dataset_url, tmp_path):
    summary = launch.run(gpu_config(dataset_url, str(tmp_path), "compiled", f"parallel={parallel}",
                                    "train.compile=true"), worker_logs=False)
    assert_learns(summary)
    compiled, eager = losses(summary), losses(straight[parallel])
    tail = sum(compiled[step] - eager[step] for step in range(36, 41)) / 5
    assert abs(tail) <= BF16_TOL, f"bf16 + compile ends {tail:+.3f} from float32 eager"
