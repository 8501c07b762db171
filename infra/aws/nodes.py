"""The on-demand core node group (system pods, the Ray head, MinIO, monitoring) and the EKS add-ons that need
nodes to run on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws import iam
from infra.aws.deploy_policy import MANAGED_POLICIES
from infra.kernel.config import CorePoolConfig
from infra.kernel.names import CORE_POOL, CORE_SELECTOR

NODE_POLICIES = MANAGED_POLICIES["node"]
# Add-ons at the version EKS picks for the cluster's Kubernetes version; eks-pod-identity-agent before any role.
ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent", "coredns", "aws-ebs-csi-driver")


@dataclass(frozen=True)
class CoreNodesArgs:
    cluster_name: pulumi.Input[str]
    config: CorePoolConfig
    subnet_ids: Sequence[pulumi.Input[str]]
    tags: dict[str, str]
    boundary: pulumi.Input[str]  # the permissions boundary of every role the stack creates


class CoreNodes(pulumi.ComponentResource):
    def __init__(self, name: str, args: CoreNodesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotray:infra:CoreNodes", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        pool, tags = args.config, args.tags
        role = iam.role(f"{name}-node", "ec2.amazonaws.com", NODE_POLICIES, tags, args.boundary, child)
        group = aws.eks.NodeGroup(
            f"{name}-group", cluster_name=args.cluster_name, node_group_name=CORE_POOL, node_role_arn=role.arn,
            subnet_ids=args.subnet_ids, capacity_type="ON_DEMAND", instance_types=list(pool.instance_types),
            ami_type="AL2023_x86_64_STANDARD", disk_size=pool.disk_gib,
            scaling_config={"min_size": pool.min_size, "desired_size": pool.desired_size, "max_size": pool.max_size},
            update_config={"max_unavailable": 1}, labels=CORE_SELECTOR, tags=tags,
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["scalingConfig.desiredSize"]))
        ebs_role = iam.role(f"{name}-ebs-csi", iam.POD_IDENTITY_PRINCIPAL,
                            MANAGED_POLICIES["ebs-csi"], tags, args.boundary, child)
        previous: pulumi.Resource = group
        for addon in ADDONS:
            pod_identity: list[aws.eks.AddonPodIdentityAssociationArgsDict] | None = (
                [{"role_arn": ebs_role.arn, "service_account": "ebs-csi-controller-sa"}]
                if addon == "aws-ebs-csi-driver" else None)
            previous = aws.eks.Addon(f"{name}-{addon}", cluster_name=args.cluster_name, addon_name=addon,
                                     resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="OVERWRITE",
                                     pod_identity_associations=pod_identity, tags=tags,
                                     opts=pulumi.ResourceOptions(parent=self, depends_on=[previous]))
        self.node_group = group
        self.node_role = role
        self.ready = previous  # the last add-on: the cluster can run workloads
        self.register_outputs({"node_group": group.node_group_name})
