"""Shared fixtures: a real S3 endpoint on loopback (moto server) and a bucket per test."""

from __future__ import annotations

import pytest

from training.bench.s3local import create_bucket, moto_server
from training.storage import StorageOptions, resolve


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server process on 127.0.0.1; credentials are exported so every process can reach it."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def storage_root(request, tmp_path):
    """The same test against a local directory and an S3 prefix."""
    if request.param == "local":
        return resolve(str(tmp_path / "root"))
    bucket_url, options = request.getfixturevalue("s3_bucket")
    return resolve(f"{bucket_url}/root", options)


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket; yields (s3 url of the bucket, StorageOptions pointing at the server)."""
    return create_bucket(s3_server), StorageOptions(endpoint_url=s3_server)
