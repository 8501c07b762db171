"""A pinned Helm chart as a Pulumi ``helm.v3.Release``, from an https repository or an OCI registry."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from infra.kernel.versions import Chart


def release(name: str, chart: Chart, namespace: str, values: dict, opts: pulumi.ResourceOptions,
            skip_crds: bool = False, release_name: str | None = None) -> k8s.helm.v3.Release:
    """The Helm release is named ``release_name``, or else after the chart: never a generated name, so that
    objects that refer to what it creates, and ``spotray render``, can name it. ``namespace`` must exist: spotray
    creates each of its namespaces with Pod Security labels (``namespaces.py``), which Helm's would lack."""
    source = ({"chart": f"{chart.repo}/{chart.name}"} if chart.repo.startswith("oci://")
              else {"chart": chart.name, "repository_opts": {"repo": chart.repo}})
    return k8s.helm.v3.Release(name, **source, name=release_name or chart.name, version=chart.version,
                               namespace=namespace, skip_crds=skip_crds, values=values,
                               opts=opts)
