"""Which task a run trains (``load_task``): the built-in GPT, a Hugging Face Transformers causal LM, or a user's
factory named by ``model.task``, imported and checked against the ``Task`` protocol with errors naming that key."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from spotray.config import TrainConfig
from spotray.errors import ConfigError, SpotrayError
from spotray.renames import renamed
from spotray.tasks import Task


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
