"""A batch is a tensor or a dict of tensors (a task's choice): moving and splitting either kind."""

from __future__ import annotations

import torch


def to_device(batch, device: torch.device):
    if isinstance(batch, dict):
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    return batch.to(device, non_blocking=True)


def split(batch, size: int) -> list:
    """Micro-batches along dim 0 of a tensor, or of every tensor of a dict batch."""
    if isinstance(batch, dict):
        columns = {k: v.split(size) for k, v in batch.items()}
        return [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]
    return list(batch.split(size))
