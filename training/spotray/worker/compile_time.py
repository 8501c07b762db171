"""The seconds ``torch.compile`` spends compiling, set apart from the step or evaluation it compiled in: every restart
compiles again (minutes for a large model on a GPU, less from the run's compile caches), and counted in its first
step that time read as productive training, so goodput hid it. Dynamo's compile callbacks say when compiling starts
and ends, nested compiles and a backward compiled later included; no profiler gives that with less."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spotray.worker.telemetry import Telemetry


class CompileTimer:
    """Between ``start`` and ``stop`` (or within ``with``): the compile seconds since the last ``take``."""

    def __init__(self):
        self._lock = threading.Lock()
        self._since: float | None = None  # compiling since (perf_counter), or None
        self._seconds = 0.0
        self._listening = False
        self._waiting: _AfterImport | None = None

    def __enter__(self) -> CompileTimer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> CompileTimer:
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self._started)
        callback_handler.register_end_callback(self._ended)
        self._listening = True
        return self

    def start_once_dynamo_loads(self) -> CompileTimer:
        """Starts now where Dynamo is imported, else right after the script imports it (``torch.compile`` does on its
        first call, often after the checkpoint is loaded): a script that never compiles does not pay its import."""
        if _DYNAMO in sys.modules:
            return self.start()
        self._waiting = _AfterImport(_DYNAMO, self.start)
        sys.meta_path.insert(0, self._waiting)
        return self

    def stop(self) -> None:
        if self._waiting in sys.meta_path:
            sys.meta_path.remove(self._waiting)
        if self._listening:
            from torch._dynamo.callback import callback_handler

            callback_handler.remove_start_callback(self._started)
            callback_handler.remove_end_callback(self._ended)
            self._listening = False

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


_DYNAMO = "torch._dynamo"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then`` once the module ``name`` has been executed, whoever imports it; found as the path finder finds
    it, so nothing else of the import changes."""

    def __init__(self, name: str, then: Callable[[], Any]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self not in sys.meta_path:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Callable[[], Any]):
        self._loader, self._then = loader, then

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._then()


def set_apart(timer: CompileTimer | None, telemetry: Telemetry) -> float:
    """The seconds compiled since the last call, put on the attempt's clock as ``compile`` (none without a timer):
    the caller takes them out of the step or evaluation they fell in."""
    seconds = timer.take() if timer is not None else 0.0
    if seconds:
        telemetry.compiled(seconds)
    return seconds
