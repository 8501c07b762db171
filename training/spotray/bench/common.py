"""Pieces the benchmarks share: a workdir with a small prepared corpus, a local Ray, result passing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator

import numpy as np
import torch

from spotray.data.index import FORMAT, INDEX_NAME, VERSION, dtype_for_vocab
from spotray.data.prepare import prepare
from spotray.errors import SpotrayError
from spotray.storage import Location, resolve


def bench_corpus(workdir: str) -> str:
    """A few MB of real text (stdlib source) prepared once per benchmark run."""
    url = resolve(workdir).child("data").url
    prepare(f"{sysconfig.get_paths()['stdlib']}/email/**/*.py", url, shard_tokens=1 << 18)
    return url


def random_token_corpus(workdir: str, vocab_size: int, tokens: int = 1 << 22) -> str:
    """Uniformly random token ids below ``vocab_size``, as one prepared shard: a model's step costs the same whatever
    its tokens say, so a bench can run at a real vocabulary's size (GPT-2's 50,257) with nothing downloaded."""
    root = resolve(workdir).child("data-random")
    dtype = dtype_for_vocab(vocab_size)
    data = np.random.default_rng(0).integers(0, vocab_size, tokens).astype(dtype).tobytes()
    root.child("shard-00000.bin").write_bytes(data)
    shard = {"name": "shard-00000.bin", "tokens": tokens, "sha256": hashlib.sha256(data).hexdigest()}
    root.child(INDEX_NAME).write_text(json.dumps({
        "format": FORMAT, "version": VERSION, "dtype": dtype, "tokenizer": f"random:{vocab_size}",
        "vocab_size": vocab_size, "eot_token": vocab_size - 1, "shard_tokens": tokens, "total_tokens": tokens,
        "num_documents": 1, "tokenizer_file": None, "shards": [shard]}))
    return root.url


def check_gpus(gpu: bool, workers: int) -> None:
    """``--gpu`` runs one worker a GPU: refused before anything starts where the machine has fewer."""
    if gpu and workers > torch.cuda.device_count():
        raise SpotrayError(f"--gpu with --workers {workers}: this machine has {torch.cuda.device_count()} GPU(s); "
                           "give --workers at most that")


def machine() -> dict:
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(),
            "torch": torch.__version__, "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": time.strftime("%Y-%m-%d")}


@contextlib.contextmanager
def scratch_dir(given: str | None = None) -> Iterator[str]:
    """A bench's own folder for its corpus, checkpoints and logs: removed when the bench ends (a GPU bench leaves
    gigabytes of checkpoints), kept and named when it fails, for its logs. A caller's ``given`` folder stays."""
    if given:
        yield given
        return
    path = tempfile.mkdtemp(prefix="spotray-bench-")
    try:
        yield path
    except BaseException:
        print(f"bench: its files are kept in {path}", file=sys.stderr)
        raise
    shutil.rmtree(path, ignore_errors=True)


def write_result(location: Location, result: dict) -> None:
    location.write_text(json.dumps(result))


def read_result(location: Location) -> dict:
    return json.loads(location.read_text())
