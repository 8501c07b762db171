"""Where the layers' plain data becomes Pulumi Kubernetes resources: a manifest from a pure builder, and a
Secret whose values Pulumi generated."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s


def from_manifest(name: str, manifest: dict, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """A Namespace, ConfigMap, Deployment, PriorityClass, ServiceAccount, ClusterRole or ClusterRoleBinding, or a custom
    resource (RayJob, PodMonitor, PrometheusRule)."""
    kind, metadata = manifest["kind"], manifest["metadata"]
    if kind == "Namespace":
        return k8s.core.v1.Namespace(name, metadata=metadata, opts=opts)
    if kind == "ServiceAccount":
        return k8s.core.v1.ServiceAccount(name, metadata=metadata, opts=opts)
    if kind == "ClusterRole":
        return k8s.rbac.v1.ClusterRole(name, metadata=metadata, rules=manifest["rules"], opts=opts)
    if kind == "ClusterRoleBinding":
        return k8s.rbac.v1.ClusterRoleBinding(name, metadata=metadata, role_ref=manifest["roleRef"],
                                              subjects=manifest["subjects"], opts=opts)
    if kind == "ConfigMap":
        return k8s.core.v1.ConfigMap(name, metadata=metadata, data=manifest["data"], opts=opts)
    if kind == "Deployment":
        return k8s.apps.v1.Deployment(name, metadata=metadata, spec=manifest["spec"], opts=opts)
    if kind == "PriorityClass":
        return k8s.scheduling.v1.PriorityClass(name, metadata=metadata, value=manifest["value"],
                                               global_default=manifest["globalDefault"],
                                               description=manifest["description"],
                                               preemption_policy=manifest.get("preemptionPolicy"), opts=opts)
    return k8s.apiextensions.CustomResource(name, api_version=manifest["apiVersion"], kind=manifest["kind"],
                                            metadata=manifest["metadata"], spec=manifest["spec"], opts=opts)


def generated_secret(name: str, secret_name: str, namespace: str, data: dict,
                     opts: pulumi.ResourceOptions) -> k8s.core.v1.Secret:
    """Marked secret, so the values never show in a plan or an output."""
    return k8s.core.v1.Secret(name, metadata={"name": secret_name, "namespace": namespace}, type="Opaque",
                              string_data={k: pulumi.Output.secret(v) for k, v in data.items()}, opts=opts)
