"""Who reaches a Ray head, a Ray worker, the submitter, a warm spare and MinIO: the policies evaluated against the
labels of the pods the builders make."""

import kubernetes_validate
import pytest

from cluster.charts import minio_values
from cluster.network_policy import RAY_NODE_LABEL, closed_policies, ray_head_policy, ray_pods_policy
from cluster.rayjob import JobSettings, rayjob
from cluster.warm_spares import warm_spares
from infra.kernel.config import GpuPoolConfig, MonitoringConfig, StorageConfig, TrainingJobConfig
from spotray.config import load

POLICY = ray_head_policy("spotray")
JOB = rayjob(load(None, ["run.name=gpt", "data.path=s3://b/d", "checkpoint.path=s3://b/c"]),
             JobSettings(image="r.example.com/spotray:1", gpu_pool="a10g-spot"))
SPEC = JOB["spec"]["rayClusterSpec"]
HEAD_PORTS = {p["name"] for p in SPEC["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
# KubeRay adds these to the pods it creates from the templates.
HEAD = {**SPEC["headGroupSpec"]["template"]["metadata"]["labels"], "ray.io/node-type": "head", RAY_NODE_LABEL: "yes"}
WORKER = {**SPEC["workerGroupSpecs"][0]["template"]["metadata"]["labels"], "ray.io/node-type": "worker",
          RAY_NODE_LABEL: "yes"}
SUBMITTER = JOB["spec"]["submitterPodTemplate"]["metadata"]["labels"]


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_admits(peer: dict, namespace: str, labels: dict, policy_namespace: str) -> bool:
    if "namespaceSelector" in peer:
        ns_ok = _matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
        return ns_ok and _matches(peer.get("podSelector", {}), labels)
    return namespace == policy_namespace and _matches(peer["podSelector"], labels)


def admits(policy: dict, namespace: str, labels: dict, port: str) -> bool:
    """Whether ``policy`` lets a pod (``namespace``, ``labels``) connect to ``port`` of the pods it selects."""
    for rule in policy["spec"]["ingress"]:
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        if any(_peer_admits(peer, namespace, labels, policy["metadata"]["namespace"]) for peer in rule["from"]):
            return True
    return False


def test_the_policy_is_a_valid_object_for_the_stacks_kubernetes():
    kubernetes_validate.validate(POLICY, "1.33.0", strict=True)


def test_it_selects_the_head_and_not_the_workers():
    selector = POLICY["spec"]["podSelector"]
    assert _matches(selector, HEAD) and not _matches(selector, WORKER)
    assert POLICY["spec"]["policyTypes"] == ["Ingress"]


@pytest.mark.parametrize("port", ["gcs", "dashboard", "client", "metrics"])
def test_ray_pods_and_the_submitter_reach_every_head_port(port):
    assert admits(POLICY, "spotray", WORKER, port)
    assert admits(POLICY, "spotray", SUBMITTER, port)


@pytest.mark.parametrize(("namespace", "port", "allowed"), [
    ("monitoring", "metrics", True), ("monitoring", "dash-metrics", True), ("monitoring", "as-metrics", True),
    ("monitoring", "dashboard", False), ("monitoring", "gcs", False),
    ("kuberay-system", "dashboard", True), ("kuberay-system", "client", False),
    ("default", "dashboard", False), ("default", "client", False), ("spotray", "client", False),
])
def test_everyone_else_reaches_only_what_they_need(namespace, port, allowed):
    assert admits(POLICY, namespace, {"app": "other"}, port) is allowed


def test_every_port_the_policy_names_is_a_named_port_of_the_head():
    named = {p["port"] for rule in POLICY["spec"]["ingress"] for p in rule.get("ports", [])}
    assert named <= HEAD_PORTS


def test_minio_admits_training_pods_and_prometheus_but_not_the_submitter_or_strangers():
    policy = minio_values("b", "spotray", StorageConfig(), MonitoringConfig(release="kps"))["networkPolicy"]
    assert policy["enabled"] is True and policy["allowExternal"] is False
    assert policy["addExternalClientAccess"] is False  # no label anyone may add opens it
    pods = policy["ingressPodMatchLabels"]
    assert _matches({"matchLabels": pods}, HEAD) and _matches({"matchLabels": pods}, WORKER)
    assert not _matches({"matchLabels": pods}, SUBMITTER)
    assert policy["ingressNSMatchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}


RAY_PODS = ray_pods_policy("spotray")


@pytest.mark.parametrize("port", ["metrics", "10002", "8076"])
def test_ray_pods_reach_each_other_on_any_port_and_prometheus_only_their_metrics(port):
    assert _matches(RAY_PODS["spec"]["podSelector"], WORKER) and _matches(RAY_PODS["spec"]["podSelector"], HEAD)
    assert admits(RAY_PODS, "spotray", HEAD, port) and admits(RAY_PODS, "spotray", WORKER, port)
    assert not admits(RAY_PODS, "spotray", SUBMITTER, port)
    assert admits(RAY_PODS, "monitoring", {}, port) == (port == "metrics")


def test_nothing_reaches_the_submitter_or_a_warm_spare():
    spare = warm_spares(GpuPoolConfig(name="a10g-spot", families=("g5",), warm_spares=1), TrainingJobConfig(),
                        "r.example.com/spotray:1", "spotray")["spec"]["template"]["metadata"]["labels"]
    policies = closed_policies("spotray")
    for labels in (SUBMITTER, spare):
        (policy,) = [p for p in policies if _matches(p["spec"]["podSelector"], labels)]
        assert policy["spec"]["policyTypes"] == ["Ingress"] and policy["spec"]["ingress"] == []
    for policy in (*policies, RAY_PODS):
        kubernetes_validate.validate(policy, "1.33.0", strict=True)
