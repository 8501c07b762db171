"""NetworkPolicies of the training namespace as plain data. A Ray head is reached only by the Ray pods, the job
submitter, the KubeRay operator (job status over the dashboard) and Prometheus; MinIO's own policy lives in its
chart values (``cluster/charts.py``)."""

from __future__ import annotations

from spotray.infra.kernel.names import (
    APP,
    APP_LABEL,
    KUBERAY_NAMESPACE,
    METRICS_PORTS,
    MONITORING_NAMESPACE,
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
