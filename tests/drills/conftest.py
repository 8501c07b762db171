"""The drills' shared local Ray cluster: a head and two worker nodes, kept from one drill to the next while it is
whole (``ReusedCluster``). A drill kills or drains worker nodes and adds replacements, which leaves it whole; one that
kills the head (the soak, the head-loss drill) replaces it through ``reused_clusters``, and the next drills get the
new one; a drill that fails may leave a driver running on it, so the next drill gets a new one. It stops when the
next test is not a drill (an idle cluster's processes would take CPU from every test after the drills), and starts
again if a later drill needs it."""

from __future__ import annotations

import pytest

from spotray.drills.cluster import ReusedCluster


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.drill_failed = True
    return report


_started: list[ReusedCluster] = []  # the session's, once a drill asked for it


def pytest_runtest_teardown(item, nextitem):
    if _started and (nextitem is None or nextitem.path.parent != item.path.parent):
        _started[0].discard()


@pytest.fixture(scope="session")
def reused_clusters(s3_server, tmp_path_factory):  # after the S3 server: its credentials reach every node
    with ReusedCluster(tmp_path_factory.mktemp("ray-logs")) as reused:
        _started.append(reused)
        yield reused


@pytest.fixture(scope="session")
def demo_workdir(tmp_path_factory) -> str:
    """A folder of the demo's runs, whose corpus (the standard library's source, 10 s to prepare) the first run
    prepares and the later ones reuse."""
    return str(tmp_path_factory.mktemp("demo"))


@pytest.fixture
def cluster(reused_clusters, request):
    yield reused_clusters.get()
    if getattr(request.node, "drill_failed", False):
        reused_clusters.discard()


@pytest.fixture
def three_workers(cluster):
    """The drills' cluster with a third worker node; what a drill leaves above two is retired (drained)
    afterwards, so that the next drill finds the cluster whole."""
    cluster.add_node()
    yield cluster
    for node in [node for node in cluster.nodes[1:] if node.alive][2:]:
        cluster.preempt_with_notice(node)
