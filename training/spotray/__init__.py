"""spotray: train on GPU spot capacity with Ray, and lose no work to a preemption.

What a user imports is here, and stays: ``LanguageModelTask`` (subclass it for your own model, README "Your own
model"), the ``Task`` protocol and ``ExportSpec`` it implements, ``TrainConfig`` (what the task's factory is given)
and ``linear_weights``; for your own training script (README, "Your existing script") ``restore``, ``should_save``,
``commit``, ``report``, ``should_stop`` and ``spotray.hf`` (a Trainer's callback). Everything else may move.
This folder (training/spotray/) installs as ``spotray``; the provisioning side as ``infra``, ``cluster``
and ``monitoring``.
"""

import importlib

_PUBLIC = {"LanguageModelTask": "spotray.tasks.base", "linear_weights": "spotray.tasks.base",
           "Task": "spotray.tasks", "ExportSpec": "spotray.tasks", "TrainConfig": "spotray.config",
           **dict.fromkeys(("restore", "should_save", "commit", "report", "should_stop"), "spotray.session")}
_MODULES = ("hf",)
__all__ = sorted((*_PUBLIC, *_MODULES))


def __getattr__(name: str):
    """Imported on first use: the provisioning side (the Pulumi program, ``spotray plan``) never loads torch."""
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    if name in _MODULES:
        return importlib.import_module(f"spotray.{name}")
    raise AttributeError(f"module 'spotray' has no attribute {name!r}")
