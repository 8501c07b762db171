"""Pieces the benchmarks share: a workdir with a small prepared corpus, a local Ray, result passing."""

from __future__ import annotations

import json
import os
import platform
import sysconfig
import tempfile
import time

import torch

from spotray.data.prepare import prepare
from spotray.storage import Location, resolve


def bench_corpus(workdir: str) -> str:
    """A few MB of real text (stdlib source) prepared once per benchmark run."""
    url = resolve(workdir).child("data").url
    prepare(f"{sysconfig.get_paths()['stdlib']}/email/**/*.py", url, shard_tokens=1 << 18)
    return url


def machine() -> dict:
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(),
            "torch": torch.__version__, "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": time.strftime("%Y-%m-%d")}


def new_workdir() -> str:
    return tempfile.mkdtemp(prefix="spotray-bench-")


def write_result(location: Location, result: dict) -> None:
    location.write_text(json.dumps(result))


def read_result(location: Location) -> dict:
    return json.loads(location.read_text())
