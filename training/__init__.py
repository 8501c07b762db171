"""spotray: train on GPU spot capacity with Ray, and lose no work to a preemption.

What a user imports is here, and stays: ``LanguageModelTask`` (subclass it for your own model, README "Your own
model"), the ``Task`` protocol and ``ExportSpec`` it implements, ``TrainConfig`` (what the task's factory is given)
and ``linear_weights``. Everything else may move. This folder (training/) installs as ``spotray``; the provisioning
side as ``spotray.infra``, ``spotray.cluster`` and ``spotray.monitoring``.
"""

import importlib

_PUBLIC = {"LanguageModelTask": "spotray.tasks.base", "linear_weights": "spotray.tasks.base",
           "Task": "spotray.tasks", "ExportSpec": "spotray.tasks", "TrainConfig": "spotray.config"}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """Imported on first use: the provisioning side (the Pulumi program, ``spotray plan``) never loads torch."""
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'spotray' has no attribute {name!r}")
