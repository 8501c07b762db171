"""What a node is, read from a node object as the Kubernetes API returns it or from the config, and priced once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from spotray import config
from spotray.accounts import node_records
from spotray.accounts.prices import price_book
from spotray.storage import resolve

# GET /api/v1/nodes/NAME of a Karpenter-launched EKS GPU node (trimmed of annotations and conditions).
EKS_NODE: dict[str, Any] = {
    "kind": "Node", "apiVersion": "v1",
    "metadata": {
        "name": "ip-10-0-113-27.ec2.internal", "uid": "1f0c4c8e-9d1b-4d0b-8a52-3f3a9e8c2b11",
        "resourceVersion": "2213154", "creationTimestamp": "2026-11-25T08:14:03Z",
        "labels": {
            "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": "g5.12xlarge",
            "karpenter.k8s.aws/instance-family": "g5", "karpenter.k8s.aws/instance-gpu-count": "4",
            "karpenter.sh/capacity-type": "spot", "karpenter.sh/nodepool": "a10g-spot",
            "kubernetes.io/hostname": "ip-10-0-113-27.ec2.internal", "node.kubernetes.io/instance-type": "g5.12xlarge",
            "topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": "us-east-1b",
        },
    },
    "spec": {"providerID": "aws:///us-east-1b/i-0a1b2c3d4e5f67890",
             "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
    "status": {"capacity": {"cpu": "48", "ephemeral-storage": "104845292Ki", "memory": "195968372Ki",
                            "nvidia.com/gpu": "4", "pods": "737"},
               "allocatable": {"cpu": "47810m", "memory": "192637812Ki", "nvidia.com/gpu": "4", "pods": "737"}},
}


def test_a_node_object_gives_instance_type_capacity_type_zone_creation_and_gpus():
    facts = node_records.facts_from_node_object(EKS_NODE)
    assert (facts.name, facts.instance_type, facts.capacity_type, facts.zone, facts.gpus) == (
        "ip-10-0-113-27.ec2.internal", "g5.12xlarge", "spot", "us-east-1b", 4)
    assert facts.created_at == pytest.approx(1795594443.0)


def test_a_node_without_karpenters_labels_is_unknown_where_they_are_missing():
    bare = {"metadata": {"name": "n", "labels": {"node.kubernetes.io/instance-type": "m6i.large"}}, "status": {}}
    facts = node_records.facts_from_node_object(bare)
    assert facts.instance_type == "m6i.large" and facts.capacity_type is None and facts.gpus is None


def test_off_kubernetes_the_recorder_takes_the_configured_node_and_prices_it_once(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cost = config.CostSection(prices={"g5.xlarge": {"spot": 0.45, "on-demand": 1.006}},
                              node=config.NodeSection("g5.xlarge", "spot"), example_prices=True, warm_spares=1)
    root = resolve(str(tmp_path))
    recorder = node_records.NodeRecorder(root, cost, price_book(cost, None))
    recorder.record({"ray-a", "ray-b"})
    recorded = node_records.read_nodes(root)
    assert set(recorded) == {"ray-a", "ray-b"}
    assert recorded["ray-a"].usd_per_hour == 0.45 and recorded["ray-a"].on_demand_usd_per_hour == 1.006
    assert node_records.read_cost_settings(root) == {"example_prices": True, "warm_spares": 1, "head": None,
                                                     "core": None, "core_nodes": 0}
    (tmp_path / node_records.NODES_FILE).write_text(json.dumps({}))  # a node already known is not looked up again
    recorder.record({"ray-a"})
    assert node_records.read_nodes(root) == {}


def test_a_node_nothing_describes_is_recorded_unpriced(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cost = config.CostSection()
    root = resolve(str(tmp_path))
    node_records.NodeRecorder(root, cost, price_book(cost, None)).record({"ray-a"})
    assert node_records.read_nodes(root)["ray-a"].usd_per_hour is None


@dataclass
class ApiServer:
    seen: list[tuple[str, str]]  # (path, Authorization) of each request
    nodes: dict[str, dict]  # what the cluster has now, by name


@pytest.fixture
def api_server(tmp_path, monkeypatch):
    """An HTTPS server on loopback standing in for the API server, and a pod's service account directory."""
    import http.server
    import ssl
    import subprocess
    import threading

    account = tmp_path / "serviceaccount"
    account.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kube",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(account / "ca.crt")], check=True, capture_output=True)
    (account / "token").write_text("pod-token\n")
    api = ApiServer([], {EKS_NODE["metadata"]["name"]: EKS_NODE})

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            api.seen.append((self.path, self.headers["Authorization"]))
            name = self.path.removeprefix("/api/v1/nodes/")
            known = self.path == "/api/v1/nodes" or name in api.nodes
            body = json.dumps({"kind": "NodeList", "apiVersion": "v1", "items": list(api.nodes.values())}
                              if self.path == "/api/v1/nodes" else api.nodes.get(name)
                              or {"kind": "Status", "code": 404}).encode()
            self.send_response(200 if known else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(account / "ca.crt", tmp_path / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(node_records, "_SERVICE_ACCOUNT", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.server_address[1]))
    yield api
    server.shutdown()


def test_on_kubernetes_the_node_is_read_with_the_pods_service_account(api_server):
    assert node_records.in_kubernetes()
    facts = node_records.kubernetes_node(EKS_NODE["metadata"]["name"])
    assert facts is not None
    assert facts.instance_type == "g5.12xlarge" and facts.zone == "us-east-1b"
    assert api_server.seen == [(f"/api/v1/nodes/{EKS_NODE['metadata']['name']}", "Bearer pod-token")]


def test_on_kubernetes_the_nodes_are_listed_by_name(api_server):
    listed = node_records.kubernetes_nodes()
    assert listed is not None and list(listed) == [EKS_NODE["metadata"]["name"]]
    assert node_records.taint_keys(listed[EKS_NODE["metadata"]["name"]]) == ["nvidia.com/gpu"]
    assert api_server.seen == [("/api/v1/nodes", "Bearer pod-token")]


def test_a_node_the_api_does_not_return_is_unknown_with_a_warning_naming_the_role(api_server, caplog):
    assert node_records.kubernetes_node("gone") is None
    assert "spotray-node-reader" in caplog.text
