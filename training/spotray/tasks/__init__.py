"""The task seam: what the loop, launcher and telemetry need to know about a model and its data.

A task is built once per process from the run's ``TrainConfig``. The built-in GPT (``gpt``), a Hugging Face
Transformers causal LM (``hf_causal_lm``) and a user's task (``model.task: package.module:factory``) all implement
``Task``. The rules a task keeps so that resume is exact and data is consumed exactly once are in docs/own-model.md.

May import: the base modules at the package's root, ``spotray.accounts``, ``spotray.checkpoints`` and ``spotray.data``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from spotray.errors import SpotrayError

if TYPE_CHECKING:
    import torch


class Samples(Protocol):
    """A dataset of numbered samples. ``batch`` must be a pure function of ``ids``: a background thread calls it
    for the next step while the current one computes, and a resumed run calls it again for the same ids."""

    def __len__(self) -> int: ...

    def batch(self, ids: Sequence[int]) -> torch.Tensor | dict[str, torch.Tensor]: ...


GENERATION_CONFIG = "generation_config.json"
EXPORT_DTYPES = ("float32", "bfloat16", "float16")  # what `spotray export` writes floating-point weights in


@dataclass(frozen=True)
class ExportSpec:
    """How a trained state dict becomes a Hugging Face model directory: its config.json (whose ``dtype``, one of
    ``EXPORT_DTYPES``, is what the weights are written in; float32 where it names none), and ``rename``, the name of
    one of ``training.export.RENAMES`` that puts the tensors under the names that model class loads (None: keep)."""

    hf_config: dict
    rename: str | None = None
    generation_config: dict | None = None  # generation_config.json, where the model came with one


class Task(Protocol):
    units_per_sample: int  # loss terms per sample (tokens for a language model): the step's constant denominator

    def open_dataset(self) -> Samples: ...

    def build_model(self) -> torch.nn.Module:
        """Called under ``torch.device("meta")``: declare the parameters, allocate nothing."""

    def on_materialized(self, model: torch.nn.Module) -> None:
        """After ``to_empty``: re-tie shared weights and fill the buffers a checkpoint does not hold."""

    def init_weights(self, model: torch.nn.Module) -> None:
        """Every parameter from the torch RNG (skipped when a checkpoint overwrites them)."""

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """(sum of the per-unit losses, number of units) for one micro-batch."""

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The blocks FSDP2 shards (and ``train.compile`` compiles) one by one; the root is sharded last."""

    def flops_per_unit(self, model: torch.nn.Module) -> float | None:
        """Training FLOPs (forward + backward) per unit, for MFU; None if unknown."""

    def export_spec(self) -> ExportSpec | None:
        """For ``spotray export``; None writes the state dict under its own names, without a config.json."""

    def load_pretrained(self, model: torch.nn.Module) -> int:
        """Overwrite the (sharded) parameters with pretrained weights, instead of ``init_weights``; returns the
        bytes read."""

    def extra_state(self) -> dict:
        """More to checkpoint: name -> ``Stateful`` (``state_dict``/``load_state_dict``), the same on every rank."""

    # Evaluation (``eval.every_steps``, ``checkpoint.keep_best``) also needs, where a task has them:
    #   open_val_dataset() -> Samples: the held-out samples (required while evaluation is on);
    #   evaluate(model, batch) -> {name: (sum, count)}: summed over the batch, averaged over every rank's sums
    #   and counts; without it the task's ``loss`` is reported as ``val_loss``.


class TaskError(SpotrayError):
    """A task broke one of the rules the guarantees rest on."""
