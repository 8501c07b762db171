"""The training namespace (its service accounts, the Ray head's right to read nodes, the NetworkPolicies and
the training and warm-spare priorities), and the training RayJob with its config map, from the pure builders in
``cluster/rayjob.py``, ``cluster/rbac.py``, ``cluster/network_policy.py`` and ``cluster/warm_spares.py``."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from cluster.network_policy import closed_policies, ray_head_policy, ray_pods_policy
from cluster.rayjob import JobSettings, config_map, rayjob
from cluster.rbac import head_access
from cluster.warm_spares import priority_classes
from infra.kernel.namespaces import TRAINING
from infra.kernel.namespaces import namespace as labelled_namespace
from infra.kernel.resources import from_manifest
from spotray.config import TrainConfig


class TrainingNamespace(pulumi.ComponentResource):
    """Where training runs and MinIO lives; its service accounts are the ones Pod Identity maps to the bucket (the
    Ray head's may also get nodes), and its NetworkPolicies (``cluster/network_policy.py``) say who may reach each
    of spotray's pods. Training workers run at a priority above the warm spares'."""

    def __init__(self, name: str, namespace: str, service_account: str, monitoring_namespace: str,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:cluster:TrainingNamespace", name, None, opts)
        self.namespace = from_manifest(f"{name}-namespace", labelled_namespace(namespace, TRAINING),
                                       pulumi.ResourceOptions(parent=self))
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-service-account", metadata={"name": service_account, "namespace": namespace},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.namespace]))
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[self.namespace])
        for manifest in head_access(namespace):
            from_manifest(f"{name}-{manifest['kind'].lower()}-{manifest['metadata']['name']}", manifest,
                          in_namespace)
        policies = [ray_head_policy(namespace, monitoring_namespace), ray_pods_policy(namespace, monitoring_namespace),
                    *closed_policies(namespace)]
        for policy in policies:
            k8s.networking.v1.NetworkPolicy(f"{name}-{policy['metadata']['name']}-policy", metadata=policy["metadata"],
                                            spec=policy["spec"], opts=in_namespace)
        for priority_class in priority_classes():
            from_manifest(f"{name}-{priority_class['metadata']['name']}", priority_class,
                          pulumi.ResourceOptions(parent=self))
        self.register_outputs({"namespace": namespace})


class TrainingJob(pulumi.ComponentResource):
    def __init__(self, name: str, train: TrainConfig, settings: JobSettings,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:cluster:TrainingJob", name, None, opts)
        manifest = rayjob(train, settings)  # validates before anything is created
        config = from_manifest(f"{name}-config", config_map(train, settings), pulumi.ResourceOptions(parent=self))
        job = from_manifest(name, manifest, pulumi.ResourceOptions(parent=self, depends_on=[config]))
        self.job_name = manifest["metadata"]["name"]
        uid = job.metadata.apply(lambda m: m.get("uid"))  # type: ignore[attr-defined]  # outputs are set at run time
        self.register_outputs({"job_name": self.job_name, "uid": uid})
