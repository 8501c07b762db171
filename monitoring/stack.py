"""kube-prometheus-stack (``monitoring.mode: install``): its namespace, a generated Grafana admin Secret, and the
pinned chart, whose CRDs every ServiceMonitor and PodMonitor of the stack needs."""

from __future__ import annotations

import pulumi
import pulumi_random as random

from infra.kernel import helm
from infra.kernel.config import MonitoringConfig
from infra.kernel.namespaces import MONITORING
from infra.kernel.namespaces import namespace as labelled_namespace
from infra.kernel.resources import from_manifest, generated_secret
from infra.kernel.versions import KUBE_PROMETHEUS_STACK
from monitoring.values import GRAFANA_ADMIN_SECRET, kube_prometheus_stack_values


class MonitoringStack(pulumi.ComponentResource):
    def __init__(self, name: str, cfg: MonitoringConfig, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:monitoring:MonitoringStack", name, None, opts)
        namespace = from_manifest(f"{name}-namespace", labelled_namespace(cfg.namespace, MONITORING),
                                  pulumi.ResourceOptions(parent=self))
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[namespace])
        password = random.RandomPassword(f"{name}-grafana-password", length=32, special=False,
                                         opts=pulumi.ResourceOptions(parent=self))
        admin = generated_secret(f"{name}-grafana-admin", GRAFANA_ADMIN_SECRET, cfg.namespace,
                                 {"admin-user": "admin", "admin-password": password.result}, in_namespace)
        self.release = helm.release(f"{name}-chart", KUBE_PROMETHEUS_STACK, cfg.namespace,
                                    kube_prometheus_stack_values(cfg),
                                    pulumi.ResourceOptions(parent=self, depends_on=[admin]), release_name=cfg.release)
        self.register_outputs({"release": self.release.name})
