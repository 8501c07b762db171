"""Where the layers' plain data becomes Pulumi Kubernetes resources: a manifest from a pure builder, and a
Secret whose values Pulumi generated."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s


def from_manifest(name: str, manifest: dict, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """A ConfigMap, or a custom resource (RayJob, PodMonitor, PrometheusRule)."""
    if manifest["kind"] == "ConfigMap":
        return k8s.core.v1.ConfigMap(name, metadata=manifest["metadata"], data=manifest["data"], opts=opts)
    return k8s.apiextensions.CustomResource(name, api_version=manifest["apiVersion"], kind=manifest["kind"],
                                            metadata=manifest["metadata"], spec=manifest["spec"], opts=opts)


def generated_secret(name: str, secret_name: str, namespace: str, data: dict,
                     opts: pulumi.ResourceOptions) -> k8s.core.v1.Secret:
    """Marked secret, so the values never show in a plan or an output."""
    return k8s.core.v1.Secret(name, metadata={"name": secret_name, "namespace": namespace}, type="Opaque",
                              string_data={k: pulumi.Output.secret(v) for k, v in data.items()}, opts=opts)
