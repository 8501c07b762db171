"""The driver's watch on the Ray head. Once the head (its GCS) has been unreachable for Ray's
``gcs_rpc_server_reconnect_timeout_s``, Ray ends the driver's process at once, without a word; the watch notices at
half that time and interrupts the main thread, so that the run can end with one line saying how to resume."""

from __future__ import annotations

import _thread
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType

RAY_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
RAY_RECONNECT_DEFAULT_S = 60.0
# Only this signal's Python handler runs (no signal is sent), which raises KeyboardInterrupt: the one exception a
# blocked ``ray.get`` gives way to. Not SIGINT, whose handler Ray Train replaces with one that asks the lost head.
_SIGNAL = signal.SIGUSR2


def ray_reconnect_timeout_s() -> float:
    return float(os.environ.get(RAY_RECONNECT_ENV) or RAY_RECONNECT_DEFAULT_S)


class HeadWatch:
    """Probes the GCS port every ``every_s``; ``lost`` turns True, and the main thread gets a KeyboardInterrupt,
    when no probe has answered for ``lost_after_s`` (default: half of Ray's own reconnect timeout). With no address
    (no Ray connected) it watches nothing."""

    def __init__(self, gcs_address: str | None, lost_after_s: float | None = None, every_s: float = 1.0):
        host, _, port = (gcs_address or "").rpartition(":")
        self.address = (host, int(port)) if gcs_address else None
        self.lost_after_s = lost_after_s if lost_after_s is not None else ray_reconnect_timeout_s() / 2
        self.every_s = every_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="spotray-head-watch")
        self._previous_handler: Callable[[int, FrameType | None], object] | int | None = None

    def __enter__(self) -> HeadWatch:
        if self.address and threading.current_thread() is threading.main_thread():  # only it can be interrupted
            self._previous_handler = signal.signal(_SIGNAL, _interrupt)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._previous_handler is not None:
            self._thread.join(timeout=5)
            signal.signal(_SIGNAL, self._previous_handler)

    def _run(self) -> None:
        last_answer = time.monotonic()
        while not self._stop.wait(self.every_s):
            if self.answers():
                last_answer = time.monotonic()
            elif time.monotonic() - last_answer >= self.lost_after_s:
                self.lost = True
                _thread.interrupt_main(_SIGNAL)
                return

    def answers(self) -> bool:
        """Whether the GCS port takes a connection now."""
        if not self.address:
            return True
        try:
            with socket.create_connection(self.address, timeout=max(0.1, min(2.0, self.lost_after_s / 2))):
                return True
        except OSError:
            return False


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
