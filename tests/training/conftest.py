"""Fixtures for training tests: a shared local Ray and a config factory."""

from __future__ import annotations

import pytest

from training import config


@pytest.fixture(scope="session")
def ray_cluster(s3_server):
    """Started after the S3 server, whose credentials every Ray worker inherits. Yields the port where Ray's
    metrics agent serves Prometheus metrics."""
    import os

    import ray

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # notice a finished run sooner
    from training.drills.cluster import free_port
    from training.launch import start_local_ray

    metrics_port = free_port()
    start_local_ray(4, log_to_driver=False, _metrics_export_port=metrics_port)
    yield metrics_port
    ray.shutdown()


def make_config(data_path: str, ckpt_path: str, name: str, *overrides: str) -> config.TrainConfig:
    base = [
        f"data.path={data_path}", f"checkpoint.path={ckpt_path}", f"run.name={name}",
        "model.preset=tiny", "train.seq_len=32", "train.global_batch_size=12", "train.max_steps=40",
        "train.warmup_steps=5", "train.lr=0.003", "train.log_every=5", "checkpoint.every_steps=10",
        "checkpoint.keep_last=10", "scaling.num_workers=2", "seed=1",
    ]
    return config.load(None, base + list(overrides))
