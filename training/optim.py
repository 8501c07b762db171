"""AdamW with decoupled weight decay on matrices only, and a cosine schedule with linear warm-up."""

from __future__ import annotations

import math

import torch

from training.config import TrainSection


def build_optimizer(model: torch.nn.Module, train: TrainSection) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train.lr, betas=(0.9, 0.95), eps=1e-8)


def lr_factor(step: int, train: TrainSection) -> float:
    """Multiplier of train.lr for optimizer step ``step`` (0-based)."""
    if step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    span = max(1, train.max_steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / span)
    return train.min_lr_ratio + (1 - train.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainSection) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, train))
