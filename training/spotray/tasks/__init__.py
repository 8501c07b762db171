"""The task seam: what the loop, launcher and telemetry need to know about a model and its data.

A task is built once per process from the run's ``TrainConfig``. The built-in GPT (``gpt``), a Hugging Face
Transformers causal LM (``hf_causal_lm``) and a user's task (``model.task: package.module:factory``) all implement
``Task``. The rules a task keeps so that resume is exact and data is consumed exactly once are in docs/own-model.md.

May import: the base modules at the package's root, ``spotray.accounts``, ``spotray.checkpoints`` and ``spotray.data``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from spotray.errors import ConfigError, SpotrayError
from spotray.renames import renamed

if TYPE_CHECKING:
    import torch

    from spotray.config import TrainConfig


class Samples(Protocol):
    """A dataset of numbered samples. ``batch`` must be a pure function of ``ids``: a background thread calls it
    for the next step while the current one computes, and a resumed run calls it again for the same ids."""

    def __len__(self) -> int: ...

    def batch(self, ids: Sequence[int]) -> torch.Tensor | dict[str, torch.Tensor]: ...


@dataclass(frozen=True)
class ExportSpec:
    """How a trained state dict becomes a Hugging Face model directory: its config.json, and ``rename``, the name of
    one of ``training.export.RENAMES`` that puts the tensors under the names that model class loads (None: keep)."""

    hf_config: dict
    rename: str | None = None


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


def load_task(cfg: TrainConfig) -> Task:
    """The run's task; a user's factory is imported and called here, with errors naming ``model.task``."""
    kind = cfg.model.kind
    if kind == "gpt":
        from spotray.tasks.gpt import GPTTask

        return GPTTask(cfg)
    if kind == "hf":
        from spotray.tasks.hf_causal_lm import HFTask

        return HFTask(cfg)
    return _user_task(cfg)


def _user_task(cfg: TrainConfig) -> Task:
    spec = cfg.model.task
    assert spec is not None  # the kind of task that model.task names
    module_name, _, factory_name = spec.partition(":")
    try:
        module = _import_task_module(module_name, cfg.runtime.working_dir)
    except ImportError as exc:
        current = renamed(module_name)
        if current and importlib.util.find_spec(current):
            raise ConfigError("model.task", f"'{module_name}' is spotray's own module, which is now named "
                              f"'{current}'", f"write model.task={current}:{factory_name}") from None
        raise ConfigError("model.task", f"cannot import '{module_name}' ({exc})",
                          "install the package in the image, or ship its directory with runtime.working_dir") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed as it was imported: its error, in one line
        raise ConfigError("model.task", f"importing '{module_name}' raised {type(exc).__name__}: {exc}",
                          "fix the module") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ConfigError("model.task", f"'{module_name}' has no callable '{factory_name}'",
                          "name the function that takes the TrainConfig and returns the task")
    try:
        task = factory(cfg)
    except SpotrayError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: any error is reported as a config problem
        raise ConfigError("model.task", f"{spec} raised {type(exc).__name__}: {exc}",
                          "fix the factory; it is called with the run's TrainConfig") from None
    missing = [name for name in _REQUIRED if not hasattr(task, name)]
    if missing:
        raise ConfigError("model.task", f"{spec} returned a {type(task).__name__} without {', '.join(missing)}",
                          "subclass spotray.LanguageModelTask or implement the Task protocol")
    return task


def _import_task_module(module_name: str, working_dir: str | None):
    """On a Ray worker the shipped working dir is on the path already; on the driver (and in a process group
    without Ray) the task comes from the local directory that spotray ships."""
    try:
        return importlib.import_module(module_name)
    except ImportError:
        local = os.path.abspath(working_dir) if working_dir and os.path.isdir(working_dir) else None
        if local is None or local in sys.path:
            raise
        sys.path.insert(0, local)
        return importlib.import_module(module_name)


_REQUIRED = ("units_per_sample", "open_dataset", "build_model", "on_materialized", "init_weights", "loss",
             "shard_units", "flops_per_unit", "export_spec", "load_pretrained", "extra_state")
