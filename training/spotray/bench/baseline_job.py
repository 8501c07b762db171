"""The usual Ray Train recipe, as the recovery benchmark's baseline (same model and optimizer as spotray, so that
only the checkpoint and resume recipe differs): DDP via ``prepare_model``, rank 0
``torch.save``s model + optimizer into a temp dir reported as a Ray checkpoint (Ray copies it to storage), and
every rank ``torch.load``s it from ``ray.train.get_checkpoint()`` after a restart.

Run as ``python -m spotray.bench.baseline_job '<json>'`` against the cluster at RAY_ADDRESS."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import ray
import ray.train
import torch
import torch.nn.functional as F
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from spotray.config import from_dict
from spotray.data.dataset import TokenDataset
from spotray.step.optim import build_optimizer
from spotray.storage import resolve
from spotray.tasks.gpt_model import GPT, GPTShape


def train_fn(job: dict) -> None:
    entered_at = time.time()
    cfg = from_dict(job["train"])
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(cfg.seed)
    dataset = TokenDataset.open(cfg.data.path, cfg.train.seq_len)
    model = ray.train.torch.prepare_model(GPT(GPTShape.from_config(cfg.model, dataset.vocab_size, cfg.train.seq_len)))
    optimizer = build_optimizer(model, cfg.train)  # spotray's, so that only the recovery recipe differs
    start, resumed = 0, ray.train.get_checkpoint()
    if resumed:
        with resumed.as_directory() as directory:
            state = torch.load(Path(directory) / "state.pt", weights_only=True)
        _unwrapped(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        start = state["step"]
    per_rank = cfg.per_worker_batch(cfg.scaling.num_workers)
    every = cfg.checkpoint.every_steps
    assert isinstance(every, int), "the recovery bench sets a step count, not auto"
    for step in range(start + 1, cfg.train.max_steps + 1):
        first = (step * cfg.train.global_batch_size + rank * per_rank) % (len(dataset) - per_rank)
        batch = dataset.batch(list(range(first, first + per_rank)))
        logits = model(batch[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            first_step = step == start + 1
            _record(job["progress"], step=step, attempt_start=(start, entered_at, time.time()) if first_step else None)
        if step % every == 0:
            with tempfile.TemporaryDirectory() as tmp:
                checkpoint = None
                if rank == 0:
                    torch.save({"model": _unwrapped(model).state_dict(), "optim": optimizer.state_dict(), "step": step},
                               Path(tmp) / "state.pt")
                    checkpoint = Checkpoint.from_directory(tmp)
                ray.train.report({"step": step}, checkpoint=checkpoint)
            if rank == 0:
                _record(job["progress"], checkpointed=step)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside the DistributedDataParallel wrapper of ``prepare_model``."""
    return cast(torch.nn.Module, model.module)


def _record(path: str, step: int | None = None, checkpointed: int | None = None,
            attempt_start: tuple[int, float, float] | None = None) -> None:
    """Rank 0's progress file, read by the benchmark harness: each attempt's (resumed-from step, train function
    entered, first step ended)."""
    file = Path(path)
    current = json.loads(file.read_text()) if file.exists() else {"attempts": []}
    current.update({k: v for k, v in (("step", step), ("checkpointed", checkpointed)) if v is not None})
    if attempt_start:
        current["attempts"].append(attempt_start)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(current))
    tmp.replace(file)


def main(job: dict) -> None:
    cfg = from_dict(job["train"])
    storage = resolve(job["storage"], cfg.storage.options())
    ray.init()
    TorchTrainer(
        train_fn, train_loop_config=job,
        scaling_config=ScalingConfig(num_workers=cfg.scaling.num_workers),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=cfg.run.name, storage_path=storage.path, storage_filesystem=storage.fs,
                             failure_config=FailureConfig(max_failures=cfg.fault_tolerance.max_failures)),
    ).fit()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
