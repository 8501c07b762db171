"""``LanguageModelTask``: next-token prediction on spotray's token shards. Tasks subclass it and give the model."""

from __future__ import annotations

from functools import cache, cached_property

import torch
import torch.nn.functional as F

from spotray.config import TrainConfig
from spotray.data.dataset import TokenDataset
from spotray.data.index import val_split_url
from spotray.errors import ConfigError, DataError
from spotray.storage import resolve
from spotray.tasks import ExportSpec


class LanguageModelTask:
    """Samples are windows of ``seq_len + 1`` tokens; the loss is the summed cross-entropy of each next token, so a
    unit is a predicted token. Subclasses implement ``build_model`` and usually ``shard_units`` and ``init_weights``."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.units_per_sample = cfg.train.seq_len

    @cached_property
    def dataset(self) -> TokenDataset:
        return TokenDataset.open(self.cfg.data.path, self.cfg.train.seq_len, self.cfg.storage.options())

    def open_dataset(self) -> TokenDataset:
        return self.dataset

    @cached_property
    def val_dataset(self) -> TokenDataset:
        return _checked_val_dataset(self.cfg, self.dataset)

    def open_val_dataset(self) -> TokenDataset:
        return self.val_dataset

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def on_materialized(self, model: torch.nn.Module) -> None:
        pass

    def init_weights(self, model: torch.nn.Module) -> None:
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()  # type: ignore[operator]  # torch: Module.__getattr__ gives Tensor | Module

    def logits(self, model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return model(inputs)

    def loss(self, model: torch.nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        logits = self.logits(model, batch[:, :-1])
        targets = batch[:, 1:]
        cross_entropy = _compiled_cross_entropy() if self.cfg.train.compile else summed_cross_entropy
        return cross_entropy(logits, targets), targets.numel()

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return []

    def flops_per_unit(self, model: torch.nn.Module) -> float:
        return 6 * linear_weights(model)

    def export_spec(self) -> ExportSpec | None:
        return None

    def load_pretrained(self, model: torch.nn.Module) -> int:
        raise ConfigError("model.task", f"{type(self).__name__} cannot start from pretrained weights",
                          "implement load_pretrained in the task")

    def extra_state(self) -> dict:
        return {}


def summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """In float32 whatever the logits' dtype. Eager, the upcast copies the logits (at GPT-2's vocabulary and 64 x 1024
    tokens, 13 GB) and each pass forward and back reads and writes a copy; compiled, the passes are fused."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")


@cache
def _compiled_cross_entropy():
    return torch.compile(summed_cross_entropy)


def linear_weights(model: torch.nn.Module) -> int:
    """Weights of the model's matrix multiplies (``nn.Linear``, shared ones once): 2 FLOPs each per token forward,
    4 backward. Works on a model on the meta device."""
    seen = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(seen.values())


def attention_flops_per_token(n_layer: int, seq_len: int, d_model: int) -> float:
    """Causal self-attention's score and value matmuls, forward + backward (PaLM appendix B): 12·L·T·d."""
    return 12 * n_layer * seq_len * d_model


def _why_evaluating(cfg: TrainConfig) -> str:
    reasons = [f"eval.every_steps={cfg.eval.every_steps}"] if cfg.eval.every_steps is not None else []
    return ", ".join(reasons + ["checkpoint.keep_best=true"] * cfg.checkpoint.keep_best)


def _checked_val_dataset(cfg: TrainConfig, training: TokenDataset) -> TokenDataset:
    """The run's validation set: ``data.val_path``, else ``<data.path>/val``; checked against the training set's
    tokenizer and ``eval.samples``."""
    url = cfg.data.val_path or val_split_url(cfg.data.path)
    if cfg.data.val_path is None and not resolve(url, cfg.storage.options()).child("index.json").exists():
        raise ConfigError("data.val_path", f"evaluation is on ({_why_evaluating(cfg)}) but {url} holds no prepared "
                          "dataset", "prepare the corpus again with `spotray prepare --val-fraction 0.01` into a new "
                          "--output, set data.val_path=URL, or turn evaluation off")
    try:
        val = TokenDataset.open(url, cfg.train.seq_len, cfg.storage.options())
    except DataError as exc:
        raise ConfigError("data.val_path", str(exc), "point it at a dataset written by `spotray prepare`") from None
    if _encoding(val) != _encoding(training):
        raise ConfigError("data.val_path", f"{url} was prepared with tokenizer {_described(val)}, the training data "
                          f"with {_described(training)}", "prepare the validation set with the training data's "
                          "--tokenizer")
    return val


def _encoding(dataset: TokenDataset) -> tuple[str, int, int]:
    return dataset.tokenizer, dataset.vocab_size, dataset.eot_token


def _described(dataset: TokenDataset) -> str:
    return f"{dataset.tokenizer!r} (end-of-text id {dataset.eot_token})"
