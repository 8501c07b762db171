"""Wrap a model for data parallelism: DDP, or FSDP2 ``fully_shard`` per block (the task's shard units), then the
root."""

from __future__ import annotations

import contextlib
import itertools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

# A survivor (``spotray.survivors``) wraps a new model in the same process for each generation of the process group.
# DTensor's sharding caches match meshes by equality, so a mesh equal to an earlier generation's (the same size) would
# hand the new parameters that mesh, and with it this process's rank in that generation: each mesh is named anew.
_MESH_NAMES = (f"data{n}" for n in itertools.count())


def parallelize(model: torch.nn.Module, units: list[torch.nn.Module], mode: str, device: torch.device, bf16: bool,
                sync_init: bool = True) -> torch.nn.Module:
    """``sync_init=False`` when a checkpoint will overwrite the weights on every rank: DDP then skips broadcasting
    rank 0's parameters, a full copy of the model over the network."""
    if not dist.is_initialized() or dist.get_world_size() == 1 and mode == "ddp":
        return model.to(device)
    if mode == "ddp":
        model = model.to(device)
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       init_sync=sync_init)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=(next(_MESH_NAMES),))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
              else MixedPrecisionPolicy())  # without bf16: fully_shard's default
    model = model.to(device)
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def gradient_sync(model: torch.nn.Module, enabled: bool):
    """Context for one micro-batch: skip the gradient all-reduce on all but the last one."""
    if isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext() if enabled else model.no_sync()
    if isinstance(model, FSDPModule):  # what fully_shard made of the root
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()
