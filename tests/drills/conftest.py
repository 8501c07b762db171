"""The drills' shared local Ray cluster: a head and two worker nodes, kept from one drill to the next while it is
whole. A drill kills or drains its last node and adds a replacement, which leaves it whole; a drill that fails may
leave a driver running on it, so the next drill gets a new one."""

from __future__ import annotations

import time

import pytest

from spotray.drills.cluster import LocalCluster


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.drill_failed = True
    return report


@pytest.fixture(scope="session")
def _held(s3_server):  # after the S3 server: its credentials reach every node
    held: list[LocalCluster] = []
    yield held
    for cluster in held:
        cluster.stop()


@pytest.fixture
def cluster(_held, tmp_path_factory, request):
    if _held and not _whole(_held[-1]):
        _held.pop().stop()
    if not _held:
        _held.append(LocalCluster(tmp_path_factory.mktemp("ray-logs"), drain_timeout_s=20).start(workers=2))
    yield _held[-1]
    if getattr(request.node, "drill_failed", False):
        _held.pop().stop()


def _whole(cluster: LocalCluster) -> bool:
    """The head and two worker nodes run, and Ray lists just those as alive (a killed node is noticed seconds later,
    a drained one leaves once drained): no drill's workers may be placed on a node that is gone."""
    deadline = time.time() + cluster.drain_timeout_s + 10
    while _workers_running(cluster) > 2 and time.time() < deadline:
        time.sleep(0.5)
    return cluster.nodes[0].alive and _workers_running(cluster) == 2 and cluster.settled()


def _workers_running(cluster: LocalCluster) -> int:
    return sum(node.alive for node in cluster.nodes[1:])
