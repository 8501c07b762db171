"""The KubeRay operator (CRDs applied server-side first), the privileged system namespace and the GPU plumbing
(NVIDIA device plugin, DCGM exporter) in it, as components over the values builders in ``cluster/charts.py``."""

from __future__ import annotations

from collections.abc import Mapping

import pulumi
import pulumi_kubernetes as k8s

from cluster.charts import dcgm_exporter_values, device_plugin_values, kuberay_operator_values
from infra.kernel import helm
from infra.kernel.names import GPU_TOLERATION, KUBERAY_NAMESPACE, SYSTEM_NAMESPACE
from infra.kernel.namespaces import KUBERAY, SYSTEM, namespace
from infra.kernel.resources import from_manifest
from infra.kernel.versions import DCGM_EXPORTER, KUBERAY_CRDS, KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN


class KubeRayOperator(pulumi.ComponentResource):
    def __init__(self, name: str, monitor_labels: Mapping[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:cluster:KubeRayOperator", name, None, opts)
        # The provider applies server-side (its default), which CRDs of this size need.
        crds = [k8s.yaml.v2.ConfigFile(f"{name}-crd-{url.rsplit('_', 1)[1].removesuffix('.yaml')}", file=url,
                                       opts=pulumi.ResourceOptions(parent=self)) for url in KUBERAY_CRDS]
        labelled = from_manifest(f"{name}-namespace", namespace(KUBERAY_NAMESPACE, KUBERAY),
                                 pulumi.ResourceOptions(parent=self))
        self.release = helm.release(f"{name}-chart", KUBERAY_OPERATOR, KUBERAY_NAMESPACE,
                                    kuberay_operator_values(monitor_labels),
                                    pulumi.ResourceOptions(parent=self, depends_on=[*crds, labelled]), skip_crds=True)
        self.register_outputs({"release": self.release.name})


class SystemNamespace(pulumi.ComponentResource):
    """The privileged namespace of what must touch the host: the GPU plumbing and monitoring's node exporter."""

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:cluster:SystemNamespace", name, None, opts)
        self.namespace = from_manifest(f"{name}-namespace", namespace(SYSTEM_NAMESPACE, SYSTEM),
                                       pulumi.ResourceOptions(parent=self))
        self.register_outputs({"namespace": SYSTEM_NAMESPACE})


class GpuPlumbing(pulumi.ComponentResource):
    """In ``SYSTEM_NAMESPACE``, which ``SystemNamespace`` creates."""

    def __init__(self, name: str, monitor_labels: Mapping[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:cluster:GpuPlumbing", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        helm.release(f"{name}-device-plugin", NVIDIA_DEVICE_PLUGIN, SYSTEM_NAMESPACE, device_plugin_values(), child)
        helm.release(f"{name}-dcgm-exporter", DCGM_EXPORTER, SYSTEM_NAMESPACE, dcgm_exporter_values(monitor_labels),
                     child)
        self.register_outputs({"toleration": GPU_TOLERATION})
