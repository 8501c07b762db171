"""What changed names: releases up to 0.1.0 installed this package as ``training``, not ``spotray``."""

from __future__ import annotations

_OLD = "training"


def renamed(module: str) -> str | None:
    """The current name of a module of an older release (``training.checkpoint`` -> ``spotray.checkpoint``), or
    None for any other module."""
    if module == _OLD or module.startswith(f"{_OLD}."):
        return f"spotray{module[len(_OLD):]}"
    return None
