"""NetworkPolicies of the training namespace as plain data. A Ray head is reached only by the Ray pods, the job
submitter, the KubeRay operator (job status over the dashboard) and Prometheus; a Ray worker only by the Ray pods
and Prometheus; the job submitter and the warm spares by nothing. MinIO's own policy lives in its chart values
(``cluster/charts.py``)."""

from __future__ import annotations

from infra.kernel.names import (
    APP,
    APP_LABEL,
    COMPONENT_LABEL,
    KUBERAY_NAMESPACE,
    METRICS_PORTS,
    MONITORING_NAMESPACE,
    SUBMITTER_COMPONENT,
    TRAINING_COMPONENT,
    WARM_SPARE_COMPONENT,
    from_namespace,
)

RAY_NODE_LABEL = "ray.io/is-ray-node"  # KubeRay puts it on every head and worker pod


def ray_head_policy(namespace: str, monitoring_namespace: str = MONITORING_NAMESPACE) -> dict:
    metrics = [{"protocol": "TCP", "port": p["name"]} for p in METRICS_PORTS["head"]]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "ray-head", "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": {"ray.io/node-type": "head"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {RAY_NODE_LABEL: "yes"}}},
                          {"podSelector": {"matchLabels": {APP_LABEL: APP}}}]},
                {"from": [from_namespace(KUBERAY_NAMESPACE)], "ports": [{"protocol": "TCP", "port": "dashboard"}]},
                {"from": [from_namespace(monitoring_namespace)], "ports": metrics},
            ],
        },
    }


def ray_pods_policy(namespace: str, monitoring_namespace: str = MONITORING_NAMESPACE) -> dict:
    """Every Ray pod of a job (the head too, whose own policy adds KubeRay and the submitter): the other Ray pods
    (GCS, object transfers, dashboard agents) and Prometheus on the metrics ports."""
    metrics = [{"protocol": "TCP", "port": p["name"]} for p in METRICS_PORTS["worker"]]
    ray_pods = {"podSelector": {"matchLabels": {APP_LABEL: APP, COMPONENT_LABEL: TRAINING_COMPONENT}}}
    return _policy("ray-pods", namespace, ray_pods["podSelector"], [
        {"from": [{"podSelector": {"matchLabels": {RAY_NODE_LABEL: "yes"}}}, ray_pods]},
        {"from": [from_namespace(monitoring_namespace)], "ports": metrics},
    ])


def closed_policies(namespace: str) -> list[dict]:
    """The job submitter and the warm spares only connect out: nothing may connect to them."""
    return [_policy(component, namespace, {"matchLabels": {APP_LABEL: APP, COMPONENT_LABEL: component}}, [])
            for component in (SUBMITTER_COMPONENT, WARM_SPARE_COMPONENT)]


def _policy(name: str, namespace: str, selector: dict, ingress: list[dict]) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": ingress}}
