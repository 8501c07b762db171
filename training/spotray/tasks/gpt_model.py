"""A GPT decoder: pre-norm blocks, fused scaled-dot-product attention, tied input/output embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from spotray.config import MODEL_PRESETS, ModelSection
from spotray.errors import ConfigError


@dataclass(frozen=True)
class GPTShape:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    dropout: float = 0.0

    @classmethod
    def from_config(cls, model: ModelSection, vocab_size: int, block_size: int) -> GPTShape:
        n_layer, n_head, n_embd = MODEL_PRESETS[model.preset]
        shape = cls(
            n_layer=model.n_layer or n_layer,
            n_head=model.n_head or n_head,
            n_embd=model.n_embd or n_embd,
            vocab_size=_round_up(vocab_size, 64),  # multiples of 64 keep the output matmul on fast kernels
            block_size=block_size,
            dropout=model.dropout,
        )
        if shape.n_embd % shape.n_head:
            raise ConfigError("model.n_head", f"n_embd={shape.n_embd} is not divisible by n_head={shape.n_head}")
        return shape

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward), as in the PaLM appendix: 6N + 12·L·T·d."""
        n_params = 12 * self.n_layer * self.n_embd**2 + self.vocab_size * self.n_embd
        return 6 * n_params + 12 * self.n_layer * self.block_size * self.n_embd


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.n_head = shape.n_head
        self.qkv = nn.Linear(shape.n_embd, 3 * shape.n_embd)
        self.proj = nn.Linear(shape.n_embd, shape.n_embd)
        self.dropout = shape.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(shape.n_embd)
        self.attn = CausalSelfAttention(shape)
        self.ln_2 = nn.LayerNorm(shape.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(shape.n_embd, 4 * shape.n_embd),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * shape.n_embd, shape.n_embd),
            nn.Dropout(shape.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.shape = shape
        self.wte = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.wpe = nn.Embedding(shape.block_size, shape.n_embd)
        self.drop = nn.Dropout(shape.dropout)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.n_embd)
        self.lm_head = nn.Linear(shape.n_embd, shape.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.init_weights()

    def tie_weights(self) -> None:
        """Share the input embedding with the output projection again: ``to_empty`` on a meta model unties them."""
        self.lm_head.weight = self.wte.weight

    def init_weights(self) -> None:
        """Every parameter from the current RNG state; for a model built on the meta device and
        materialised with ``to_empty``, which leaves memory uninitialised."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.shape.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids [B, T] -> logits [B, T, vocab]."""
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
