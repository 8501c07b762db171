"""The driver's node watch over a hand-made ledger, with Ray's node table as ``ray.nodes()`` would give it: a lost node
ends the attempt that held it with Ray's reason, a spot interruption only where the node was spot. The drills check
the same against a real cluster's nodes (``tests/drills``)."""

from __future__ import annotations

import socket
import time

import pytest
import ray

from spotray.accounts import endings, ledger, node_records
from spotray.accounts.prices import price_book
from spotray.config import CostSection
from spotray.driver import node_watch
from spotray.driver.node_watch import NodeWatch, RayNode
from spotray.storage import resolve
from tests.training.accounts.test_node_records import EKS_NODE
from tests.training.accounts.test_node_records import api_server as api_server  # the fixture


@pytest.fixture
def root(tmp_path):
    return resolve(str(tmp_path / "attempts"))


def watch_with(monkeypatch, root, nodes: dict[str, RayNode]) -> NodeWatch:
    monkeypatch.setattr(node_watch, "ray_nodes", lambda: nodes)
    cost = CostSection()
    return NodeWatch(root, node_records.NodeRecorder(root, cost, price_book(cost, None)))


def held(root, attempt_id: str, nodes: list[str], started_at: float) -> None:
    ledger.write_attempt(root, ledger.AttemptInfo(attempt_id, 0, len(nodes), 4, started_at=started_at, nodes=nodes))


@pytest.mark.parametrize(("capacity_type", "reason", "kind"), [
    ("spot", "UNEXPECTED_TERMINATION", endings.KILL), (None, "AUTOSCALER_DRAIN_PREEMPTED", endings.KILL),
    ("on-demand", "UNEXPECTED_TERMINATION", endings.NODE_LOST), (None, "UNEXPECTED_TERMINATION", endings.NODE_LOST)])
def test_a_dead_node_ends_the_attempt_that_held_it_with_rays_reason(monkeypatch, root, capacity_type, reason, kind):
    held(root, "a", ["ray-1", "ray-2"], time.time())
    watch = watch_with(monkeypatch, root, {"ray-1": RayNode(True, None, capacity_type),
                                           "ray-2": RayNode(False, reason, capacity_type)})
    watch.poll(ledger.read_attempts(root))
    recorded = endings.read(root, "a")
    assert recorded is not None and recorded["kind"] == kind and reason in recorded["reason"]
    facts = node_records.read_nodes(root)
    assert facts["ray-2"].lost_reason == reason and facts["ray-1"].lost_at is None
    assert facts["ray-2"].capacity_type == capacity_type  # from the node's label in Ray, where it has one


def test_a_loss_seen_long_after_the_next_attempt_started_is_not_what_ended_the_attempt(monkeypatch, root):
    start = time.time() - 2 * node_watch.ATTRIBUTE_WITHIN_S
    held(root, "a", ["ray-1"], start - 100)
    held(root, "b", ["ray-3"], start)
    watch = watch_with(monkeypatch, root, {"ray-1": RayNode(False, "UNEXPECTED_TERMINATION", "spot"),
                                           "ray-3": RayNode(True, None, "spot")})
    watch.poll(ledger.read_attempts(root))
    assert endings.read(root, "a") is None
    assert node_records.read_nodes(root)["ray-1"].lost_reason == "UNEXPECTED_TERMINATION"


def test_without_ray_only_the_records_are_kept(monkeypatch, root):
    held(root, "a", ["ray-1"], time.time())
    watch = watch_with(monkeypatch, root, {})
    monkeypatch.setattr(node_watch, "ray_nodes", lambda: pytest.fail("asked Ray with the head maybe gone"))
    watch.poll(ledger.read_attempts(root), ask_ray=False)
    assert set(node_records.read_nodes(root)) == {"ray-1"} and endings.read(root, "a") is None


def test_on_kubernetes_a_listed_spot_node_that_vanishes_is_a_spot_interruption(monkeypatch, root, api_server):
    """The API server on loopback of ``test_node_records`` lists the Karpenter spot node, then no longer does."""
    name = EKS_NODE["metadata"]["name"]
    held(root, "a", [name], time.time())
    watch = watch_with(monkeypatch, root, {})
    monkeypatch.setattr(node_watch, "ray_nodes", lambda: pytest.fail("on Kubernetes the evidence is the node"))
    watch.poll(ledger.read_attempts(root))
    assert endings.read(root, "a") is None and node_records.read_nodes(root)[name].capacity_type == "spot"
    api_server.nodes[name] = {**EKS_NODE, "spec": {**EKS_NODE["spec"], "taints": [
        *EKS_NODE["spec"]["taints"], {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}
    monkeypatch.setattr(node_watch, "KUBERNETES_EVERY_S", 0.0)
    watch.poll(ledger.read_attempts(root))
    del api_server.nodes[name]
    watch.poll(ledger.read_attempts(root))
    recorded = endings.read(root, "a")
    assert recorded is not None and recorded["kind"] == endings.KILL, recorded
    assert "vanished from Kubernetes (taints when last listed: karpenter.sh/disrupted, nvidia.com/gpu)" in (
        recorded["reason"])


def test_on_kubernetes_a_node_never_listed_is_not_taken_for_lost(monkeypatch, root, api_server):
    held(root, "a", ["ip-10-0-9-9.ec2.internal"], time.time())  # gone before this driver listed anything
    watch_with(monkeypatch, root, {}).poll(ledger.read_attempts(root))
    assert endings.read(root, "a") is None


def all_lost(names: set[str]) -> set[str]:
    return names


def test_a_finished_run_awaits_only_the_evidence_on_nodes_lost_by_its_own_ended_attempts(monkeypatch, root):
    since = time.time()
    held(root, "before", ["ray-0"], since - 60)  # an earlier driver's: reported then
    held(root, "a", ["ray-1", "ray-2"], since + 1)
    held(root, "b", ["ray-3"], since + 2)
    endings.record(root, "b", endings.KILL, "on record")
    held(root, "c", ["ray-4"], since + 3)  # the newest: it finished
    assert node_watch.awaiting_evidence(root, since, all_lost) == ["ray-1", "ray-2"]
    assert node_watch.awaiting_evidence(root, since, lambda names: names & {"ray-2"}) == ["ray-2"]
    watch = watch_with(monkeypatch, root, {"ray-2": RayNode(False, "UNEXPECTED_TERMINATION", "spot")})
    watch.poll(ledger.read_attempts(root))  # the progress monitor's, once Ray marked the node dead
    assert node_watch.awaiting_evidence(root, since, all_lost) == []


def test_on_kubernetes_a_finished_run_awaits_a_listed_node_that_vanished_not_one_never_listed(monkeypatch, root,
                                                                                               api_server):
    """Kubernetes's node names are not Ray's: there the end-of-run wait asks the node list, as the watch does."""
    name, never_listed = EKS_NODE["metadata"]["name"], "ip-10-0-9-9.ec2.internal"
    since = time.time()
    held(root, "a", [name, never_listed], since + 1)
    held(root, "b", ["ip-10-0-7-7.ec2.internal"], since + 2)  # the newest: it finished
    watch = watch_with(monkeypatch, root, {})
    monkeypatch.setattr(node_watch, "ray_nodes", lambda: pytest.fail("on Kubernetes the evidence is the node"))
    monkeypatch.setattr(node_watch, "KUBERNETES_EVERY_S", 0.0)
    watch.poll(ledger.read_attempts(root))
    assert node_watch.awaiting_evidence(root, since, watch.gone) == []
    del api_server.nodes[name]
    assert node_watch.awaiting_evidence(root, since, watch.gone) == [name]
    watch.poll(ledger.read_attempts(root))  # the progress monitor's next look records it
    recorded = endings.read(root, "a")
    assert recorded is not None and recorded["kind"] == endings.KILL
    assert node_watch.awaiting_evidence(root, since, watch.gone) == []


def test_lost_nodes_are_the_ones_ray_lists_dead_and_the_ones_whose_raylet_takes_no_connection(monkeypatch):
    answering = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()

    def node(node_id: str, alive: bool, port: int) -> dict:
        return {"NodeID": node_id * 12, "Alive": alive, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port}

    with answering:
        monkeypatch.setattr(ray, "nodes", lambda: [node("a", True, answering.getsockname()[1]),
                                                   node("b", True, closed_port), node("c", False, closed_port),
                                                   node("e", True, closed_port)])
        names = {node_records.ray_node_name(i * 12) for i in "abcd"}
        assert node_watch.lost_ray_nodes(names) == {"ray-bbbbbbbbbbbb", "ray-cccccccccccc"}


def test_without_rays_node_table_no_node_is_lost(monkeypatch):
    def unanswered():
        raise ray.exceptions.RaySystemError("the GCS did not answer")

    monkeypatch.setattr(ray, "nodes", unanswered)
    assert node_watch.lost_ray_nodes({"ray-aaaaaaaaaaaa"}) == set()
