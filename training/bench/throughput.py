"""``spotray bench throughput``: ``spotray train`` on Ray vs a bare torchrun DDP loop, same model/batch/steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from training import config, launch
from training.bench.common import bench_corpus, machine, new_workdir
from training.errors import SpotrayError


def _config(data_url: str, workdir: str, steps: int, name: str, preset: str, workers: int) -> config.TrainConfig:
    return config.load(None, [
        f"data.path={data_url}", f"checkpoint.path={workdir}/ckpt", f"run.name={name}",
        f"model.preset={preset}", "train.seq_len=256", "train.global_batch_size=8", f"train.max_steps={steps}",
        f"checkpoint.every_steps={steps}", f"train.log_every={steps}", f"scaling.num_workers={workers}",
    ])


def _bare_step_s(cfg: config.TrainConfig) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # what Ray gives a 1-CPU worker
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.scaling.num_workers}",
         "-m", "training.bench.bare_ddp", json.dumps(cfg.to_dict())],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SpotrayError(f"bare torchrun loop failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1])["step_s"]


def _spotray_step_s(cfg: config.TrainConfig) -> float:
    summary = launch.run(cfg)
    return cfg.train.global_batch_size * cfg.train.seq_len / summary["tokens_per_s"]


def run(steps: int = 20, rounds: int = 2, preset: str = "small", workers: int = 2) -> dict:
    workdir = new_workdir()
    data_url = bench_corpus(workdir)
    bare, spotray = [], []
    for i in range(rounds):  # interleaved, so drift on a noisy machine hits both sides alike
        cfg = _config(data_url, workdir, steps, f"throughput-{i}", preset, workers)
        bare.append(_bare_step_s(cfg))
        spotray.append(_spotray_step_s(cfg))
    return {
        "machine": machine(), "workers": workers, "model": preset, "seq_len": 256,
        "global_batch_size": 8, "steps": steps,
        "bare_torchrun_step_s": [round(s, 4) for s in bare],
        "spotray_ray_step_s": [round(s, 4) for s in spotray],
        "step_time_ratio": round(min(spotray) / min(bare), 3),
    }
