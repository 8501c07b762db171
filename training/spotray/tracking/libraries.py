"""Each tracker's library is an extra of spotray's (``pip install 'spotray[mlflow]'``), imported only by the driver."""

from __future__ import annotations

import importlib

from spotray.config import TrackingSection
from spotray.errors import ConfigError

TRACKERS = ("mlflow", "wandb", "tensorboard")  # each: a key of tracking, its library's module and spotray's extra


def configured(tracking: TrackingSection) -> list[str]:
    return [name for name in TRACKERS if getattr(tracking, name) is not None]


def check_installed(tracking: TrackingSection) -> None:
    """A configured tracker whose library is missing stops the run before anything starts."""
    for name in configured(tracking):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"tracking.{name}", f"the {name} library is not installed",
                              f"pip install 'spotray[{name}]'") from exc
