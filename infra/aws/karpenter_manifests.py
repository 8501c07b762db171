"""Karpenter objects as plain data: one ``EC2NodeClass`` for GPU nodes and one ``NodePool`` per GPU pool.

Pure functions, shared by the Pulumi component and ``spotray render``; tests validate them against the
Karpenter v1.14.1 CRD schemas."""

from __future__ import annotations

from infra.kernel.config import GpuPoolConfig
from infra.kernel.names import DISCOVERY_TAG, GPU_LABEL, GPU_TAINT, ON_DEMAND_FALLBACK_LABEL, POOL_LABEL
from infra.kernel.versions import NODE_AMI_ALIAS


def ec2_node_class(name: str, cluster_name: str, node_role: str, tags: dict[str, str],
                   disk_gib: int = 200) -> dict:
    """GPU nodes: private subnets and the node security group found by the cluster's discovery tag, an
    encrypted gp3 root volume large enough for CUDA images, and IMDSv2 only, unreachable from pods."""
    return {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": name},
        "spec": {
            "role": node_role,
            "amiSelectorTerms": [{"alias": NODE_AMI_ALIAS}],
            "subnetSelectorTerms": [{"tags": {DISCOVERY_TAG: cluster_name}}],
            "securityGroupSelectorTerms": [{"tags": {DISCOVERY_TAG: cluster_name}}],
            "blockDeviceMappings": [{
                "deviceName": "/dev/xvda",
                "ebs": {"volumeSize": f"{disk_gib}Gi", "volumeType": "gp3", "encrypted": True,
                        "deleteOnTermination": True},
            }],
            "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1},
            "tags": dict(tags),
        },
    }


def gpu_node_pool(pool: GpuPoolConfig, node_class: str) -> dict:
    """Spot GPU nodes (on-demand only when the pool allows a fallback), tainted so that only pods tolerating
    ``nvidia.com/gpu`` land there. Karpenter removes a node only once it is empty, never replaces one for
    drift, and never expires one: a running training job is never evicted voluntarily."""
    capacity = ["spot", "on-demand"] if pool.on_demand_fallback else ["spot"]
    requirements = [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": capacity},
        {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": list(pool.families)},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
    ]
    if pool.sizes:
        requirements.append({"key": "karpenter.k8s.aws/instance-size", "operator": "In", "values": list(pool.sizes)})
    labels = {**pool.labels, POOL_LABEL: pool.name, GPU_LABEL: "true"}
    if pool.on_demand_fallback:
        labels[ON_DEMAND_FALLBACK_LABEL] = "true"
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": pool.name, "labels": {POOL_LABEL: pool.name}},
        "spec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class},
                    "requirements": requirements,
                    "taints": [dict(GPU_TAINT)],
                    "expireAfter": "Never",
                },
            },
            "disruption": {
                "consolidationPolicy": "WhenEmpty",
                "consolidateAfter": "5m",
                "budgets": [{"nodes": "0", "reasons": ["Drifted", "Underutilized"]},
                            {"nodes": "100%", "reasons": ["Empty"]}],
            },
            "limits": {"nvidia.com/gpu": pool.gpu_limit},
        },
    }
