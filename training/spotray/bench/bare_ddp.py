"""A bare torchrun DDP loop — the baseline ``spotray bench throughput`` compares ``spotray train`` against.

Same task (model, data, loss), batch split and optimizer as spotray, with none of its machinery (no Ray, no
checkpoints, no ledger). Run as: torchrun --nproc_per_node N -m spotray.bench.bare_ddp CONFIG_JSON
With ``scaling.use_gpu`` it trains on one GPU per process over NCCL, under ``train.dtype`` autocast; with
``train.compile`` it compiles the same units; both as spotray does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from spotray.config import from_dict
from spotray.step.optim import build_optimizer
from spotray.step.sampler import ElasticSampler
from spotray.tasks.load import load_task


def main(config_json: str) -> None:
    cfg = from_dict(json.loads(config_json))
    gpu = cfg.scaling.use_gpu
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    task = load_task(cfg)
    dataset = task.open_dataset()
    with torch.device("meta"):
        model = task.build_model()
    model.to_empty(device=device)
    task.on_materialized(model)
    task.init_weights(model)
    if cfg.train.compile:
        for unit in task.shard_units(model):
            unit.compile()
    model = DistributedDataParallel(model, device_ids=[device.index] if gpu else None)
    bf16 = cfg.train.dtype == "bfloat16"
    optimizer = build_optimizer(model, cfg.train)
    sampler = ElasticSampler(len(dataset), cfg.train.global_batch_size, cfg.seed)
    seconds = 0.0
    for step in range(1, cfg.train.max_steps + 1):
        started = time.perf_counter()
        # The throughput bench's tasks (gpt, hf) read token shards: a tensor, not a dict of them.
        batch = cast(torch.Tensor, dataset.batch(sampler.next_batch(rank, world))).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, units = task.loss(model, batch)
        (loss / units).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if gpu:
            torch.cuda.synchronize()
        if step > 1:
            seconds += time.perf_counter() - started
    if rank == 0:
        print(json.dumps({"step_s": seconds / (cfg.train.max_steps - 1)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
