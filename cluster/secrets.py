"""A Kubernetes Secret whose values Pulumi generated: marked secret, so they never show in a plan or output."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s


def generated_secret(name: str, secret_name: str, namespace: str, data: dict,
                     opts: pulumi.ResourceOptions) -> k8s.core.v1.Secret:
    return k8s.core.v1.Secret(name, metadata={"name": secret_name, "namespace": namespace}, type="Opaque",
                              string_data={k: pulumi.Output.secret(v) for k, v in data.items()}, opts=opts)
