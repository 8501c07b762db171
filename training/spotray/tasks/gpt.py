"""The built-in GPT as a task; it exports as a ``transformers`` ``GPT2LMHeadModel``."""

from __future__ import annotations

from typing import cast

import torch

from spotray.tasks import ExportSpec
from spotray.tasks.base import LanguageModelTask, attention_flops_per_token
from spotray.tasks.gpt_model import GPT, GPTShape


class GPTTask(LanguageModelTask):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.shape = GPTShape.from_config(cfg.model, self.dataset.vocab_size, cfg.train.seq_len)

    def build_model(self) -> GPT:
        return GPT(self.shape)

    def on_materialized(self, model: torch.nn.Module) -> None:
        _built(model).tie_weights()

    def init_weights(self, model: torch.nn.Module) -> None:
        _built(model).init_weights()

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return list(_built(model).blocks)

    def flops_per_unit(self, model: torch.nn.Module) -> float:
        return super().flops_per_unit(model) + attention_flops_per_token(
            self.shape.n_layer, self.shape.block_size, self.shape.n_embd)

    def export_spec(self) -> ExportSpec:
        return ExportSpec(hf_config=gpt2_config(self.shape), rename="gpt")


def _built(model: torch.nn.Module) -> GPT:
    """The model ``build_model`` built: the loop hands a task's methods back the model the task built."""
    return cast(GPT, model)


def gpt2_config(shape: GPTShape) -> dict:
    """The ``GPT2Config`` of the same network: GELU(tanh), LayerNorm eps 1e-5, MLP 4·d, tied embeddings."""
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": shape.vocab_size,
        "n_positions": shape.block_size, "n_embd": shape.n_embd, "n_layer": shape.n_layer, "n_head": shape.n_head,
        "n_inner": 4 * shape.n_embd, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
        "bos_token_id": None, "eos_token_id": None,
    }


_GPT2_NAMES = {"attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "mlp.0": "mlp.c_fc", "mlp.2": "mlp.c_proj"}


def to_gpt2(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """spotray GPT names -> GPT2LMHeadModel names. GPT-2's ``Conv1D`` stores linear weights as [in, out], hence the
    transposes; the tied ``lm_head`` is left out. Consumes ``state``: each original goes as its copy is made."""
    out = {}
    for name in list(state):
        tensor = state.pop(name)
        if name == "lm_head.weight":
            continue
        new = name.replace("blocks.", "h.", 1)
        for ours, theirs in _GPT2_NAMES.items():
            if f".{ours}." in new:
                new = new.replace(f".{ours}.", f".{theirs}.")
                tensor = tensor.t().contiguous() if new.endswith(".weight") else tensor
        out[f"transformer.{new}"] = tensor
    return out
