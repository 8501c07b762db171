"""spotray: train on GPU spot capacity with Ray, and lose no work to a preemption.

What a user imports is here, and stays: ``LanguageModelTask`` (subclass it for your own model, docs/own-model.md),
the ``Task`` protocol and ``ExportSpec`` it implements, ``TrainConfig`` (what the task's factory is given) and
``linear_weights``; for your own training script (docs/scripts.md) ``restore``, ``should_save``, ``commit``,
``report``, ``should_stop``, ``evaluating`` and ``spotray.hf`` (a Trainer's callback). Everything else may move.
This folder (training/spotray/) installs as ``spotray``; the Pulumi program's packages (``infra``, ``cluster``,
``monitoring``) are imported from the repository root and not installed.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the checker and editors see; at run time __getattr__ below imports each on first use
    from spotray import hf as hf
    from spotray.config import TrainConfig as TrainConfig
    from spotray.tasks import ExportSpec as ExportSpec
    from spotray.tasks import Task as Task
    from spotray.tasks.base import LanguageModelTask as LanguageModelTask
    from spotray.tasks.base import linear_weights as linear_weights
    from spotray.worker.session import commit as commit
    from spotray.worker.session import evaluating as evaluating
    from spotray.worker.session import report as report
    from spotray.worker.session import restore as restore
    from spotray.worker.session import should_save as should_save
    from spotray.worker.session import should_stop as should_stop

_PUBLIC = {"LanguageModelTask": "spotray.tasks.base", "linear_weights": "spotray.tasks.base",
           "Task": "spotray.tasks", "ExportSpec": "spotray.tasks", "TrainConfig": "spotray.config",
           **dict.fromkeys(("restore", "should_save", "commit", "report", "should_stop", "evaluating"),
                           "spotray.worker.session")}
_MODULES = ("hf",)
__all__ = sorted((*_PUBLIC, *_MODULES))


def __getattr__(name: str):
    """Imported on first use: the provisioning side (the Pulumi program, ``spotray plan``) never loads torch."""
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    if name in _MODULES:
        return importlib.import_module(f"spotray.{name}")
    raise AttributeError(f"module 'spotray' has no attribute {name!r}")
