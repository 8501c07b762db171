"""The one place a manifest dict from a pure builder becomes a Pulumi Kubernetes resource."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s


def from_manifest(name: str, manifest: dict, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """A ConfigMap, or a custom resource (RayJob, PodMonitor, PrometheusRule)."""
    if manifest["kind"] == "ConfigMap":
        return k8s.core.v1.ConfigMap(name, metadata=manifest["metadata"], data=manifest["data"], opts=opts)
    return k8s.apiextensions.CustomResource(name, api_version=manifest["apiVersion"], kind=manifest["kind"],
                                            metadata=manifest["metadata"], spec=manifest["spec"], opts=opts)
