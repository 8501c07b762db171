"""Every name more than one layer uses: namespaces, service accounts, pod and node labels, taints, ports, the
object store's address. Values only; changing one changes what is deployed."""

from __future__ import annotations

from typing import Any

from infra.kernel.versions import KUBE_PROMETHEUS_STACK

# Namespaces
TRAINING_NAMESPACE = "spotray"  # where training runs (and MinIO lives)
MONITORING_NAMESPACE = "monitoring"  # where Prometheus runs
KUBERAY_NAMESPACE = "kuberay-system"
SYSTEM_NAMESPACE = "spotray-system"  # what must touch the host: NVIDIA device plugin, DCGM and node exporters
_NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # Kubernetes sets it on every namespace

# The service accounts Pod Identity maps to the bucket prefix: the Ray workers' (and the job submitter's), and the
# Ray head's, which alone may also read nodes (the driver looks up what its workers run on)
TRAINING_SERVICE_ACCOUNT = "spotray-training"
HEAD_SERVICE_ACCOUNT = "spotray-head"
NODE_READER_ROLE = "spotray-node-reader"  # ClusterRole: get and list on nodes, nothing else

# Pod labels
APP_LABEL, APP = "app.kubernetes.io/name", "spotray"
COMPONENT_LABEL = "app.kubernetes.io/component"
TRAINING_COMPONENT = "training"  # Ray head and workers: the only pods that reach the object store
SUBMITTER_COMPONENT = "submitter"
WARM_SPARE_COMPONENT = "warm-spare"

# Priorities on the GPU nodes: training workers evict warm spares (cluster/warm_spares.py)
TRAINING_PRIORITY_CLASS = "spotray-training"
WARM_SPARE_PRIORITY_CLASS = "spotray-warm-spare"

# Node pools: labels, the GPU taint, and how AWS resources are found by Karpenter
POOL_LABEL = "spotray.dev/pool"
CORE_POOL = "core"  # the on-demand managed node group
CORE_SELECTOR = {POOL_LABEL: CORE_POOL}
GPU_LABEL = "spotray.dev/gpu"
ON_DEMAND_FALLBACK_LABEL = "spotray.dev/on-demand-fallback"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}
DISCOVERY_TAG = "karpenter.sh/discovery"

# Ray's metrics endpoints by node type, named as the PodMonitors and NetworkPolicies refer to them
METRICS_PORTS: dict[str, list[dict[str, Any]]] = {
    "head": [{"name": "metrics", "containerPort": 8080}, {"name": "as-metrics", "containerPort": 44217},
             {"name": "dash-metrics", "containerPort": 44227}],
    "worker": [{"name": "metrics", "containerPort": 8080}],
}

# The in-cluster object store
MINIO_RELEASE = "minio"  # the chart names its Service after the release
MINIO_CA_SECRET = f"{MINIO_RELEASE}-crt"  # the chart's generated certificate: ca.crt, tls.crt, tls.key
MINIO_PORT = 9000


# kube-prometheus-stack's Prometheus Service: named after the chart's fullname (the release's name if it holds the
# chart's, else <release>-kube-prometheus-stack, cut to 26 characters) plus -prometheus, on the chart's port
PROMETHEUS_PORT = 9090


def prometheus_url(release: str, namespace: str) -> str:
    chart = KUBE_PROMETHEUS_STACK.name
    fullname = release if chart in release else f"{release}-{chart}"
    return f"http://{fullname[:26].rstrip('-')}-prometheus.{namespace}.svc.cluster.local:{PROMETHEUS_PORT}"


def minio_host(namespace: str) -> str:
    return f"{MINIO_RELEASE}.{namespace}.svc.cluster.local"


def minio_endpoint(namespace: str) -> str:
    """TLS, with the certificate the chart generates: ``MINIO_CA_SECRET``'s ``ca.crt`` signed it."""
    return f"https://{minio_host(namespace)}:{MINIO_PORT}"


def datasets_bucket(bucket: str) -> str:
    """MinIO's second bucket: datasets, unversioned, beside the versioned checkpoint bucket."""
    return f"{bucket}-datasets"


def namespace_labels(namespace: str) -> dict:
    """The labels that select ``namespace`` (a NetworkPolicy peer, Bitnami's ``ingressNSMatchLabels``)."""
    return {_NAMESPACE_NAME_LABEL: namespace}


def from_namespace(namespace: str) -> dict:
    """A NetworkPolicy peer: every pod of ``namespace``."""
    return {"namespaceSelector": {"matchLabels": namespace_labels(namespace)}}

# GitHub Actions' OIDC issuer, and the audience its tokens carry for AWS STS.
GITHUB_OIDC_HOST = "token.actions.githubusercontent.com"
GITHUB_OIDC_AUDIENCE = "sts.amazonaws.com"

# In-cluster GitOps: the branch the program deploys from, the environment branch each stack's render is published
# to (in promotion order), and where each controller keeps its objects.
PROGRAM_BRANCH = "main"
ARGOCD_NAMESPACE = "argocd"
FLUX_NAMESPACE = "flux-system"
PULUMI_OPERATOR_NAMESPACE = "pulumi-kubernetes-operator"


def render_branch(stack: str) -> str:
    return f"rendered/{stack}"
