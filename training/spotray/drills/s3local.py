"""A real S3 endpoint on loopback (moto server, a dev dependency) for benchmarks and tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

from spotray.errors import SpotrayError
from spotray.ray_local import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


@contextlib.contextmanager
def moto_server(tls: tuple[str, str] | None = None) -> Iterator[str]:
    """Start ``moto.server`` on 127.0.0.1, export test credentials, yield the endpoint URL; with ``tls`` (the paths
    of a PEM certificate and its key) it serves https."""
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        raise SpotrayError("the loopback S3 endpoint needs moto: pip install 'spotray[dev]'") from exc
    port = free_port()
    serve_tls = ["-c", tls[0], "-k", tls[1]] if tls else []
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port), *serve_tls],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    old = {k: os.environ.get(k) for k in CREDENTIALS}
    try:
        _wait_for_port(port, proc)
        os.environ.update(CREDENTIALS)
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        proc.terminate()
        proc.wait(timeout=10)


def _wait_for_port(port: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 30
    while time.time() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SpotrayError(f"moto server did not start on 127.0.0.1:{port}")


def create_bucket(endpoint: str, name: str | None = None) -> str:
    import boto3

    name = name or f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return f"s3://{name}"
