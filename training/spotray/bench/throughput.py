"""``spotray bench throughput``: ``spotray train`` on Ray vs a bare torchrun DDP loop, same model/batch/steps.

``--gpu``: one GPU per worker (NCCL, bf16 autocast, ``torch.compile``) on both sides, with sequences of 1024 tokens,
and spotray's tokens/s as MFU against the device's bf16 peak."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import torch

from spotray import config
from spotray.bench.common import bench_corpus, check_gpus, machine, random_token_corpus, scratch_dir
from spotray.data.dataset import TokenDataset
from spotray.driver import launch
from spotray.errors import SpotrayError
from spotray.tasks.load import load_task
from spotray.worker.telemetry import model_flops_utilization, peak_flops

GPU_BATCH_PER_WORKER = 64  # sequences per GPU and step: llm.c's GPT-2 124M shape (-b 64 -t 1024)
GPU_SEQ_LEN = 1024  # 16 x 256 tokens kept an H100 at 6 % MFU: launch-bound, not a measure of the loop
_RANK_ERROR = re.compile(r"^\[rank\d+\]: [\w.]*(Error|Exception)\b")
_CPP_EXCEPTION = re.compile(r"^\s*what\(\):")  # after libstdc++'s "terminate called after throwing ..."
_ABORTED = re.compile(r"^terminate called|failed \(exitcode: -6\)", re.MULTILINE)  # a rank's SIGABRT
BARE_OUTPUT_LINES = 40
# A rank that aborted on a C++ exception (CI saw one: gloo's transport throws on a lost connection) is run once more.
BARE_TRIES = 2


def _config(data_url: str, workdir: str, steps: int, name: str, preset: str, workers: int,
            gpu: bool = False, hf_config: str | None = None, overrides: tuple[str, ...] = ()) -> config.TrainConfig:
    batch, seq_len = (GPU_BATCH_PER_WORKER * workers, GPU_SEQ_LEN) if gpu else (8, 256)
    model = {"hf": {"config": json.loads(hf_config) if hf_config.lstrip().startswith("{") else hf_config}} \
        if hf_config else None
    return config.load(None, [
        f"data.path={data_url}", f"checkpoint.path={workdir}/ckpt", f"run.name={name}",
        f"model.preset={preset}", f"train.seq_len={seq_len}", f"train.global_batch_size={batch}",
        f"train.max_steps={steps}",
        f"checkpoint.every_steps={steps}", f"train.log_every={steps}", f"scaling.num_workers={workers}",
        *(["scaling.use_gpu=true", "train.dtype=bfloat16", "train.compile=true"] if gpu else []), *overrides,
    ], base={"model": model} if model else None)


def _bare_step_s(cfg: config.TrainConfig) -> float:
    for tries_left in reversed(range(BARE_TRIES)):
        proc = _run_bare(cfg)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode == 0 and lines:
            return json.loads(lines[-1])["step_s"]
        if not (tries_left and _ABORTED.search(proc.stderr)):
            break
        print(f"bench: a rank of the bare torchrun loop aborted ({_rank_error(proc.stderr)[0]}): running it once more",
              file=sys.stderr)
    tail = "\n".join(proc.stderr.splitlines()[-BARE_OUTPUT_LINES:])
    print(f"bench: torchrun's output ends:\n{tail}", file=sys.stderr)
    raise SpotrayError(f"bare torchrun loop failed (exit {proc.returncode}): {_rank_error(proc.stderr)}")


def _run_bare(cfg: config.TrainConfig) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # what Ray gives a 1-CPU worker
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={cfg.scaling.num_workers}", "-m", "spotray.bench.bare_ddp", json.dumps(cfg.to_dict())],
        capture_output=True, text=True, env=env, timeout=1800,
    )


def _rank_error(stderr: str) -> list[str]:
    """A rank's own exception line (or the C++ exception it aborted on), not torchrun's ChildFailedError banner that
    follows it."""
    lines = stderr.splitlines()
    errors = ([line for line in lines if _RANK_ERROR.match(line) or _CPP_EXCEPTION.match(line)]
              or [line for line in lines if "Error" in line])
    return [line.strip() for line in (errors or lines)[-1:]]


def _spotray_step_s(cfg: config.TrainConfig) -> float:
    summary = launch.run(cfg)
    return cfg.train.global_batch_size * cfg.train.seq_len / summary["tokens_per_s"]


def _mfu(cfg: config.TrainConfig, tokens_per_s: float) -> float | None:
    """Model FLOPs utilisation of all workers; None where the device's peak is unknown (CPUs)."""
    peak = peak_flops(cfg.train.peak_tflops, torch.device("cuda", 0)) if cfg.scaling.use_gpu else None
    if not peak:
        return None
    task = load_task(cfg)
    with torch.device("meta"):
        flops_per_token = task.flops_per_unit(task.build_model())
    return model_flops_utilization(tokens_per_s, flops_per_token, peak * cfg.scaling.num_workers)


def _hf_name(cfg: config.TrainConfig) -> str:
    from spotray.tasks.hf_causal_lm import HFTask  # the task load_task builds for model.kind hf

    return f"hf:{HFTask(cfg).config.model_type}"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def run(steps: int = 20, rounds: int = 2, preset: str = "small", workers: int = 2, gpu: bool = False,
        hf_config: str | None = None, overrides: tuple[str, ...] = (), vocab_size: int | None = None) -> dict:
    """``vocab_size``: train on random ids below it (GPT-2's 50,257) instead of the byte-level text corpus;
    ``hf_config``: a Transformers config (a config.json URL, or the JSON itself) to benchmark instead of
    ``preset``; ``overrides``: ``--set`` config overrides, which the bare loop ignores where it has no such feature
    (``snapshot.every_steps``: spotray's snapshots against a loop without them)."""
    check_gpus(gpu, workers)
    with scratch_dir() as workdir:
        data_url = random_token_corpus(workdir, vocab_size) if vocab_size else bench_corpus(workdir)
        bare, spotray = [], []
        for i in range(rounds):  # interleaved, so drift on a noisy machine hits both sides alike
            cfg = _config(data_url, workdir, steps, f"throughput-{i}", preset, workers, gpu, hf_config, overrides)
            bare.append(_bare_step_s(cfg))
            spotray.append(_spotray_step_s(cfg))
        tokens_per_s = cfg.train.global_batch_size * cfg.train.seq_len / min(spotray)
        return {
            "machine": machine(), "workers": workers, "seq_len": cfg.train.seq_len,
            "model": preset if hf_config is None else _hf_name(cfg),
            "vocab_size": TokenDataset.open(data_url, cfg.train.seq_len).vocab_size,
            "global_batch_size": cfg.train.global_batch_size, "steps": steps, "gpu": gpu, "dtype": cfg.train.dtype,
            "overrides": list(overrides),
            "bare_torchrun_step_s": [round(s, 4) for s in bare],
            "spotray_ray_step_s": [round(s, 4) for s in spotray],
            "step_time_ratio": round(min(spotray) / min(bare), 3),
            "spotray_tokens_per_s": round(tokens_per_s, 1),
            "mfu": _round(_mfu(cfg, tokens_per_s), 4),
        }
