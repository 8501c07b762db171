"""Kubernetes RBAC of the training namespace as plain data: the Ray head's own service account, and the one right
beyond its namespace that it needs: reading nodes (``get`` and ``list``), so that the driver can read what each
worker runs on (instance type, capacity type, zone: the labels Karpenter and EKS set) to price the run, and see a
node the run holds vanish (the evidence that a spot interruption ended an attempt). Workers and the job submitter
keep the training service account, which may read nothing of the cluster."""

from __future__ import annotations

from infra.kernel.names import APP, APP_LABEL, HEAD_SERVICE_ACCOUNT, NODE_READER_ROLE

RBAC_API = "rbac.authorization.k8s.io"
NODE_READER_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]


def _labels() -> dict[str, str]:
    return {APP_LABEL: APP}


def head_service_account(namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": HEAD_SERVICE_ACCOUNT, "namespace": namespace, "labels": _labels()}}


def node_reader_role() -> dict:
    return {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
            "metadata": {"name": NODE_READER_ROLE, "labels": _labels()},
            "rules": [dict(rule) for rule in NODE_READER_RULES]}


def node_reader_binding(namespace: str) -> dict:
    """Cluster-wide (nodes are not namespaced), to the head's service account of ``namespace`` only."""
    return {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{NODE_READER_ROLE}-{namespace}", "labels": _labels()},
            "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole", "name": NODE_READER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": HEAD_SERVICE_ACCOUNT, "namespace": namespace}]}


def head_access(namespace: str) -> list[dict]:
    """The head's service account, the node reader role and its binding, in the order they are applied."""
    return [head_service_account(namespace), node_reader_role(), node_reader_binding(namespace)]
