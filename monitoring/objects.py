"""What Prometheus and Grafana need from spotray, for the installed stack or one already on the cluster: the Ray
PodMonitors in the training namespace, the alert rules and the dashboards in the monitoring namespace."""

from __future__ import annotations

import pulumi

from infra.kernel.config import MonitoringConfig
from infra.kernel.resources import from_manifest
from monitoring.dashboards import all_dashboards, config_map
from monitoring.monitors import ray_pod_monitors
from monitoring.rules import prometheus_rule


def monitoring_manifests(cfg: MonitoringConfig, training_namespace: str) -> list[dict]:
    """Every object, as data (also what the tests validate)."""
    return [*ray_pod_monitors(training_namespace, cfg.monitor_labels),
            prometheus_rule(cfg.namespace, cfg.monitor_labels, cfg.alerts),
            *(config_map(board, cfg.namespace) for board in all_dashboards())]


class MonitoringObjects(pulumi.ComponentResource):
    def __init__(self, name: str, cfg: MonitoringConfig, training_namespace: str,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:monitoring:MonitoringObjects", name, None, opts)
        for manifest in monitoring_manifests(cfg, training_namespace):
            meta = manifest["metadata"]
            from_manifest(f"{name}-{meta['namespace']}-{manifest['kind'].lower()}-{meta['name']}", manifest,
                          pulumi.ResourceOptions(parent=self))
        self.register_outputs({})
