"""A user task that is not a transformer: a causal convolutional language model.

Train it with ``spotray train --set model.task=spotray.examples.conv_lm:make_task --set data.path=...``. It shows
each part of the task seam: the model declared on the meta device, every parameter initialised from the torch RNG,
the blocks FSDP shards one by one, and a piece of mutable training state (the token-dropout schedule) that the
checkpoint saves through ``extra_state``, so that a resumed run trains exactly as an uninterrupted one.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from spotray import LanguageModelTask, TrainConfig, linear_weights

WIDTH = 64
DEPTH = 2
KERNEL_SIZE = 8  # tokens each block looks back over; the receptive field is DEPTH * (KERNEL_SIZE - 1) + 1
TOKEN_DROPOUT = 0.1  # share of input tokens replaced by random ones at step 0, annealed to none at the last step


class CausalConvBlock(nn.Module):
    """Pre-norm residual block: a depthwise convolution over time, then an MLP. The convolution is padded on the
    left only, so the output at position t depends on tokens 0..t and never on t+1."""

    def __init__(self, width: int, kernel_size: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.conv = nn.Conv1d(width, width, kernel_size, groups=width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x).transpose(1, 2)  # [B, T, C] -> [B, C, T], the layout Conv1d takes
        h = self.conv(F.pad(h, (self.conv.kernel_size[0] - 1, 0)))
        x = x + h.transpose(1, 2)
        return x + self.mlp(self.ln_2(x))


class ConvLM(nn.Module):
    def __init__(self, vocab_size: int, width: int, depth: int, kernel_size: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.blocks = nn.ModuleList(CausalConvBlock(width, kernel_size) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids [B, T] -> logits [B, T, vocab]."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class TokenDropoutSchedule:
    """Replaces each input token by a random one with a rate annealed linearly from ``start`` to 0 over the run.

    Its state is the number of samples trained on over all ranks, advanced by every rank alike, so it is the same
    on every rank and at any world size. A resumed run must continue the schedule where it stopped rather than at
    its start: that is why it is a ``Stateful`` in the checkpoint (state_dict / load_state_dict)."""

    def __init__(self, start: float, global_batch_size: int, max_steps: int):
        self.start, self.global_batch_size, self.max_steps = start, global_batch_size, max_steps
        self.samples_seen = 0

    def rate(self) -> float:
        step = self.samples_seen // self.global_batch_size  # exact: a step's micro-batches never reach the next
        return self.start * max(0.0, 1 - step / self.max_steps)

    def apply(self, inputs: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """The randomness comes from the torch RNG, which the loop checkpoints for each rank."""
        dropped = torch.rand(inputs.shape, device=inputs.device) < self.rate()
        noise = torch.randint(vocab_size, inputs.shape, device=inputs.device)
        world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.samples_seen += inputs.shape[0] * world_size
        return torch.where(dropped, noise, inputs)

    def state_dict(self) -> dict:
        return {"samples_seen": self.samples_seen}

    def load_state_dict(self, state: dict) -> None:
        self.samples_seen = int(state["samples_seen"])


class ConvLMTask(LanguageModelTask):
    def __init__(self, cfg: TrainConfig, width: int = WIDTH, depth: int = DEPTH, kernel_size: int = KERNEL_SIZE,
                 token_dropout: float = TOKEN_DROPOUT):
        super().__init__(cfg)
        self.width, self.depth, self.kernel_size = width, depth, kernel_size
        self.vocab_size = self.dataset.vocab_size
        self.token_dropout = TokenDropoutSchedule(token_dropout, cfg.train.global_batch_size, cfg.train.max_steps)

    def build_model(self) -> ConvLM:
        return ConvLM(self.vocab_size, self.width, self.depth, self.kernel_size)

    def init_weights(self, model: nn.Module) -> None:
        """Every parameter: ``to_empty`` left them as uninitialised memory."""
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Conv1d):
                nn.init.normal_(module.weight, std=1 / math.sqrt(self.kernel_size))
            if isinstance(module, (nn.Linear, nn.Conv1d)) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for block in _built(model).blocks:  # keep the residual stream's variance flat with depth
            nn.init.normal_(block.get_parameter("mlp.2.weight"), std=0.02 / math.sqrt(2 * self.depth))

    def logits(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        if model.training:
            inputs = self.token_dropout.apply(inputs, self.vocab_size)
        return model(inputs)

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        return list(_built(model).blocks)

    def flops_per_unit(self, model: nn.Module) -> float:
        """6 per weight per token (2 forward, 4 backward), for the matmuls and the depthwise convolutions."""
        return 6 * (linear_weights(model) + self.depth * self.width * self.kernel_size)

    def extra_state(self) -> dict:
        return {"token_dropout": self.token_dropout}


def _built(model: nn.Module) -> ConvLM:
    """The model ``build_model`` built: the loop hands a task's methods back the model the task built."""
    return cast(ConvLM, model)


def make_task(cfg: TrainConfig) -> ConvLMTask:
    return ConvLMTask(cfg)
