"""DDP and FSDP wrapping on a real 2-process gloo group (no Ray)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

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


def _shards_of_a_second_generation_with_the_ranks_swapped(rank: int, world_size: int, store_path: str) -> tuple:
    """FSDP wraps a model in the group it was given, then (as a survivor does for its next generation) in a new group
    of the same size in which the two processes swapped ranks; what each process then holds, with its new rank."""
    parallelize(_seeded_model(), [], "fsdp", torch.device("cpu"), bf16=False)
    dist.destroy_process_group()
    swapped = world_size - 1 - rank
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=swapped, world_size=world_size)
    model = parallelize(_seeded_model(), [], "fsdp", torch.device("cpu"), bf16=False)
    parts = [p for p in model.parameters() if isinstance(p, DTensor)]
    return dist.get_rank(), [(p.device_mesh.get_coordinate(), p.to_local().tolist()) for p in parts]


def _seeded_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 4)


def test_fsdp_in_a_new_group_of_the_same_size_holds_the_part_of_its_new_rank(tmp_path):
    new_rank, held = run_on_process_group(_shards_of_a_second_generation_with_the_ranks_swapped,
                                          (str(tmp_path / "store"),), world_size=2)
    assert new_rank == 1  # the process that was rank 0
    full = list(_seeded_model().parameters())
    for (coordinate, part), whole in zip(held, full, strict=True):
        assert coordinate == (1,)
        assert part == whole.detach().chunk(2)[1].tolist()
