"""The namespaces spotray creates, each labelled for Pod Security Admission: the level the API server enforces,
and the level it warns about and audits (the same, or stricter where a chart's pods are not known to meet it).
The namespace table in docs/security.md says the same."""

from __future__ import annotations

from dataclasses import dataclass

PSA_PREFIX = "pod-security.kubernetes.io"
RESTRICTED, BASELINE, PRIVILEGED = "restricted", "baseline", "privileged"


@dataclass(frozen=True)
class NamespaceLevel:
    enforce: str
    report: str  # what the API server warns about and audits
    why: str


TRAINING = NamespaceLevel(RESTRICTED, RESTRICTED, "spotray's Ray pods and MinIO meet it")
KUBERAY = NamespaceLevel(RESTRICTED, RESTRICTED, "the operator chart's defaults meet it")
SYSTEM = NamespaceLevel(PRIVILEGED, PRIVILEGED, "the NVIDIA device plugin, the DCGM exporter and the node exporter "
                                                "use the host's devices, network and file system")
MONITORING = NamespaceLevel(BASELINE, RESTRICTED, "kube-prometheus-stack's pods are not all checked against "
                                                  "restricted here: warnings and audit entries name any short of it")


def namespace(name: str, level: NamespaceLevel) -> dict:
    labels = {f"{PSA_PREFIX}/enforce": level.enforce, f"{PSA_PREFIX}/warn": level.report,
              f"{PSA_PREFIX}/audit": level.report}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
