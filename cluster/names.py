"""Namespaces and pod labels the in-cluster layers share, named once."""

from __future__ import annotations

KUBERAY_NAMESPACE = "kuberay-system"
GPU_NAMESPACE = "kube-system"
MONITORING_NAMESPACE = "monitoring"  # where Prometheus runs
APP_LABEL, APP = "app.kubernetes.io/name", "spotray"
COMPONENT_LABEL = "app.kubernetes.io/component"
TRAINING_COMPONENT = "training"  # Ray head and workers: the only pods that reach the object store
SUBMITTER_COMPONENT = "submitter"
_NAME_LABEL = "kubernetes.io/metadata.name"  # Kubernetes sets it on every namespace


def from_namespace(namespace: str) -> dict:
    """A NetworkPolicy peer: every pod of ``namespace``."""
    return {"namespaceSelector": {"matchLabels": namespace_labels(namespace)}}


def namespace_labels(namespace: str) -> dict:
    """The labels the chart policies (Bitnami ``ingressNSMatchLabels``) select ``namespace`` by."""
    return {_NAME_LABEL: namespace}
