"""Validation during training: the same held-out samples every time, whatever the world size, with no effect on
training (eval mode, no gradients, no RNG draws, FSDP2 parameters resharded afterwards)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from spotray.config import TrainConfig
from spotray.errors import ConfigError
from spotray.step.batches import to_device
from spotray.tasks import Samples, Task

Metrics = dict[str, tuple[torch.Tensor, torch.Tensor | int]]  # name -> (sum, count) over one batch


def sample_ids(num_samples: int, count: int) -> list[int]:
    """``count`` ids spread evenly over the set, from no RNG: the same at any world size and every time."""
    return [i * num_samples // count for i in range(count)]


def rank_batches(ids: Sequence[int], rank: int, world_size: int, batch: int) -> list[list[int]]:
    """This rank's share of ``ids`` in batches; every rank gets the same number of batches (a rank with fewer ids
    gets empty ones: it runs a forward pass all the same, since FSDP's collectives need every rank)."""
    mine = list(ids[rank::world_size])
    passes = math.ceil(math.ceil(len(ids) / world_size) / batch)
    return [mine[k * batch : (k + 1) * batch] for k in range(passes)]


def check_samples(cfg: TrainConfig, val: Samples) -> None:
    if cfg.eval.samples > len(val):
        raise ConfigError("eval.samples", f"{cfg.eval.samples} is more than the {len(val)} samples of the "
                          "validation set", f"lower it to at most {len(val)}, or prepare a larger validation set")


def default_metrics(task: Task) -> Callable[[torch.nn.Module, object], Metrics]:
    """The task's ``evaluate``, or else its training loss as ``val_loss``."""

    def val_loss(model: torch.nn.Module, batch: object) -> Metrics:
        return {"val_loss": task.loss(model, batch)}

    return getattr(task, "evaluate", None) or val_loss


class Evaluator:
    """Token-weighted metrics over ``eval.samples`` samples: each rank sums its share, one all-reduce adds them."""

    def __init__(self, cfg: TrainConfig, task: Task, dataset: Samples, rank: int, world_size: int,
                 device: torch.device):
        check_samples(cfg, dataset)
        self.metrics, self.dataset, self.device = default_metrics(task), dataset, device
        self.bf16 = cfg.train.dtype == "bfloat16"
        micro = cfg.train.micro_batch_size or cfg.per_worker_batch(world_size)
        self.batches = rank_batches(sample_ids(len(dataset), cfg.eval.samples), rank, world_size, micro)
        self.filler = [0]  # what a rank without ids left evaluates, and discards

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        net = model.module if isinstance(model, DistributedDataParallel) else model  # no DDP buffer broadcast
        was_training = net.training
        net.eval()
        totals: dict[str, list[torch.Tensor]] = {}
        try:
            with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                for ids in self.batches:
                    batch = to_device(self.dataset.batch(ids or self.filler), self.device)
                    for name, (total, count) in self.metrics(net, batch).items():
                        sums = totals.setdefault(name, [_zero(self.device), _zero(self.device)])
                        if ids:
                            sums[0] += torch.as_tensor(total, device=self.device).double()
                            sums[1] += torch.as_tensor(count, device=self.device).double()
        finally:
            net.train(was_training)
            _reshard(net)
        return _reduced(totals, self.device)


def _reduced(totals: dict[str, list[torch.Tensor]], device: torch.device) -> dict[str, float]:
    names = sorted(totals)
    stacked = torch.stack([torch.stack(totals[n]) for n in names]) if names else torch.zeros(0, 2, device=device)
    if dist.is_initialized():
        dist.all_reduce(stacked)
    values = {name: total / count if count else math.nan for name, (total, count) in zip(names, stacked.tolist(),
                                                                                           strict=True)}
    if "val_loss" in values:
        values["val_perplexity"] = math.exp(min(values["val_loss"], 700.0))
    return values


def _zero(device: torch.device) -> torch.Tensor:
    return torch.zeros((), dtype=torch.float64, device=device)


def _reshard(model: torch.nn.Module) -> None:
    """FSDP2 keeps the root's parameters gathered after a forward that no backward follows: free them."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def preflight(cfg: TrainConfig, task: Task) -> None:
    """Before any worker starts: the validation set opens, fits the training data and holds ``eval.samples``."""
    check_samples(cfg, open_val_dataset(task))


def open_val_dataset(task: Task) -> Samples:
    """The task's held-out samples: ``open_val_dataset``, which ``Task`` leaves out and evaluation needs."""
    opener: Callable[[], Samples] | None = getattr(task, "open_val_dataset", None)
    if opener is None:
        raise ConfigError("eval", f"is on, but the task {type(task).__name__} has no open_val_dataset",
                          "implement open_val_dataset() in the task (docs/own-model.md), or turn "
                          "eval.every_steps and checkpoint.keep_best off")
    return opener()
