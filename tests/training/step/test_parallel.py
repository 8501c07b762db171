"""DDP wrapping on a real 2-process gloo group (no Ray)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from spotray.drills.process_group import run_on_process_group
from spotray.step.parallel import parallelize


def _first_weights_after_wrapping(rank: int, world_size: int, sync_init: bool) -> list[list]:
    """Every rank's weights right after wrapping, each rank having started from its own (as lists: a tensor would
    travel to the caller by a file descriptor of a rank that has exited)."""
    torch.manual_seed(rank)
    model = parallelize(torch.nn.Linear(4, 4), [], "ddp", torch.device("cpu"), bf16=False, sync_init=sync_init)
    wrapped = model.module  # DDP's
    assert isinstance(wrapped, torch.nn.Linear)
    weights = [torch.empty_like(wrapped.weight) for _ in range(world_size)]
    dist.all_gather(weights, wrapped.weight.detach())
    return [w.tolist() for w in weights]


def test_ddp_broadcasts_rank_0s_weights_unless_a_checkpoint_will_overwrite_them():
    synced = run_on_process_group(_first_weights_after_wrapping, (True,), world_size=2)
    assert synced[0] == synced[1]
    resuming = run_on_process_group(_first_weights_after_wrapping, (False,), world_size=2)  # no copy over the network
    assert resuming[0] != resuming[1]
