"""Fixtures for training tests: a generated corpus, a prepared dataset, a shared local Ray, a config factory."""

from __future__ import annotations

import random

import pytest

from training import config
from training.data.prepare import prepare

WORDS = ("spot preempt node ray train shard token model loss step batch drain grace save load resume "
         "gpu cpu storage bucket commit marker rank world epoch sample").split()


def write_corpus(directory, documents: int = 40, words_per_doc: int = 400, seed: int = 0) -> str:
    """Deterministic text files with some structure (a small Markov-ish word stream)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for d in range(documents):
        words = [rng.choice(WORDS)]
        for _ in range(words_per_doc):
            nxt = WORDS[(WORDS.index(words[-1]) * 7 + rng.randint(0, 3)) % len(WORDS)]
            words.append(nxt)
        (directory / f"doc{d:03d}.txt").write_text(" ".join(words) + "\n")
    return str(directory)


@pytest.fixture(scope="session")
def dataset_url(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("dataset")
    corpus = write_corpus(root / "corpus")
    url = str(root / "tokens")
    prepare(corpus, url, shard_tokens=16_384)
    return url


@pytest.fixture(scope="session")
def ray_cluster():
    import os

    import ray

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # notice a finished run sooner
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def make_config(data_path: str, ckpt_path: str, name: str, *overrides: str) -> config.TrainConfig:
    base = [
        f"data.path={data_path}", f"checkpoint.path={ckpt_path}", f"run.name={name}",
        "model.preset=tiny", "train.seq_len=32", "train.global_batch_size=12", "train.max_steps=40",
        "train.warmup_steps=5", "train.lr=0.003", "train.log_every=5", "checkpoint.every_steps=10",
        "checkpoint.keep_last=10", "scaling.num_workers=2", "seed=1",
    ]
    return config.load(None, base + list(overrides))
