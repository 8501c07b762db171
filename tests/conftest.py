"""Shared fixtures: a real S3 endpoint on loopback (moto server), buckets, and a generated, prepared corpus."""

from __future__ import annotations

import pytest

from spotray.data.prepare import prepare
from spotray.drills.s3local import create_bucket, moto_server
from spotray.storage import StorageOptions, resolve
from tests.corpus import write_corpus
from tests.repo import REPO, STACKS


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


@pytest.fixture(scope="session")
def dataset_url(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("dataset")
    corpus = write_corpus(root / "corpus")
    url = str(root / "tokens")
    prepare(corpus, url, shard_tokens=16_384)
    return url


@pytest.fixture(scope="session")
def stack_plans() -> dict:
    """Every stack file of the repository planned once under Pulumi mocks: stack -> (StackConfig, Plan)."""
    from spotray.infra.kernel.config import load_stack_file
    from spotray.infra.plan import plan

    plans = {}
    for stack in STACKS:
        cfg = load_stack_file(REPO, stack)
        plans[stack] = (cfg, plan(cfg))
    return plans


@pytest.fixture(scope="session")
def dev(stack_plans):
    return stack_plans["dev"][0]
