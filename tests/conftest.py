"""Shared fixtures: a real S3 endpoint on loopback (moto server) and a bucket per test."""

from __future__ import annotations

import pytest

from training.bench.s3local import create_bucket, moto_server
from training.storage import StorageOptions


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server process on 127.0.0.1; credentials are exported so every process can reach it."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket; yields (s3 url of the bucket, StorageOptions pointing at the server)."""
    return create_bucket(s3_server), StorageOptions(endpoint_url=s3_server)
