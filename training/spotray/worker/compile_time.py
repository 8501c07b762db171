"""The seconds ``torch.compile`` spends compiling, set apart from the step or evaluation it compiled in: every restart
compiles again (minutes for a large model on a GPU, less from the run's compile caches), and counted in its first
step that time read as productive training, so goodput hid it. Dynamo's compile callbacks say when compiling starts
and ends, nested compiles and a backward compiled later included; no profiler gives that with less."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spotray.worker.telemetry import Telemetry


class CompileTimer:
    """Between ``start`` and ``stop`` (or within ``with``): the compile seconds since the last ``take``."""

    def __init__(self):
        self._lock = threading.Lock()
        self._since: float | None = None  # compiling since (perf_counter), or None
        self._seconds = 0.0

    def __enter__(self) -> CompileTimer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> CompileTimer:
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self._started)
        callback_handler.register_end_callback(self._ended)
        return self

    def stop(self) -> None:
        from torch._dynamo.callback import callback_handler

        callback_handler.remove_start_callback(self._started)
        callback_handler.remove_end_callback(self._ended)

    def take(self) -> float:
        with self._lock:
            now = time.perf_counter()
            seconds = self._seconds + (now - self._since if self._since is not None else 0.0)
            self._seconds = 0.0
            if self._since is not None:
                self._since = now
            return seconds

    def _started(self, _args) -> None:
        with self._lock:
            self._since = time.perf_counter()

    def _ended(self, _args) -> None:
        with self._lock:
            if self._since is not None:
                self._seconds += time.perf_counter() - self._since
                self._since = None


def set_apart(timer: CompileTimer | None, telemetry: Telemetry) -> float:
    """The seconds compiled since the last call, put on the attempt's clock as ``compile`` (none without a timer):
    the caller takes them out of the step or evaluation they fell in."""
    seconds = timer.take() if timer is not None else 0.0
    if seconds:
        telemetry.compiled(seconds)
    return seconds
