"""The drills' shared local Ray cluster: a head and two worker nodes, kept from one drill to the next while it is
whole (``ReusedCluster``). A drill kills or drains its last node and adds a replacement, which leaves it whole; a drill
that fails may leave a driver running on it, so the next drill gets a new one."""

from __future__ import annotations

import pytest

from spotray.drills.cluster import ReusedCluster


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.drill_failed = True
    return report


@pytest.fixture(scope="session")
def _reused(s3_server, tmp_path_factory):  # after the S3 server: its credentials reach every node
    with ReusedCluster(tmp_path_factory.mktemp("ray-logs")) as reused:
        yield reused


@pytest.fixture
def cluster(_reused, request):
    yield _reused.get()
    if getattr(request.node, "drill_failed", False):
        _reused.discard()
