"""A real MLflow tracking server on loopback (``mlflow server`` on a SQLite store; the full ``mlflow`` package, a dev
dependency) for benchmarks and tests. It can be stopped and started again on the same port and database, as an
outage of the tracker."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from spotray.errors import SpotrayError
from spotray.ray_local import free_port

START_TIMEOUT_S = 300.0  # a first start creates the database: seconds on an idle machine, minutes on a busy one


class MlflowServer:
    def __init__(self, directory: Path, port: int | None = None):
        self.directory, self.port = directory, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        mlflow = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or shutil.which("mlflow")
        if mlflow is None:
            raise SpotrayError("the loopback MLflow server needs the mlflow package: pip install 'spotray[dev]'")
        log = open(self.directory / "server.log", "ab")  # noqa: SIM115 - the server's, closed with it
        self._proc = subprocess.Popen(
            [mlflow, "server", "--backend-store-uri", f"sqlite:///{self.directory / 'mlflow.db'}",
             "--default-artifact-root", str(self.directory / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=log, start_new_session=True, cwd=self.directory,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        log.close()
        self._wait_until_up()

    def stop(self) -> None:
        """Kills the server and its worker processes (its own process group), as a crash would."""
        if self._proc is None or self._proc.poll() is not None:
            return
        os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(timeout=30)

    def _wait_until_up(self) -> None:
        assert self._proc is not None, "start() first"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self._proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise SpotrayError(f"mlflow server did not start on {self.url}; see {self.directory / 'server.log'}")


@contextlib.contextmanager
def mlflow_server(directory: Path) -> Iterator[MlflowServer]:
    """An MLflow server storing into ``directory`` (created), running while the context is open."""
    directory.mkdir(parents=True, exist_ok=True)
    server = MlflowServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
