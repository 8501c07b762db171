"""Fixtures for training tests: a shared local Ray."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster(s3_server):
    """Started after the S3 server, whose credentials every Ray worker inherits. Yields the port where Ray's
    metrics agent serves Prometheus metrics."""
    import os

    import ray

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # notice a finished run sooner
    from spotray.ray_local import free_port, start_local_ray

    metrics_port = free_port()
    start_local_ray(4, log_to_driver=False, _metrics_export_port=metrics_port)
    yield metrics_port
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_address(ray_cluster) -> str:
    """The session's Ray, for a ``spotray`` subprocess whose test is not about starting a local Ray (a local start
    and stop add about 14 s to such a run on 2 cores)."""
    import ray

    return ray.get_runtime_context().gcs_address


@pytest.fixture(scope="session")
def split_dataset_url(tmp_path_factory) -> str:
    """The shared test corpus prepared with a validation split at ``<url>/val`` (a fifth of the documents)."""
    from spotray.data.prepare import prepare
    from tests.corpus import write_corpus

    root = tmp_path_factory.mktemp("split-dataset")
    url = str(root / "tokens")
    prepare(write_corpus(root / "corpus"), url, shard_tokens=16_384, val_fraction=0.2)
    return url
