"""Scrape targets for the Ray pods of a RayJob, as PodMonitor dicts. The add-ons (KubeRay, MinIO, DCGM) bring their
own ServiceMonitors through their charts (``cluster/charts.py``)."""

from __future__ import annotations

from infra.kernel.names import METRICS_PORTS

MONITORING_API = "monitoring.coreos.com/v1"
SCRAPE_INTERVAL = "15s"

# Pod labels KubeRay sets, and the target labels Prometheus keeps from them. Ray's dashboards filter on
# ``ray_io_cluster``; the alert for a lost head needs the node type.
POD_LABEL_TO_TARGET_LABEL = {"ray.io/cluster": "ray_io_cluster", "ray.io/node-type": "ray_node_type"}


def relabelings() -> list[dict]:
    """Target relabelling shared by both PodMonitors (and by the local Prometheus of the end-to-end test)."""
    return [{"sourceLabels": [f"__meta_kubernetes_pod_label_{_sanitized(pod_label)}"], "targetLabel": target}
            for pod_label, target in POD_LABEL_TO_TARGET_LABEL.items()]


def ray_pod_monitors(namespace: str, monitor_labels: dict[str, str]) -> list[dict]:
    """One PodMonitor per Ray node type, selecting KubeRay's ``ray.io/node-type`` label, on every metrics port
    the RayJob builder names for that node type."""
    return [_pod_monitor(f"ray-{node_type}", namespace, monitor_labels, node_type, [p["name"] for p in ports])
            for node_type, ports in METRICS_PORTS.items()]


def _pod_monitor(name: str, namespace: str, labels: dict[str, str], node_type: str, ports: list[str]) -> dict:
    return {
        "apiVersion": MONITORING_API, "kind": "PodMonitor",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": {"ray.io/node-type": node_type}},
            "namespaceSelector": {"matchNames": [namespace]},
            "podMetricsEndpoints": [{"port": port, "interval": SCRAPE_INTERVAL, "relabelings": relabelings()}
                                    for port in ports],
        },
    }


def _sanitized(label: str) -> str:
    """How Prometheus' Kubernetes discovery names a pod label in ``__meta_kubernetes_pod_label_*``."""
    return "".join(c if c.isalnum() else "_" for c in label)
