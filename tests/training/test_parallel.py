"""DDP wrapping on a real 2-process gloo group (no Ray)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spotray.parallel import parallelize
from spotray.ray_local import free_port


def _first_weights_after_wrapping(rank: int, port: int, sync_init: bool, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(rank)  # each rank starts from different weights
        model = parallelize(torch.nn.Linear(4, 4), [], "ddp", torch.device("cpu"), bf16=False, sync_init=sync_init)
        out[rank] = model.module.weight.detach().clone()
    finally:
        dist.destroy_process_group()


def _wrapped_weights(sync_init: bool) -> dict:
    # Spawned, not forked (Linux's default): a fork of this process, which may hold a Ray driver's gRPC channels,
    # leaves them unanswered (Ray's state API then blocks for good).
    with mp.get_context("spawn").Manager() as manager:
        out = manager.dict()
        mp.spawn(_first_weights_after_wrapping, args=(free_port(), sync_init, out), nprocs=2)
        return dict(out)


def test_ddp_broadcasts_rank_0s_weights_unless_a_checkpoint_will_overwrite_them():
    synced = _wrapped_weights(sync_init=True)
    assert torch.equal(synced[0], synced[1])
    resuming = _wrapped_weights(sync_init=False)  # no copy of the model over the network
    assert not torch.equal(resuming[0], resuming[1])
